// The response cache: steady-state steps send small ids instead of full requests.
//
// Entries are immutable and ids are never reused, so an id a worker sent before it learnt of a
// newer entry still means what it meant when sent: no invalidation protocol is needed. Every
// rank inserts entries in the order the coordinator's responses assign them, so all caches are
// identical. The table stops growing at `capacity`; names beyond that take the full path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "controller/message.h"

namespace krug::controller {

class ResponseCache {
 public:
  explicit ResponseCache(int64_t capacity) : capacity_(capacity) {}

  // Whether a request of this kind can be served from the cache: its response is fully
  // determined by any one rank's request (not allgather/alltoall, not grouped).
  static bool cacheable(const Request& request);
  static bool cacheable(OpType op);

  // The id under which `request` (same name and parameters) is cached, if any. `key` is
  // table_key(request.process_set, request.name), which callers usually have at hand already.
  std::optional<uint32_t> find(const Request& request) const;
  std::optional<uint32_t> find(const std::string& key, const Request& request) const;
  const Request& at(uint32_t id) const;
  bool contains(uint32_t id) const { return id < entries_.size(); }
  // Elements of entry `id`'s tensor (its shape's product), kept with the entry.
  int64_t elements(uint32_t id) const { return elements_.at(id); }

  // A response that arrived as cache ids only gets its parameters back (op, dtype, reduction,
  // set, root, scale factors) and, with `names`, its names and shapes too: the steady-state
  // allreduce path works from ids alone and never copies a name.
  void expand(Response& response, bool names = true) const;

  // Coordinator: the id the next insert will get, or nullopt when full.
  std::optional<uint32_t> next_id() const;
  // Every rank: record `request` under `id` (must equal next_id()).
  void insert(uint32_t id, const Request& request);

  size_t size() const { return entries_.size(); }

 private:
  int64_t capacity_;
  std::vector<Request> entries_;
  std::vector<int64_t> elements_;
  std::unordered_map<std::string, uint32_t> latest_;  // "<set>/<name>" -> newest id
};

// Whether `request` is what entry `cached` stores: cache_form(request) == cached, without the
// copy.
bool same_as_cached(const Request& cached, const Request& request);

// The rank-independent part of a request, as stored in the cache (group, splits and other
// fields that do not describe a cacheable response are cleared).
Request cache_form(const Request& request);
// The cache form of name `index` of a response: what every rank stores under cache_ids[index].
Request cache_form(const Response& response, size_t index);

// Key of a request within the cache and the coordinator's table: names are per process set.
std::string table_key(int32_t process_set, const std::string& name);
// The same into `key`, reusing its capacity.
void assign_table_key(std::string& key, int32_t process_set, const std::string& name);

}  // namespace krug::controller
