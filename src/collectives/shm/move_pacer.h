// How often a lane member that shares its core with another tries to move to a free one
// (Lane::move_off_shared_core). Two members on one core pay a wake-up per call (6 us against
// 0.3 on a 2-core VM), and the scheduler itself may take 100 ms or more to part them, so the
// first tries come quickly. A try costs ~40 us (two changes of affinity and a migration): where
// the member shares a core again as soon as it may try again (the scheduler put it back, or the
// host has no free core), the pause doubles, up to its longest.
#pragma once

#include <algorithm>
#include <chrono>

namespace krug::collectives::shm {

class MovePacer {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::duration kShortestPause = std::chrono::microseconds(200);
  static constexpr Clock::duration kLongestPause = std::chrono::milliseconds(100);
  // Sharing again within this of the end of the pause: the last move did not last.
  static constexpr Clock::duration kUndone = std::chrono::milliseconds(10);

  // The member shares its core at `now`: whether it may try to move now (the try then counts).
  bool may_try(Clock::time_point now) {
    if (tried_ && now < last_try_ + pause_) return false;
    const bool undone = tried_ && now < last_try_ + pause_ + kUndone;
    pause_ = undone ? std::min(2 * pause_, kLongestPause) : kShortestPause;
    last_try_ = now;
    tried_ = true;
    return true;
  }
  // How long after the last try the next may come.
  Clock::duration pause() const { return pause_; }

 private:
  bool tried_ = false;
  Clock::time_point last_try_{};
  Clock::duration pause_ = kShortestPause;
};

}  // namespace krug::collectives::shm
