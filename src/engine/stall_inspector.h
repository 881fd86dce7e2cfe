// The stall inspector (coordinator) as an engine observer: warns about operations some ranks
// submitted and others have not, and stops the job after KRUG_STALL_SHUTDOWN_TIME_SECONDS.
#pragma once

#include "common/config.h"
#include "controller/negotiator.h"
#include "engine/observer.h"

namespace krug::engine {

class StallInspector : public CycleObserver {
 public:
  // `negotiator` and `knobs` outlive this.
  StallInspector(const Config& config, const controller::Negotiator& negotiator, EngineKnobs& knobs)
      : config_(config), negotiator_(negotiator), knobs_(knobs) {}

  void on_cycle(Clock::time_point now, const controller::ReadinessStats& readiness) override;
  // While operations are pending: often enough to warn once per check period and to stop
  // within a quarter of the limit.
  std::optional<Clock::time_point> wake_at() const override;

 private:
  const Config& config_;
  const controller::Negotiator& negotiator_;
  EngineKnobs& knobs_;
  Clock::time_point next_check_{};
  Clock::time_point next_warning_{};
};

}  // namespace krug::engine
