// The stall inspector (coordinator) as an engine observer: warns about operations some ranks
// submitted and others have not, tells every rank (each logs the stalls it takes part in), and
// stops the job after KRUG_STALL_SHUTDOWN_TIME_SECONDS.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "controller/negotiator.h"
#include "engine/observer.h"

namespace krug::engine {

// The warning's text, as the coordinator and every rank taking part log it.
std::string stall_warning(double check_seconds, const std::vector<controller::Stall>& stalls);
// On a rank the coordinator told of `stalls`: logs those `rank` waits in or is waited for in.
void log_stalls_of_rank(int rank, double check_seconds,
                        const std::vector<controller::Stall>& stalls);

class StallInspector : public CycleObserver {
 public:
  // `negotiator` and `knobs` outlive this.
  StallInspector(const Config& config, const controller::Negotiator& negotiator, EngineKnobs& knobs)
      : config_(config), negotiator_(negotiator), knobs_(knobs) {}

  // Warns as soon as an operation has waited the check time, and again every check time while
  // any does; stops the job once one has waited the shutdown time.
  void on_cycle(Clock::time_point now, const controller::ReadinessStats& readiness) override;
  // While operations are pending: when the next one reaches the check or the shutdown time, or
  // the next warning is due.
  std::optional<Clock::time_point> wake_at() const override;

 private:
  using Key = std::pair<int32_t, std::string>;  // process set, name

  double warn_after() const;  // seconds: the check time, or the shutdown time when shorter
  bool any_new(const std::vector<controller::Stall>& stalls) const;
  Clock::time_point next_check(Clock::time_point now, bool stalled) const;

  const Config& config_;
  const controller::Negotiator& negotiator_;
  EngineKnobs& knobs_;
  Clock::time_point next_check_{};
  Clock::time_point next_warning_{};
  std::set<Key> reported_;  // the stalls of the last check
};

}  // namespace krug::engine
