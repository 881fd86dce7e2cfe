// The submission queue: what user threads share with the loop, under one mutex. New operations
// and their names in flight (duplicate detection), reusable entry nodes, the process-set
// membership enqueue checks against, the tuned cycle time, and the failure that stops the
// engine.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/handle_state.h"
#include "engine/tensor_args.h"
#include "engine/wakeup.h"

namespace krug::engine {

// One operation's tensor on this rank, from enqueue until its handle completes.
struct LocalEntry {
  TensorArgs args;
  std::shared_ptr<HandleState> handle;
  int64_t cache_id = -1;  // the response cache id it was sent as, if any
};
// Keyed by controller::table_key(set, name). Entries travel as node handles: made (or reused)
// by enqueue, queued, inserted into the loop's table, extracted when finished and kept for
// reuse, with the capacity of their strings.
using Table = std::unordered_map<std::string, LocalEntry>;
using TableSlot = Table::value_type;
using KeySet = std::unordered_set<std::string>;

class SubmissionQueue {
 public:
  // `waiters_drive`: threads waiting for a handle run the loop (engine.cc), so enqueue arms the
  // cycle timer instead of waking the background thread; `drivers` counts those threads now.
  SubmissionQueue(int rank, Wakeup& wakeup, bool waiters_drive, const std::atomic<int>& drivers,
                  std::pair<int64_t, double> tuned);

  // Fills `count` entries (fill(i, args)), checks them and queues them under `handle`, or none
  // of them (the handle then fails with the reason).
  template <typename Fill>
  void submit(const std::shared_ptr<HandleState>& handle, size_t count, const Fill& fill) {
    std::lock_guard lock(mu_);
    if (!failure_.empty() || shutdown_requested_) {
      // Each tensor fails naming itself: the reason alone would not say which call it ended.
      TensorArgs args;
      for (size_t i = 0; i < count; ++i) {
        fill(i, args);
        handle->complete_part(refusal(args.request), args.request.name);
      }
      return;
    }
    const Batch batch = begin_batch();
    for (size_t i = 0; i < count; ++i) {
      Table::node_type entry = entry_node();
      fill(i, entry.mapped().args);
      if (!admit(std::move(entry), handle, batch)) return;
    }
    end_batch(batch);
  }

  // The loop's side. Whether anything was queued (or shutdown asked) since the last take;
  // a driving thread's rounds look here instead of taking the mutex from enqueueing threads.
  bool changed() const { return changed_.load(std::memory_order_acquire); }
  // Moves the queue into `arrived` (which keeps its capacity); returns false when it was left
  // for a waiting thread (`background`: a burst still being submitted). `shutting_down` says
  // whether shutdown() was asked.
  bool take(bool background, std::vector<Table::node_type>& arrived, bool& shutting_down);
  // Finished entries: their names leave the in-flight set and the nodes are kept for reuse
  // (what does not fit stays in `finished`). Before their handles complete: a thread woken by
  // one may submit the same name at once.
  void recycle(std::vector<Table::node_type>& finished);
  // From now on every enqueue fails with `message`; returns the operations still queued.
  std::vector<Table::node_type> fail(const std::string& message);
  void request_shutdown();
  bool has_work() const;  // queued operations, or a shutdown to carry out
  void expedite();        // see Engine::expedite
  // The loop read the cycle timer's expiry. Whether the background thread has work to take:
  // not where the queue is empty (a waiting thread took the burst the timer was set for), nor
  // where it holds a burst younger than the cycle time (the timer is set again for it).
  bool timer_fired();

  // Process sets as user threads see them (the loop's ProcessSets owns the communicators).
  void set_process_set(int32_t id, const std::vector<int32_t>& ranks, std::string algorithm);
  void remove_process_set(int32_t id);
  std::vector<int32_t> ranks_of(int32_t id) const;    // throws for an unknown id
  std::string allreduce_algorithm(int32_t id) const;  // throws for an unknown id

  // (fusion threshold, cycle time in ms) in force.
  std::pair<int64_t, double> tuned() const;
  void set_tuned(int64_t fusion_threshold, double cycle_time_ms);

 private:
  struct Batch {
    size_t first = 0;   // the queue's size before it
    bool wake = false;  // the loop must be told: nothing was queued and nobody drives it
  };
  // With mu_ held, for the background thread: whether to leave the queued burst to the thread
  // that will wait for it (see take); if so, the timer is armed for when the burst is due.
  bool leave_to_waiter();
  // Why `q` cannot run: the engine failed or is shutting down.
  std::string refusal(const controller::Request& q) const;
  Batch begin_batch() const;
  bool admit(Table::node_type entry, const std::shared_ptr<HandleState>& handle,
             const Batch& batch);
  void end_batch(const Batch& batch);
  void reject(const Batch& batch, HandleState& handle, const std::string& message,
              std::string_view tensor);
  std::string check_request(controller::Request& q) const;
  std::chrono::microseconds cycle() const;
  Table::node_type entry_node();
  KeySet::node_type key_node();

  const int rank_;
  Wakeup& wakeup_;
  const bool waiters_drive_;
  const std::atomic<int>& drivers_;

  mutable std::mutex mu_;
  std::vector<Table::node_type> queue_;
  std::atomic<bool> changed_{false};  // set with queue_ or shutdown_requested_, under mu_
  KeySet in_flight_keys_;
  // Nodes of finished operations, for enqueue to reuse with the capacity of their strings: a
  // step of many small tensors then allocates no table node, key or in-flight entry. (glibc
  // caches 7 free chunks per size; a step frees hundreds, which then take its slow paths.)
  std::vector<Table::node_type> spare_entries_;
  std::vector<KeySet::node_type> spare_keys_;
  static constexpr size_t kMaxSpareNodes = 4096;
  std::map<int32_t, std::vector<int32_t>> set_ranks_;
  std::map<int32_t, std::string> set_allreduce_;  // how each set this rank is in allreduces
  bool shutdown_requested_ = false;
  std::pair<int64_t, double> tuned_;
  std::string failure_;  // once set, every pending and future operation fails with it
  // With waiters_drive_, an enqueue arms the cycle timer (if it is not armed) instead of
  // waking the loop: a thread that waits for the operation soon runs it itself, and the
  // background thread wakes at most once per cycle time (KRUG_CYCLE_TIME) for operations
  // nobody waits for: the batching window Horovod's loop has too, far below a training step's
  // compute between a gradient's enqueue and the wait for it. Never disarmed: that would cost a
  // system call per operation, more than the timer's one wake-up per cycle.
  bool timer_armed_ = false;
  bool expedite_ = false;  // take the queue without waiting out the batching window
  std::chrono::steady_clock::time_point queue_since_{};  // when queue_ last became non-empty
};

}  // namespace krug::engine
