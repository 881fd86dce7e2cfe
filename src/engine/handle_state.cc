#include "engine/handle_state.h"

#include <algorithm>
#include <thread>

namespace krug::engine {

bool HandleState::complete_part(const std::string& error) {
  std::lock_guard lock(mu_);
  if (remaining_ <= 0) return false;
  if (!error.empty() && error_.empty()) error_ = error;
  if (--remaining_ > 0) return false;
  done_.store(true, std::memory_order_release);
  cv_.notify_all();
  return true;
}

bool HandleState::done() const {
  std::lock_guard lock(mu_);
  return remaining_ <= 0;
}

void HandleState::spin_until_done(std::chrono::steady_clock::time_point deadline) const {
  if (spin_.count() <= 0) return;
  const auto until = std::min(deadline, std::chrono::steady_clock::now() + spin_);
  while (!done_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until)
    std::this_thread::yield();  // the engine thread may share this core
}

bool HandleState::wait_until(std::chrono::steady_clock::time_point deadline) const {
  spin_until_done(deadline);
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return remaining_ <= 0; });
}

void HandleState::wait() const {
  spin_until_done(std::chrono::steady_clock::time_point::max());
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return remaining_ <= 0; });
}

std::string HandleState::error() const {
  std::lock_guard lock(mu_);
  return error_;
}

}  // namespace krug::engine
