#include "engine/handle_state.h"

namespace krug::engine {

bool HandleState::complete_part(const std::string& error) {
  std::lock_guard lock(mu_);
  if (remaining_ <= 0) return false;
  if (!error.empty() && error_.empty()) error_ = error;
  if (--remaining_ > 0) return false;
  cv_.notify_all();
  return true;
}

bool HandleState::done() const {
  std::lock_guard lock(mu_);
  return remaining_ <= 0;
}

bool HandleState::wait_until(std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return remaining_ <= 0; });
}

void HandleState::wait() const {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return remaining_ <= 0; });
}

std::string HandleState::error() const {
  std::lock_guard lock(mu_);
  return error_;
}

}  // namespace krug::engine
