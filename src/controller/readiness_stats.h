// Which rank the others wait for: the coordinator's record of when each rank submitted each
// tensor of the global process set. krugrun's elastic driver reads it to find stragglers
// (docs/elastic.md): a rank whose tensors keep arriving long after the others' is slowing
// every step down. Pure; unit-tested.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace krug::controller {

class ReadinessStats {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ReadinessStats(int world_size)
      : lateness_us_(world_size, 0), counted_until_(world_size) {}

  // One tensor of the global set became ready; arrivals[r] = when rank r's request came in.
  // Rank r's lateness grows by the wall time the others waited for it (from the median
  // arrival to r's), overlapping waits counted once.
  void observe(const std::string& name, const std::vector<Clock::time_point>& arrivals);

  // Time from the first observed tensor to `now` (0 before any).
  int64_t elapsed_us(Clock::time_point now) const;
  // Totals since construction (see rendezvous::elastic::Health).
  int64_t tensors() const { return tensors_; }
  int64_t steps() const { return steps_; }
  const std::vector<int64_t>& lateness_us() const { return lateness_us_; }

  // Names counted for steps; names beyond it (one per step, say) are not.
  static constexpr size_t kMaxNames = 4096;

 private:
  // Times each name became ready (the most frequent one counts steps).
  std::unordered_map<std::string, int64_t> seen_;
  std::optional<Clock::time_point> first_;
  int64_t tensors_ = 0;
  int64_t steps_ = 0;
  std::vector<int64_t> lateness_us_;
  std::vector<Clock::time_point> counted_until_;  // end of each rank's last counted wait
};

}  // namespace krug::controller
