#include "controller/readiness_stats.h"

#include <algorithm>

namespace krug::controller {

int64_t ReadinessStats::elapsed_us(Clock::time_point now) const {
  if (!first_) return 0;
  return std::chrono::duration_cast<std::chrono::microseconds>(now - *first_).count();
}

void ReadinessStats::observe(const std::string& name,
                             const std::vector<Clock::time_point>& arrivals) {
  if (arrivals.size() != lateness_us_.size() || arrivals.empty()) return;
  auto sorted = arrivals;
  std::sort(sorted.begin(), sorted.end());
  // The lower median: with two ranks the earlier one is "the others", so the late one shows.
  const auto median = sorted[(sorted.size() - 1) / 2];
  const auto ready = sorted.back();
  if (!first_) first_ = sorted.front();
  // Rank r held the others up from the median arrival to its own. Tensors of one step often
  // wait on r at once (a whole backward pass shifted by r's delay), so overlapping waits count
  // once: lateness is the length of the union of these intervals, i.e. wall time spent waiting.
  for (size_t r = 0; r < arrivals.size(); ++r) {
    if (arrivals[r] <= median || arrivals[r] <= counted_until_[r]) continue;
    const auto from = std::max(median, counted_until_[r]);
    lateness_us_[r] +=
        std::chrono::duration_cast<std::chrono::microseconds>(arrivals[r] - from).count();
    counted_until_[r] = arrivals[r];
  }
  ++tensors_;
  auto it = seen_.find(name);
  if (it == seen_.end()) {
    if (seen_.size() < kMaxNames) seen_.emplace(name, Seen{ready, 0, 0});
    return;
  }
  Seen& s = it->second;
  s.period_us +=
      std::chrono::duration_cast<std::chrono::microseconds>(ready - s.last_ready).count();
  s.last_ready = ready;
  ++s.intervals;
  // The step period is that of the most frequently ready tensor: one name per step, every step.
  if (s.intervals >= steps_) {
    steps_ = s.intervals;
    period_us_ = s.period_us;
  }
}

}  // namespace krug::controller
