#include "engine/tensor_table.h"

#include <fmt/format.h>

namespace krug::engine {

std::string incomplete(const controller::Request& q, const std::string& why) {
  return fmt::format("{} did not complete: {}", controller::describe_op(q), why);
}

TableSlot* TensorTable::find(const std::string& key) {
  auto it = table_.find(key);
  return it == table_.end() ? nullptr : &*it;
}

TableSlot* TensorTable::by_id(uint32_t id, const controller::ResponseCache& cache) {
  if (id < by_id_.size() && by_id_[id]) return by_id_[id];
  // Sent as a full request (its entry was made after this rank had looked), or not here at all
  // (a joined rank).
  const controller::Request& q = cache.at(id);
  return find(controller::table_key(q.process_set, q.name));
}

size_t TensorTable::finish(std::span<TableSlot* const> slots, const std::string& error,
                           bool precondition) {
  finished_.clear();
  for (TableSlot* slot : slots) {
    if (!slot) continue;
    if (slot->second.cache_id >= 0) by_id_[static_cast<size_t>(slot->second.cache_id)] = nullptr;
    finished_.push_back(table_.extract(slot->first));
  }
  const size_t count = finished_.size();
  for (auto& node : finished_) {
    finished_handles_.push_back(std::move(node.mapped().handle));
    if (!error.empty()) finished_names_.push_back(node.mapped().args.request.name);
    node.mapped().args.ready = nullptr;
    node.mapped().args.allocate_output = nullptr;  // may hold a framework's state
  }
  queue_.recycle(finished_);
  finished_.clear();  // what did not fit among the spares
  for (size_t i = 0; i < finished_handles_.size(); ++i)
    finished_handles_[i]->complete_part(error, error.empty() ? "" : finished_names_[i],
                                        precondition);
  finished_handles_.clear();
  finished_names_.clear();
  return count;
}

size_t TensorTable::finish(const std::string& key, const std::string& error, bool precondition) {
  TableSlot* slot = find(key);
  if (!slot) return 0;
  return finish({&slot, 1}, error, precondition);
}

void TensorTable::fail_all(const std::string& message) {
  for (auto& [key, e] : table_)
    e.handle->complete_part(incomplete(e.args.request, message), e.args.request.name);
  table_.clear();
  by_id_.clear();
}

}  // namespace krug::engine
