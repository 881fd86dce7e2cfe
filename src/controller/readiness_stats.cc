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
  // Steps are the intervals between readiness of the most frequent name: one per step.
  auto it = seen_.find(name);
  if (it == seen_.end()) {
    if (seen_.size() < kMaxNames) seen_.emplace(name, 0);
    return;
  }
  steps_ = std::max(steps_, ++it->second);
}

}  // namespace krug::controller
