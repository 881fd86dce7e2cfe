#include "controller/response_cache.h"

#include <charconv>

namespace krug::controller {

std::string table_key(int32_t process_set, const std::string& name) {
  std::string key;
  assign_table_key(key, process_set, name);
  return key;
}

void assign_table_key(std::string& key, int32_t process_set, const std::string& name) {
  char set[16];
  char* end = std::to_chars(set, set + sizeof(set) - 1, process_set).ptr;
  *end++ = '/';
  key.clear();
  key.reserve(static_cast<size_t>(end - set) + name.size());  // at most one allocation
  key.append(set, end).append(name);
}

Request cache_form(const Request& r) {
  // Everything but the fields no cacheable response depends on.
  Request q = r;
  q.splits.clear();
  q.set_ranks.clear();
  q.target_process_set = 0;
  if (q.op != OpType::kBroadcast) q.root = 0;
  return q;
}

Request cache_form(const Response& r, size_t index) {
  Request q;
  q.name = r.names.at(index);
  q.op = r.op;
  q.dtype = r.dtype;
  q.reduce_op = r.reduce_op;
  q.process_set = r.process_set;
  q.root = r.op == OpType::kBroadcast ? r.root : 0;
  q.prescale = r.prescale;
  q.postscale = r.postscale;
  q.shape = r.shapes.at(index);
  q.device = r.device;
  return q;
}

bool same_as_cached(const Request& c, const Request& q) {
  return c.name == q.name && c.op == q.op && c.dtype == q.dtype && c.reduce_op == q.reduce_op &&
         c.process_set == q.process_set && c.root == (q.op == OpType::kBroadcast ? q.root : 0) &&
         c.prescale == q.prescale && c.postscale == q.postscale && c.shape == q.shape &&
         c.splits.empty() && c.set_ranks.empty() && c.target_process_set == 0 &&
         c.group == q.group && c.group_size == q.group_size && c.device == q.device;
}

bool ResponseCache::cacheable(OpType op) {
  return op == OpType::kAllreduce || op == OpType::kBroadcast || op == OpType::kReducescatter;
}

bool ResponseCache::cacheable(const Request& r) { return r.group.empty() && cacheable(r.op); }

std::optional<uint32_t> ResponseCache::find(const Request& request) const {
  return find(table_key(request.process_set, request.name), request);
}

std::optional<uint32_t> ResponseCache::find(const std::string& key, const Request& request) const {
  auto it = latest_.find(key);
  if (it == latest_.end() || !same_as_cached(entries_[it->second], request)) return std::nullopt;
  return it->second;
}

const Request& ResponseCache::at(uint32_t id) const {
  if (id >= entries_.size())
    throw Error("response cache id " + std::to_string(id) + " is unknown on this rank (cache has " +
                std::to_string(entries_.size()) + " entries): ranks' caches diverged");
  return entries_[id];
}

void ResponseCache::expand(Response& r, bool names) const {
  if (r.cache_ids.empty()) return;
  copy_terms(at(r.cache_ids[0]), r);
  r.from_cache = true;
  if (!names || !r.names.empty()) return;
  r.names.reserve(r.cache_ids.size());
  r.shapes.reserve(r.cache_ids.size());
  for (uint32_t id : r.cache_ids) {
    const Request& q = at(id);
    r.names.push_back(q.name);
    r.shapes.push_back(q.shape);
  }
}

std::optional<uint32_t> ResponseCache::next_id() const {
  if (static_cast<int64_t>(entries_.size()) >= capacity_) return std::nullopt;
  return static_cast<uint32_t>(entries_.size());
}

void ResponseCache::insert(uint32_t id, const Request& request) {
  if (id != entries_.size())
    throw Error("response cache out of order: got id " + std::to_string(id) + ", expected " +
                std::to_string(entries_.size()));
  entries_.push_back(request);
  elements_.push_back(request.num_elements());
  latest_[table_key(request.process_set, request.name)] = id;
}

}  // namespace krug::controller
