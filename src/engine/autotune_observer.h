// The autotuner (KRUG_AUTOTUNE, rank 0) as an engine observer: it scores the bytes each cycle
// moves and turns the engine's two knobs, fusion threshold and cycle time.
#pragma once

#include <fstream>
#include <memory>

#include "common/config.h"
#include "engine/observer.h"
#include "observe/autotuner.h"

namespace krug::engine {

class AutotuneObserver : public CycleObserver {
 public:
  // Applies the starting parameters through `knobs` (which outlives this). `hierarchical`:
  // whether the global set allreduces hierarchically, for the log (the engine does not tune
  // it: see observe/autotuner.h). Throws krug::Error when KRUG_AUTOTUNE_LOG cannot be written.
  AutotuneObserver(const Config& config, bool hierarchical, EngineKnobs& knobs);

  Interests interests() const override { return {.bytes = true}; }
  void on_executed(int64_t bytes, Clock::time_point now) override;

 private:
  EngineKnobs& knobs_;
  std::ofstream log_;
  std::unique_ptr<observe::Autotuner> autotuner_;
};

}  // namespace krug::engine
