// The coordinator's decision procedure: which named operations are ready on every rank of their
// process set, in what order, fused how.
//
// A pure state machine without I/O: request lists go in (add), an ordered, fused response list
// comes out (compute). The engine feeds it from the network; tests feed it directly.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "controller/message.h"
#include "controller/readiness_stats.h"
#include "controller/response_cache.h"

namespace krug::controller {

using Clock = std::chrono::steady_clock;

// Bytes of payload a response moves (every tensor's elements times the dtype's size).
int64_t response_bytes(const Response& r);

// Compares the ranks' requests for one name field by field and words the first disagreement:
// "Mismatched shapes for allreduce 'w' (process set 0): rank 0: [2]; rank 1: [3]".
class Agreement {
 public:
  explicit Agreement(const std::map<int32_t, Request>& by_rank);
  // Checks `field` (each rank's value as text) unless an earlier check already failed.
  Agreement& on(std::string_view field, const std::function<std::string(const Request&)>& value);
  const std::string& error() const { return error_; }  // empty while every rank agrees
  const Request& first() const { return first_; }

 private:
  const std::map<int32_t, Request>& by_rank_;
  const Request& first_;
  bool uniform_ = false;
  std::string error_;
};

class Negotiator {
 public:
  // `cache` is the coordinator rank's own cache; compute() assigns ids in it.
  Negotiator(int world_size, int64_t fusion_threshold_bytes, ResponseCache& cache);

  // Records one rank's requests; cache hits are resolved through the cache. Requests that can
  // be rejected at once (unknown process set, rank not a member) become error responses.
  void add(const RequestList& list, Clock::time_point now);

  // Ready operations as an ordered, fused response list; removes them from the table.
  std::vector<Response> compute();

  bool has_pending() const {
    return !table_.empty() || !cached_pending_.empty() || !joined_.empty() || step_.active;
  }
  // The autotuner's knob: applies to responses computed from now on.
  void set_fusion_threshold(int64_t bytes) { fusion_threshold_ = bytes; }
  std::vector<Stall> stalls(Clock::time_point now, double older_than_seconds) const;
  // When the longest-waiting of what stalls() considers was first seen, among those first seen
  // after `after` (nullopt: none): the stall inspector looks again exactly when it may have
  // become a stall.
  std::optional<Clock::time_point> oldest_pending(
      Clock::time_point after = Clock::time_point::min()) const;

  // Records when each rank submitted the global set's tensors that become ready from now on
  // (elastic stragglers, read through readiness()). Off by default: fixed jobs do not pay
  // for it on the negotiation path.
  void track_readiness() { track_readiness_ = true; }
  const ReadinessStats& readiness() const { return readiness_; }

  // Members (global ranks, ascending) of a live process set; throws for unknown ids.
  const std::vector<int32_t>& members(int32_t process_set) const;

 private:
  struct Pending {
    std::map<int32_t, Request> by_rank;               // global rank -> its request
    std::map<int32_t, Clock::time_point> arrived_at;  // with track_readiness(): rank -> when
    Clock::time_point first_seen;
    uint64_t arrival = 0;  // decides the order of responses
  };

  // Steady state: cache hits while nothing else is pending are counted per id, without the
  // per-name table; the responses they make carry ids and parameters only (no names: every
  // rank's cache has them). false: the hit needs the general path (unknown set, not a member,
  // sent twice), which then reports it. `set_size`: members of the hit's process set, of which
  // `rank` is one.
  bool add_cached(int32_t rank, uint32_t id, int set_size, Clock::time_point now);
  // Members of `process_set` if `rank` is one of them, else 0 (also for an unknown set).
  int size_if_member(int32_t process_set, int32_t rank) const;
  // The step fast path: in steady state every rank sends the same list of hits, so rank 0
  // compares a list with the first one (a memcmp) and counts the rank once, instead of once per
  // hit: its cost per cycle grows with ranks, not ranks x tensors. Returns false when the list
  // needs the per-hit path (after spreading what the step had counted into per-hit entries).
  bool add_step(int32_t rank, const std::vector<uint32_t>& hits, Clock::time_point now);
  // The step's count, as per-hit entries (add_cached's), when lists stop agreeing or a cycle
  // ends before every rank sent its list.
  void spread_step();
  // Before anything enters the general table: the counted hits move into it, so that one
  // procedure decides (joins, removed sets, mismatches, ordering against new names).
  void move_cached_into_table();
  void compute_cached(std::vector<Response>& out);
  void add_request(int32_t rank, const Request& request, Clock::time_point now);
  bool is_ready(const Pending& p) const;
  // Empty when the ranks' requests for one name may run together; else the error every rank
  // gets.
  std::string validate(const Pending& p) const;
  std::string validate_reduction(const Pending& p, Agreement& agree) const;
  std::string validate_broadcast(const Pending& p, Agreement& agree) const;
  std::string validate_gather(const Pending& p, Agreement& agree) const;
  std::string validate_add_process_set(Agreement& agree) const;
  std::string validate_remove_process_set(Agreement& agree) const;
  Response make_response(const Pending& p);
  void record_readiness(const Pending& p);  // with track_readiness(): the set's arrival times
  // Fails and drops what is pending on process set `removed`, but for the removal itself.
  void fail_pending_on_removed_set(std::vector<Response>& out, int32_t removed,
                                   const std::string& removing_key);
  void find_cached(Response& r) const;
  void assign_new_cache_ids(std::vector<Response>& out);
  void apply_membership_change(Response& r);
  void fuse_into(std::vector<Response>& out, Response r);
  void error_on(std::vector<Response>& out, const Pending& p, std::string message);

  int world_size_;
  int64_t fusion_threshold_;
  ResponseCache& cache_;
  std::map<std::string, Pending> table_;  // table_key(set, name) -> pending
  // The hits counted by add_cached, by cache id (entries are reused from step to step). While
  // any is pending, table_ is empty.
  struct CachedPending {
    std::vector<uint64_t> ranks;                // bit per global rank that sent the hit
    std::vector<Clock::time_point> arrived_at;  // with track_readiness(): per global rank
    int count = 0;
    bool pending = false;
    uint64_t arrival = 0;
    Clock::time_point first_seen;
  };
  std::vector<CachedPending> cached_;
  // The step fast path's count (add_step): while active, no hit is pending per id.
  struct Step {
    bool active = false;
    std::vector<uint32_t> hits;  // the list every rank sends
    int32_t process_set = 0;
    int set_size = 0;
    std::vector<uint64_t> ranks;                // bit per global rank that sent it
    std::vector<Clock::time_point> arrived_at;  // with track_readiness()
    int count = 0;
    uint64_t first_arrival = 0;  // hits[i] arrived as first_arrival + i
    Clock::time_point first_seen;
  } step_;
  std::vector<uint32_t> cached_pending_;  // ids with pending set, in arrival order
  std::vector<uint32_t> cached_ready_;    // those every member has sent
  std::vector<Response> immediate_errors_;
  std::map<int32_t, std::vector<int32_t>> sets_;
  int32_t next_set_id_ = 1;
  std::set<int32_t> joined_;
  int32_t last_joined_ = -1;
  Clock::time_point first_joined_at_{};  // while joined_ is not empty: the stall inspector's
  uint64_t next_arrival_ = 0;
  bool track_readiness_ = false;
  ReadinessStats readiness_;
};

}  // namespace krug::controller
