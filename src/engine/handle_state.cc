#include "engine/handle_state.h"

namespace krug::engine {

bool HandleState::complete_part(const std::string& error, std::string_view tensor,
                                bool precondition) {
  std::function<void()> callback;
  {
    std::lock_guard lock(mu_);
    if (remaining_ <= 0) return false;
    if (!error.empty() && error_.empty()) {
      error_ = error;
      failed_tensor_ = tensor;
      precondition_ = precondition;
    }
    if (--remaining_ > 0) return false;
    done_.store(true, std::memory_order_release);
    cv_.notify_all();
    callback.swap(on_done_);
  }
  // Outside the lock: the callback may read the handle (error(), result()).
  if (callback) callback();
  return true;
}

bool HandleState::failed_precondition() const {
  std::lock_guard lock(mu_);
  return precondition_;
}

void HandleState::on_done(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    if (remaining_ > 0) {
      on_done_ = std::move(fn);
      return;
    }
  }
  fn();
}

void HandleState::reject(const std::string& error, std::string_view tensor) {
  std::function<void()> callback;
  {
    std::lock_guard lock(mu_);
    rejected_.store(true, std::memory_order_release);
    if (error_.empty()) {
      error_ = error;
      failed_tensor_ = tensor;
    }
    remaining_ = 0;
    done_.store(true, std::memory_order_release);
    cv_.notify_all();
    callback.swap(on_done_);
  }
  if (callback) callback();
}

bool HandleState::done() const { return done_.load(std::memory_order_acquire); }

bool HandleState::wait_until(std::chrono::steady_clock::time_point deadline) const {
  if (auto driver = driver_.lock(); driver && !done()) driver->drive(*this, deadline);
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return remaining_ <= 0; });
}

void HandleState::wait() const {
  if (done()) return;  // most handles of a step: no lock at all
  if (auto driver = driver_.lock(); driver && !done())
    driver->drive(*this, std::chrono::steady_clock::time_point::max());
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return remaining_ <= 0; });
}

std::string HandleState::error() const {
  // Written only before done_ is released, never after: once done, readable without the lock.
  if (done()) return error_;
  std::lock_guard lock(mu_);
  return error_;
}

std::string HandleState::failed_tensor() const {
  std::lock_guard lock(mu_);
  return failed_tensor_;
}

}  // namespace krug::engine
