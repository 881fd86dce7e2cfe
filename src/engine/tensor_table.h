// The loop's registry of this rank's operations in flight: found by name or by response-cache
// id, completed (one lock for a whole fused response) and recycled into the submission queue.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "controller/response_cache.h"
#include "engine/submission_queue.h"

namespace krug::engine {

// How an operation the engine stopped before it completed fails: named, so that the message
// says which call it ended ("allreduce 'w' (process set 0) did not complete: <why>").
std::string incomplete(const controller::Request& q, const std::string& why);

class TensorTable {
 public:
  explicit TensorTable(SubmissionQueue& queue) : queue_(queue) {}

  bool empty() const { return table_.empty(); }
  // An operation taken from the queue; `cache_id` (or -1) is the id it was sent as, so that a
  // cached response finds it without a name. `cache_size`: ids the cache holds now.
  // Inline: it runs once per tensor per step.
  void insert(Table::node_type node, int64_t cache_id, size_t cache_size) {
    node.mapped().cache_id = cache_id;
    auto placed = table_.insert(std::move(node));
    if (cache_id >= 0 && placed.inserted) {
      if (by_id_.size() <= static_cast<size_t>(cache_id)) by_id_.resize(cache_size, nullptr);
      by_id_[static_cast<size_t>(cache_id)] = &*placed.position;
    }
  }
  TableSlot* find(const std::string& key);
  bool contains(const std::string& key) const { return table_.count(key) != 0; }
  // The entry a response's cache id stands for (null: none on this rank).
  TableSlot* by_id(uint32_t id, const controller::ResponseCache& cache);
  // Completes the entries a collective ran (null: none here), taking the queue's mutex once for
  // all. Returns how many completed.
  size_t finish(std::span<TableSlot* const> slots, const std::string& error = {},
                bool precondition = false);
  size_t finish(const std::string& key, const std::string& error = {}, bool precondition = false);
  // Fails every entry with `message`, each named (incomplete()): the engine stops.
  void fail_all(const std::string& message);

 private:
  SubmissionQueue& queue_;
  Table table_;  // names share long prefixes: hashed
  // Entries sent as cache hits, by id. Pointers into table_'s nodes, which stay put until
  // erased (finish clears the slot).
  std::vector<TableSlot*> by_id_;
  // finish's scratch, kept from step to step.
  std::vector<Table::node_type> finished_;
  std::vector<std::shared_ptr<HandleState>> finished_handles_;
  std::vector<std::string> finished_names_;  // with an error only: the tensors it fails
};

}  // namespace krug::engine
