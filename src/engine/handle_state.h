// Completion state shared by a user's Handle and the engine.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
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

class HandleState {
 public:
  // A handle covering `parts` tensors (grouped ops) completes when every part has.
  explicit HandleState(int parts = 1) : remaining_(parts) {}

  // Marks one part done; the first error wins. Returns true when the whole handle completed.
  bool complete_part(const std::string& error = {});
  bool done() const;
  // Waits until done or the deadline; returns done().
  bool wait_until(std::chrono::steady_clock::time_point deadline) const;
  void wait() const;
  std::string error() const;
  // Valid once done(); written only by the engine before completion.
  OpResult& result() { return result_; }
  const OpResult& result() const { return result_; }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int remaining_;
  std::string error_;
  OpResult result_;
};

}  // namespace krug::engine
