// Observers of the engine: code beside the engine that reads what it does and never steers it
// (the elastic health report today). They run on the loop's thread and must not block.
#pragma once

#include <chrono>

#include "controller/readiness_stats.h"

namespace krug::engine {

// Told by the coordinator after every negotiation round.
class CycleObserver {
 public:
  virtual ~CycleObserver() = default;
  // `readiness`: when each rank submitted each tensor of the global set, so far (tracked in
  // elastic jobs only; empty otherwise).
  virtual void on_cycle(std::chrono::steady_clock::time_point now,
                        const controller::ReadinessStats& readiness) = 0;
};

}  // namespace krug::engine
