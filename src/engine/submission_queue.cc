#include "engine/submission_queue.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "controller/response_cache.h"

namespace krug::engine {

using controller::OpType;
using controller::Request;
using Clock = std::chrono::steady_clock;

SubmissionQueue::SubmissionQueue(int rank, Wakeup& wakeup, bool waiters_drive,
                                 const std::atomic<int>& drivers, std::pair<int64_t, double> tuned)
    : rank_(rank),
      wakeup_(wakeup),
      waiters_drive_(waiters_drive),
      drivers_(drivers),
      tuned_(tuned) {}

std::string SubmissionQueue::refusal(const Request& q) const {
  const std::string why =
      !failure_.empty() ? failure_
                        : fmt::format("krug is shutting down on rank {}: no new operations", rank_);
  return fmt::format("{} was not started: {}", controller::describe_op(q), why);
}

SubmissionQueue::Batch SubmissionQueue::begin_batch() const {
  // The background thread takes the whole queue at once, so it needs waking only when the
  // queue was empty: otherwise an earlier enqueue's wake-up is still pending.
  // Nor while a waiting thread drives the loop: it takes the queue itself, and wakes the
  // background thread when it leaves with work left.
  return Batch{.first = queue_.size(), .wake = queue_.empty() && drivers_.load() == 0};
}

bool SubmissionQueue::admit(Table::node_type entry, const std::shared_ptr<HandleState>& handle,
                            const Batch& batch) {
  LocalEntry& e = entry.mapped();
  const Request& q = e.args.request;
  if (std::string why = check_request(e.args.request); !why.empty()) {
    reject(batch, *handle, why, q.name);
    return false;
  }
  KeySet::node_type key = key_node();
  controller::assign_table_key(key.value(), q.process_set, q.name);
  auto placed = in_flight_keys_.insert(std::move(key));
  // A grouped request must not name a tensor twice either: its second insert fails too.
  if (!placed.inserted) {
    reject(batch, *handle,
           fmt::format("{} '{}' (process set {}): an operation with this name is already in "
                       "flight on rank {}; wait for it before reusing the name",
                       controller::op_name(q.op), q.name, q.process_set, rank_),
           q.name);
    return false;
  }
  entry.key() = *placed.position;  // into the reused node's capacity
  e.handle = handle;
  e.cache_id = -1;
  queue_.push_back(std::move(entry));
  return true;
}

void SubmissionQueue::reject(const Batch& batch, HandleState& handle, const std::string& message,
                             std::string_view tensor) {
  // A grouped request is all or nothing: a bad tensor takes the ones before it out again.
  for (size_t j = batch.first; j < queue_.size(); ++j) in_flight_keys_.erase(queue_[j].key());
  queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(batch.first), queue_.end());
  handle.reject(message, tensor);
}

void SubmissionQueue::end_batch(const Batch& batch) {
  if (batch.first == 0 && waiters_drive_) queue_since_ = Clock::now();  // a burst begins
  changed_.store(true, std::memory_order_release);
  if (batch.wake && waiters_drive_) {
    if (!timer_armed_) {
      wakeup_.set_timer(cycle());
      timer_armed_ = cycle().count() > 0;
    }
  } else if (batch.wake) {
    wakeup_.wake();
  }
}

std::string SubmissionQueue::check_request(Request& q) const {
  auto set = set_ranks_.find(q.process_set);
  if (set == set_ranks_.end())
    return fmt::format("{} '{}': process set {} does not exist on rank {}",
                       controller::op_name(q.op), q.name, q.process_set, rank_);
  if (!std::binary_search(set->second.begin(), set->second.end(), rank_))
    return fmt::format("{} '{}': rank {} is not a member of process set {} (ranks [{}])",
                       controller::op_name(q.op), q.name, rank_, q.process_set,
                       fmt::join(set->second, ", "));
  if (std::any_of(q.shape.begin(), q.shape.end(), [](int64_t d) { return d < 0; }))
    return fmt::format("{} '{}': negative dimension in shape [{}]", controller::op_name(q.op),
                       q.name, fmt::join(q.shape, ", "));
  if (q.op == OpType::kAlltoall && q.splits.empty()) {
    const int64_t n = static_cast<int64_t>(set->second.size());
    const int64_t rows = q.shape.empty() ? 0 : q.shape[0];
    if (q.shape.empty() || rows % n != 0)
      return fmt::format(
          "alltoall '{}': first dimension {} is not divisible by the {} ranks of "
          "process set {}; pass splits",
          q.name, rows, n, q.process_set);
    q.splits.assign(n, rows / n);
  }
  return {};
}

std::chrono::microseconds SubmissionQueue::cycle() const {
  return std::chrono::microseconds(static_cast<int64_t>(tuned_.second * 1000));
}

bool SubmissionQueue::take(bool background, std::vector<Table::node_type>& arrived,
                           bool& shutting_down) {
  std::lock_guard lock(mu_);
  if (background && leave_to_waiter()) return false;
  changed_.store(false, std::memory_order_relaxed);
  expedite_ = false;
  arrived.swap(queue_);  // both keep their capacity from step to step
  shutting_down = shutdown_requested_;
  return true;
}

bool SubmissionQueue::leave_to_waiter() {
  if (!waiters_drive_ || queue_.empty() || shutdown_requested_ || expedite_) return false;
  // Woken by the cycle timer of an earlier burst, or by a peer, while this one is still being
  // submitted: taking part of it would split the step into several responses, each a round
  // trip and a collective. The thread that waits for it takes it whole; the background thread
  // does only after the cycle time (Horovod's batching window too).
  const auto due = queue_since_ + cycle();
  const auto now = Clock::now();
  if (now >= due) return false;
  if (!timer_armed_) {
    const auto delay = std::chrono::ceil<std::chrono::microseconds>(due - now);
    wakeup_.set_timer(delay);
    timer_armed_ = delay.count() > 0;
  }
  return true;
}

void SubmissionQueue::recycle(std::vector<Table::node_type>& finished) {
  std::lock_guard lock(mu_);
  for (auto& node : finished) {
    KeySet::node_type key = in_flight_keys_.extract(node.key());
    if (key && spare_keys_.size() < kMaxSpareNodes) spare_keys_.push_back(std::move(key));
    if (spare_entries_.size() < kMaxSpareNodes) spare_entries_.push_back(std::move(node));
  }
}

std::vector<Table::node_type> SubmissionQueue::fail(const std::string& message) {
  std::vector<Table::node_type> queued;
  std::lock_guard lock(mu_);
  failure_ = message;
  queued.swap(queue_);
  in_flight_keys_.clear();
  return queued;
}

void SubmissionQueue::request_shutdown() {
  std::lock_guard lock(mu_);
  shutdown_requested_ = true;
  changed_.store(true, std::memory_order_release);
}

bool SubmissionQueue::has_work() const {
  std::lock_guard lock(mu_);
  return !queue_.empty() || shutdown_requested_;
}

void SubmissionQueue::expedite() {
  {
    std::lock_guard lock(mu_);
    if (queue_.empty()) return;  // already taken (or failed): nothing to hurry
    expedite_ = true;
  }
  wakeup_.wake();
}

bool SubmissionQueue::timer_fired() {
  std::lock_guard lock(mu_);
  timer_armed_ = false;
  return !queue_.empty() && !leave_to_waiter();
}

void SubmissionQueue::set_process_set(int32_t id, const std::vector<int32_t>& ranks,
                                      std::string algorithm) {
  std::lock_guard lock(mu_);
  set_ranks_[id] = ranks;
  set_allreduce_[id] = std::move(algorithm);
}

void SubmissionQueue::remove_process_set(int32_t id) {
  std::lock_guard lock(mu_);
  set_ranks_.erase(id);
  set_allreduce_.erase(id);
}

std::vector<int32_t> SubmissionQueue::ranks_of(int32_t id) const {
  std::lock_guard lock(mu_);
  auto it = set_ranks_.find(id);
  if (it == set_ranks_.end()) throw Error(fmt::format("process set {} does not exist", id));
  return it->second;
}

std::string SubmissionQueue::allreduce_algorithm(int32_t id) const {
  std::lock_guard lock(mu_);
  auto it = set_allreduce_.find(id);
  if (it == set_allreduce_.end()) throw Error(fmt::format("process set {} does not exist", id));
  return it->second;
}

std::pair<int64_t, double> SubmissionQueue::tuned() const {
  std::lock_guard lock(mu_);
  return tuned_;
}

void SubmissionQueue::set_tuned(int64_t fusion_threshold, double cycle_time_ms) {
  std::lock_guard lock(mu_);
  tuned_ = {fusion_threshold, cycle_time_ms};
}

Table::node_type SubmissionQueue::entry_node() {
  if (spare_entries_.empty()) {
    Table one;
    return one.extract(one.try_emplace(std::string()).first);
  }
  Table::node_type node = std::move(spare_entries_.back());
  spare_entries_.pop_back();
  return node;
}

KeySet::node_type SubmissionQueue::key_node() {
  if (spare_keys_.empty()) {
    KeySet one;
    return one.extract(one.emplace().first);
  }
  KeySet::node_type node = std::move(spare_keys_.back());
  spare_keys_.pop_back();
  return node;
}

}  // namespace krug::engine
