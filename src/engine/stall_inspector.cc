#include "engine/stall_inspector.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/log.h"

namespace krug::engine {
void StallInspector::on_cycle(Clock::time_point now, const controller::ReadinessStats&) {
  if (!negotiator_.has_pending() || now < next_check_) return;
  const double check = config_.stall_check_time.count();
  const double stop = config_.stall_shutdown_time.count();
  auto stalls = negotiator_.stalls(now, stop > 0 ? std::min(check, stop) : check);
  if (!stalls.empty() && now >= next_warning_) {
    log::at(log::Level::kWarning, config_.rank,
            "stalled operations: some ranks submitted them, others have not after {} s "
            "(a rank may be stuck, or ranks submit different names):{}",
            check, controller::describe(stalls));
    next_warning_ = now + whole_ms(Seconds(check));
  }
  if (stop > 0 && !negotiator_.stalls(now, stop).empty()) {
    knobs_.stop(
        fmt::format("stalled for more than {} s (KRUG_STALL_SHUTDOWN_TIME_SECONDS), "
                    "stopping the job:{}",
                    stop, controller::describe(stalls)));
    return;
  }
  next_check_ =
      now + whole_ms(Seconds(stop > 0 ? std::min(check, std::max(0.25, stop / 4)) : check));
}

std::optional<Clock::time_point> StallInspector::wake_at() const {
  if (!negotiator_.has_pending()) return std::nullopt;
  return next_check_;
}

}  // namespace krug::engine
