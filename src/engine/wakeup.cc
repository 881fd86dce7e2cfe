#include "engine/wakeup.h"

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "krug/types.h"

namespace krug::engine {

Wakeup::Wakeup() : event_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!event_.valid()) throw Error(fmt::format("eventfd failed: {}", std::strerror(errno)));
  timer_ = net::Fd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer_.valid()) throw Error(fmt::format("timerfd_create failed: {}", std::strerror(errno)));
}

void Wakeup::wake() {
  uint64_t one = 1;
  (void)!::write(event_.get(), &one, sizeof(one));
}

void Wakeup::set_timer(std::chrono::microseconds delay) {
  itimerspec spec{};
  spec.it_value.tv_sec = static_cast<time_t>(delay.count() / 1000000);
  spec.it_value.tv_nsec = static_cast<long>(delay.count() % 1000000 * 1000);
  (void)::timerfd_settime(timer_.get(), 0, &spec, nullptr);
}

void Wakeup::drain_event() {
  uint64_t drained;
  (void)!::read(event_.get(), &drained, sizeof(drained));
}

bool Wakeup::drain_timer() {
  uint64_t drained;
  return ::read(timer_.get(), &drained, sizeof(drained)) > 0;
}

}  // namespace krug::engine
