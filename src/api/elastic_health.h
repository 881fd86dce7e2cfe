// The elastic coordinator's health record: readiness statistics that krugrun's elastic driver
// reads to find stragglers (docs/elastic.md), written to the round's store as "health".
#pragma once

#include <chrono>
#include <memory>

#include "engine/observer.h"
#include "rendezvous/store.h"

namespace krug::api {

class HealthReporter : public engine::CycleObserver {
 public:
  // `store`: the round's namespace of the driver's store. `rank`: for log messages.
  HealthReporter(std::shared_ptr<rendezvous::Store> store, int rank)
      : store_(std::move(store)), rank_(rank) {}

  // Once a second at most, and only when cycles run: an idle job has nothing to report.
  void on_cycle(std::chrono::steady_clock::time_point now,
                const controller::ReadinessStats& readiness) override;

 private:
  std::shared_ptr<rendezvous::Store> store_;
  int rank_;
  std::chrono::steady_clock::time_point next_report_{};
};

}  // namespace krug::api
