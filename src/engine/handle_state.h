// Completion state shared by a user's Handle and the engine.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace krug::engine {

// Outputs whose size is only known after negotiation live here (allgather, alltoall,
// reducescatter), with integer results (join's last rank, a new process set's id).
struct OpResult {
  std::vector<uint8_t> data;
  std::vector<int64_t> shape;
  std::vector<int64_t> received_splits;
  int64_t value = -1;
};

class HandleState;

// What lets a thread that waits for a handle run the engine's loop itself, so that an operation
// completes without a hand-off to the background thread and a wake-up back (engine.cc).
class Driver {
 public:
  virtual ~Driver() = default;
  // Makes progress on the calling thread until `handle` is done, `deadline` passes or a short
  // budget is spent; whatever is left the background thread finishes.
  virtual void drive(const HandleState& handle, std::chrono::steady_clock::time_point deadline) = 0;
};

class HandleState {
 public:
  // A handle covering `parts` tensors (grouped ops) completes when every part has.
  explicit HandleState(int parts = 1) : remaining_(parts), done_(parts <= 0) {}

  // Marks one part done; the first error wins (with `tensor`, the name of the tensor it failed,
  // when known, and `precondition`: the negotiation refused the operation on every rank, the
  // ranks disagreeing or the operation impossible as asked, so nothing was sent). Returns
  // true when the whole handle completed.
  bool complete_part(const std::string& error = {}, std::string_view tensor = {},
                     bool precondition = false);
  // Fails every part at submission, before anything was sent: the caller's own arguments were
  // wrong (a name in flight, a bad shape), so frontends raise at the call (Python: ValueError).
  void reject(const std::string& error, std::string_view tensor = {});
  bool rejected() const { return rejected_.load(std::memory_order_acquire); }
  // After a failure: whether the first error was the negotiation's refusal (see complete_part).
  bool failed_precondition() const;
  bool done() const;
  // Set by the engine before the handle is shared; waits then drive it first.
  void set_driver(std::weak_ptr<Driver> driver) { driver_ = std::move(driver); }
  // Waits until done or the deadline; returns done().
  bool wait_until(std::chrono::steady_clock::time_point deadline) const;
  void wait() const;
  std::string error() const;
  // After a failure: the tensor the first error named, or empty.
  std::string failed_tensor() const;
  // Runs `fn` once the handle completes: at once (on this thread) when it already has, else on
  // the thread that completes it, after waiters are woken. One callback per handle.
  void on_done(std::function<void()> fn);
  // Valid once done(); written only by the engine before completion.
  OpResult& result() { return result_; }
  const OpResult& result() const { return result_; }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::weak_ptr<Driver> driver_;
  int remaining_;
  // done() without the mutex: a thread driving the loop asks after every round, while the
  // thread completing parts holds the mutex.
  std::atomic<bool> done_{false};
  std::atomic<bool> rejected_{false};
  bool precondition_ = false;  // with mu_, like error_
  std::string error_;
  std::string failed_tensor_;
  std::function<void()> on_done_;
  OpResult result_;
};

}  // namespace krug::engine
