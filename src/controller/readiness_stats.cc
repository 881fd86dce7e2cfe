#include "controller/readiness_stats.h"

#include <algorithm>

namespace krug::controller {

void ReadinessStats::observe(const std::string& name,
                             const std::vector<Clock::time_point>& arrivals) {
  if (arrivals.size() != lateness_us_.size() || arrivals.empty()) return;
  auto sorted = arrivals;
  std::sort(sorted.begin(), sorted.end());
  // The lower median: with two ranks the earlier one is "the others", so the late one shows.
  const auto median = sorted[(sorted.size() - 1) / 2];
  const auto ready = sorted.back();
  for (size_t r = 0; r < arrivals.size(); ++r)
    if (arrivals[r] > median)
      lateness_us_[r] +=
          std::chrono::duration_cast<std::chrono::microseconds>(arrivals[r] - median).count();
  ++tensors_;
  auto it = seen_.find(name);
  if (it == seen_.end()) {
    if (seen_.size() < kMaxNames) seen_.emplace(name, Seen{ready, 0, 0});
    return;
  }
  Seen& s = it->second;
  s.period_us += std::chrono::duration_cast<std::chrono::microseconds>(ready - s.last_ready).count();
  s.last_ready = ready;
  ++s.intervals;
  // The step period is that of the most frequently ready tensor: one name per step, every step.
  if (s.intervals >= steps_) {
    steps_ = s.intervals;
    period_us_ = s.period_us;
  }
}

}  // namespace krug::controller
