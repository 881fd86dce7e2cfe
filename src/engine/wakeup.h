// The background thread's wake-ups: an eventfd written for "look now", and a one-shot timer for
// "look in a cycle time" (the batching window). Both are polled by the loop.
#pragma once

#include <chrono>

#include "net/socket.h"

namespace krug::engine {

class Wakeup {
 public:
  Wakeup();  // throws krug::Error when the kernel refuses either descriptor

  int event_fd() const { return event_.get(); }
  int timer_fd() const { return timer_.get(); }
  void wake();  // the loop looks at once
  // Arms the timer to fire once after `delay` (0 disarms).
  void set_timer(std::chrono::microseconds delay);
  // After poll() reported them readable: clear the eventfd, or the expired timer (returns
  // whether it had fired).
  void drain_event();
  bool drain_timer();

 private:
  net::Fd event_;
  net::Fd timer_;
};

}  // namespace krug::engine
