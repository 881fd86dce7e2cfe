#include "controller/negotiator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>

#include "collectives/adasum.h"
#include "controller/alltoall_splits.h"

namespace krug::controller {
int64_t response_bytes(const Response& r) {
  int64_t bytes = 0;
  for (const auto& shape : r.shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bytes += n * static_cast<int64_t>(dtype_size(r.dtype));
  }
  return bytes;
}

namespace {

bool same_fusion_key(const Response& a, const Response& b) {
  return a.type == ResponseType::kOp && b.type == ResponseType::kOp && a.op == OpType::kAllreduce &&
         b.op == OpType::kAllreduce && a.process_set == b.process_set && a.dtype == b.dtype &&
         a.reduce_op == b.reduce_op && a.prescale == b.prescale && a.postscale == b.postscale &&
         a.device == b.device;
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// "rank 0: float32; ranks 1, 2: int32" for the ranks that disagree on `field`.
std::string disagreement(const std::map<int32_t, Request>& by_rank,
                         const std::function<std::string(const Request&)>& field) {
  std::map<std::string, std::vector<int32_t>> groups;
  for (const auto& [rank, req] : by_rank) groups[field(req)].push_back(rank);
  if (groups.size() <= 1) return {};
  std::vector<std::string> parts;
  for (const auto& [value, ranks] : groups)
    parts.push_back(fmt::format("{} {}: {}", ranks.size() == 1 ? "rank" : "ranks",
                                fmt::join(ranks, ", "), value));
  return fmt::format("{}", fmt::join(parts, "; "));
}

// Whether two ranks' requests agree on everything validate() compares (allgather and alltoall
// may differ in their first dimension and their splits).
bool same_terms(const Request& a, const Request& b) {
  const bool first_dim_free = a.op == OpType::kAllgather || a.op == OpType::kAlltoall;
  const bool shapes_agree =
      first_dim_free ? a.shape.size() == b.shape.size() && !a.shape.empty() &&
                           std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1)
                     : a.shape == b.shape;
  return a.op == b.op && a.dtype == b.dtype && a.reduce_op == b.reduce_op && a.root == b.root &&
         a.prescale == b.prescale && a.postscale == b.postscale && shapes_agree &&
         a.set_ranks == b.set_ranks && a.target_process_set == b.target_process_set &&
         a.group == b.group && a.group_size == b.group_size && a.device == b.device;
}

}  // namespace

Agreement::Agreement(const std::map<int32_t, Request>& by_rank)
    : by_rank_(by_rank), first_(by_rank.begin()->second) {
  // The common case: every rank sent the same terms. Then no field can disagree, and the
  // per-field descriptions (strings for every rank) need not be built at all.
  uniform_ = std::all_of(by_rank.begin(), by_rank.end(),
                         [&](const auto& entry) { return same_terms(first_, entry.second); });
}

Agreement& Agreement::on(std::string_view field,
                         const std::function<std::string(const Request&)>& value) {
  if (uniform_ || !error_.empty()) return *this;
  if (std::string d = disagreement(by_rank_, value); !d.empty())
    error_ = fmt::format("Mismatched {} for {} '{}' (process set {}): {}", field,
                         op_name(first_.op), first_.name, first_.process_set, d);
  return *this;
}

Negotiator::Negotiator(int world_size, int64_t fusion_threshold_bytes, ResponseCache& cache)
    : world_size_(world_size),
      fusion_threshold_(fusion_threshold_bytes),
      cache_(cache),
      readiness_(world_size) {
  std::vector<int32_t> all(world_size);
  for (int i = 0; i < world_size; ++i) all[i] = i;
  sets_[0] = std::move(all);
}

const std::vector<int32_t>& Negotiator::members(int32_t process_set) const {
  auto it = sets_.find(process_set);
  if (it == sets_.end()) throw Error(fmt::format("unknown process set {}", process_set));
  return it->second;
}

int Negotiator::size_if_member(int32_t process_set, int32_t rank) const {
  auto set = sets_.find(process_set);
  if (set == sets_.end() || !std::binary_search(set->second.begin(), set->second.end(), rank))
    return 0;
  return static_cast<int>(set->second.size());
}

void Negotiator::add(const RequestList& list, Clock::time_point now) {
  if (!list.cache_hits.empty() && add_step(list.rank, list.cache_hits, now)) {
    for (const auto& request : list.requests) add_request(list.rank, request, now);
    return;
  }
  // Rank 0 runs this for every rank's list every cycle: at thousands of ranks the per-hit work
  // is the coordinator's cost, so the hit's set and this rank's membership are looked up once
  // per run of hits on the same set, not once per hit.
  int32_t set_id = -1;
  int set_size = 0;  // 0: this rank is not a member of set_id (or it does not exist)
  for (uint32_t id : list.cache_hits) {
    const Request& q = cache_.at(id);
    if (table_.empty() && joined_.empty()) {
      if (q.process_set != set_id) {
        set_id = q.process_set;
        set_size = size_if_member(set_id, list.rank);
      }
      if (set_size > 0 && add_cached(list.rank, id, set_size, now)) continue;
    }
    add_request(list.rank, q, now);
  }
  for (const auto& request : list.requests) add_request(list.rank, request, now);
}

bool Negotiator::add_cached(int32_t rank, uint32_t id, int set_size, Clock::time_point now) {
  if (cached_.size() <= id) cached_.resize(cache_.size());
  CachedPending& c = cached_[id];
  const size_t word = static_cast<size_t>(rank) / 64;
  const uint64_t bit = uint64_t{1} << (rank % 64);
  if (!c.pending) {
    c.ranks.assign((static_cast<size_t>(world_size_) + 63) / 64, 0);
    if (track_readiness_) c.arrived_at.assign(world_size_, Clock::time_point{});
    c.count = 0;
    c.pending = true;
    c.arrival = next_arrival_++;
    c.first_seen = now;
    cached_pending_.push_back(id);
  } else if (c.ranks[word] & bit) {
    return false;
  }
  c.ranks[word] |= bit;
  if (track_readiness_) c.arrived_at[rank] = now;
  if (++c.count == set_size) cached_ready_.push_back(id);
  return true;
}

bool Negotiator::add_step(int32_t rank, const std::vector<uint32_t>& hits,
                          Clock::time_point now) {
  if (!table_.empty() || !joined_.empty()) return false;
  const size_t word = static_cast<size_t>(rank) / 64;
  const uint64_t bit = uint64_t{1} << (rank % 64);
  if (step_.active) {
    if (hits == step_.hits && !(step_.ranks[word] & bit) &&
        size_if_member(step_.process_set, rank) > 0) {
      step_.ranks[word] |= bit;
      if (track_readiness_) step_.arrived_at[rank] = now;
      if (++step_.count == step_.set_size) spread_step();
      return true;
    }
    spread_step();
    return false;
  }
  if (!cached_pending_.empty()) return false;
  // A new step: every hit valid (else the per-hit path reports it), one process set, and this
  // rank one of its members.
  if (!cache_.contains(hits.front())) return false;
  const int32_t set_id = cache_.at(hits.front()).process_set;
  for (uint32_t id : hits)
    if (!cache_.contains(id) || cache_.at(id).process_set != set_id) return false;
  const int set_size = size_if_member(set_id, rank);
  if (set_size == 0) return false;
  std::vector<uint32_t> sorted = hits;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return false;
  step_.active = true;
  step_.hits = hits;
  step_.process_set = set_id;
  step_.set_size = set_size;
  step_.ranks.assign((static_cast<size_t>(world_size_) + 63) / 64, 0);
  step_.ranks[word] |= bit;
  if (track_readiness_) {
    step_.arrived_at.assign(world_size_, Clock::time_point{});
    step_.arrived_at[rank] = now;
  }
  step_.count = 1;
  step_.first_arrival = next_arrival_;
  next_arrival_ += hits.size();
  step_.first_seen = now;
  if (step_.count == step_.set_size) spread_step();
  return true;
}

void Negotiator::spread_step() {
  if (!step_.active) return;
  step_.active = false;
  if (cached_.size() < cache_.size()) cached_.resize(cache_.size());
  for (size_t i = 0; i < step_.hits.size(); ++i) {
    const uint32_t id = step_.hits[i];
    CachedPending& c = cached_[id];
    c.ranks = step_.ranks;
    if (track_readiness_) c.arrived_at = step_.arrived_at;
    c.count = step_.count;
    c.pending = true;
    c.arrival = step_.first_arrival + i;
    c.first_seen = step_.first_seen;
    cached_pending_.push_back(id);
    if (c.count == step_.set_size) cached_ready_.push_back(id);
  }
}

void Negotiator::move_cached_into_table() {
  spread_step();
  for (uint32_t id : cached_pending_) {
    CachedPending& c = cached_[id];
    const Request& q = cache_.at(id);
    Pending& p = table_[table_key(q.process_set, q.name)];
    p.first_seen = c.first_seen;
    p.arrival = c.arrival;
    for (int32_t rank = 0; rank < world_size_; ++rank) {
      if (!(c.ranks[rank / 64] >> (rank % 64) & 1)) continue;
      p.by_rank[rank] = q;
      if (track_readiness_) p.arrived_at[rank] = c.arrived_at[rank];
    }
    c.pending = false;
  }
  cached_pending_.clear();
  cached_ready_.clear();
}

void Negotiator::add_request(int32_t rank, const Request& request, Clock::time_point now) {
  if (!cached_pending_.empty() || step_.active) move_cached_into_table();
  if (request.op == OpType::kJoin) {
    if (joined_.empty()) first_joined_at_ = now;
    joined_.insert(rank);
    last_joined_ = rank;
    return;
  }
  auto set = sets_.find(request.process_set);
  if (set == sets_.end() || !std::binary_search(set->second.begin(), set->second.end(), rank)) {
    Response r;
    r.type = ResponseType::kError;
    r.op = request.op;
    r.process_set = request.process_set;
    r.names = {request.name};
    r.error = fmt::format(
        "{} '{}' from rank {}: process set {} {}", op_name(request.op), request.name, rank,
        request.process_set,
        set == sets_.end() ? "does not exist (was it removed?)" : "does not include this rank");
    // Only the submitting rank holds this name; others ignore errors for names they lack.
    immediate_errors_.push_back(std::move(r));
    return;
  }
  auto key = table_key(request.process_set, request.name);
  auto [it, inserted] = table_.try_emplace(key);
  if (inserted) {
    it->second.first_seen = now;
    it->second.arrival = next_arrival_++;
  }
  it->second.by_rank[rank] = request;
  if (track_readiness_) it->second.arrived_at[rank] = now;
}

bool Negotiator::is_ready(const Pending& p) const {
  const Request& any = p.by_rank.begin()->second;
  for (int32_t m : members(any.process_set)) {
    if (p.by_rank.count(m)) continue;
    if (joined_.count(m)) {
      if (any.op == OpType::kAllreduce) continue;
      return true;  // ready to fail: only allreduce can run with joined ranks
    }
    return false;
  }
  return true;
}

std::string Negotiator::validate(const Pending& p) const {
  const Request& first = p.by_rank.begin()->second;
  for (int32_t m : members(first.process_set))
    if (!p.by_rank.count(m) && joined_.count(m) && first.op != OpType::kAllreduce)
      return fmt::format(
          "{} '{}' cannot run while rank {} has joined: only allreduce proceeds with joined "
          "ranks (they contribute zeros)",
          op_name(first.op), first.name, m);
  Agreement agree(p.by_rank);
  agree.on("operations", [](const Request& r) { return std::string(op_name(r.op)); })
      .on("data types", [](const Request& r) { return std::string(dtype_name(r.dtype)); })
      .on("devices",
          [](const Request& r) { return std::string(r.device == kCudaMemory ? "CUDA" : "CPU"); });
  if (!agree.error().empty()) return agree.error();
  switch (first.op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      return validate_reduction(p, agree);
    case OpType::kBroadcast:
      return validate_broadcast(p, agree);
    case OpType::kAllgather:
    case OpType::kAlltoall:
      return validate_gather(p, agree);
    case OpType::kAddProcessSet:
      return validate_add_process_set(agree);
    case OpType::kRemoveProcessSet:
      return validate_remove_process_set(agree);
    case OpType::kBarrier:
    case OpType::kJoin:
      break;
  }
  return {};
}

std::string Negotiator::validate_reduction(const Pending& p, Agreement& agree) const {
  const Request& first = p.by_rank.begin()->second;
  agree.on("reduction ops",
           [](const Request& r) { return std::string(reduce_op_name(r.reduce_op)); });
  if (!agree.error().empty()) return agree.error();
  if (first.reduce_op == ReduceOp::kAdasum) {
    if (first.op != OpType::kAllreduce)
      return fmt::format("{} '{}': the adasum reduction runs only as an allreduce",
                         op_name(first.op), first.name);
    const auto size = static_cast<int>(members(first.process_set).size());
    if (std::string why = collectives::adasum_unsupported(first.dtype, size, first.process_set);
        !why.empty())
      return fmt::format("allreduce '{}': {}", first.name, why);
  }
  agree
      .on("scale factors",
          [](const Request& r) {
            return fmt::format("prescale {} postscale {}", r.prescale, r.postscale);
          })
      .on("shapes", [](const Request& r) { return shape_str(r.shape); })
      .on("groups", [](const Request& r) {
        return r.group.empty() ? std::string("none")
                               : fmt::format("{} of {}", r.group, r.group_size);
      });
  if (!agree.error().empty()) return agree.error();
  if (first.op == OpType::kReducescatter && first.shape.empty())
    return fmt::format("reducescatter '{}' needs a tensor with at least one dimension", first.name);
  return {};
}

std::string Negotiator::validate_broadcast(const Pending& p, Agreement& agree) const {
  const Request& first = p.by_rank.begin()->second;
  agree.on("root ranks", [](const Request& r) { return std::to_string(r.root); })
      .on("shapes", [](const Request& r) { return shape_str(r.shape); });
  if (!agree.error().empty()) return agree.error();
  const size_t size = members(first.process_set).size();
  if (first.root < 0 || first.root >= static_cast<int32_t>(size))
    return fmt::format("broadcast '{}': root rank {} is outside process set {} of size {}",
                       first.name, first.root, first.process_set, size);
  return {};
}

std::string Negotiator::validate_gather(const Pending& p, Agreement& agree) const {
  const Request& first = p.by_rank.begin()->second;
  agree.on("shapes (all but the first dimension must agree)", [](const Request& r) {
    if (r.shape.empty()) return std::string("a scalar (needs at least one dimension)");
    return fmt::format("[*, {}]", fmt::join(r.shape.begin() + 1, r.shape.end(), ", "));
  });
  if (!agree.error().empty()) return agree.error();
  if (first.shape.empty())
    return fmt::format("{} '{}' needs a tensor with at least one dimension", op_name(first.op),
                       first.name);
  if (first.op != OpType::kAlltoall) return {};
  const size_t size = members(first.process_set).size();
  for (const auto& [rank, r] : p.by_rank)
    if (auto problem = alltoall_splits_problem(r.splits, r.shape[0], size); !problem.empty())
      return fmt::format("alltoall '{}' on rank {}: {}", first.name, rank, problem);
  return {};
}

std::string Negotiator::validate_add_process_set(Agreement& agree) const {
  agree.on("ranks",
           [](const Request& r) { return fmt::format("[{}]", fmt::join(r.set_ranks, ", ")); });
  if (!agree.error().empty()) return agree.error();
  const auto& ranks = agree.first().set_ranks;
  if (ranks.empty() || !std::is_sorted(ranks.begin(), ranks.end()) ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() || ranks.front() < 0 ||
      ranks.back() >= world_size_)
    return fmt::format("add_process_set([{}]): ranks must be distinct, ascending, and in [0, {})",
                       fmt::join(ranks, ", "), world_size_);
  for (const auto& [id, existing] : sets_)
    if (existing == ranks)
      return fmt::format("add_process_set([{}]): process set {} already has these ranks",
                         fmt::join(ranks, ", "), id);
  return {};
}

std::string Negotiator::validate_remove_process_set(Agreement& agree) const {
  agree.on("process sets to remove",
           [](const Request& r) { return std::to_string(r.target_process_set); });
  if (!agree.error().empty()) return agree.error();
  const int32_t target = agree.first().target_process_set;
  if (target == 0) return "remove_process_set: the global process set (0) cannot be removed";
  if (!sets_.count(target))
    return fmt::format("remove_process_set: process set {} does not exist", target);
  return {};
}

Response Negotiator::make_response(const Pending& p) {
  const Request& first = p.by_rank.begin()->second;
  const auto& set = members(first.process_set);
  Response r = response_for(first);
  if (first.op == OpType::kAllgather) {
    for (int32_t m : set) r.rank_dims.push_back(p.by_rank.at(m).shape[0]);
  } else if (first.op == OpType::kAlltoall) {
    for (int32_t m : set)
      for (int64_t s : p.by_rank.at(m).splits) r.rank_dims.push_back(s);
  }
  if (first.op == OpType::kAddProcessSet) r.set_ranks = first.set_ranks;
  if (first.op == OpType::kRemoveProcessSet) r.root = first.target_process_set;
  find_cached(r);
  return r;
}

void Negotiator::find_cached(Response& r) const {
  if (!ResponseCache::cacheable(r.op)) return;
  if (auto id = cache_.find(cache_form(r, 0))) {
    r.cache_ids = {*id};
    r.from_cache = true;
  }
}

void Negotiator::assign_new_cache_ids(std::vector<Response>& out) {
  // After fusion and in list order: every rank inserts the new entries in the order it meets
  // them in this list, so ids must increase along the list.
  for (auto& r : out) {
    if (r.type != ResponseType::kOp || r.from_cache) continue;
    if (!ResponseCache::cacheable(r.op)) continue;
    for (size_t i = 0; i < r.names.size(); ++i) {
      auto next = cache_.next_id();
      if (!next) return;  // full: the remaining names (here and later) take the full path
      cache_.insert(*next, cache_form(r, i));
      r.cache_ids.push_back(*next);
    }
  }
}

void Negotiator::apply_membership_change(Response& r) {
  if (r.op == OpType::kAddProcessSet) {
    r.process_set = next_set_id_++;
    sets_[r.process_set] = r.set_ranks;
  } else if (r.op == OpType::kRemoveProcessSet) {
    sets_.erase(r.root);
  }
}

void Negotiator::fuse_into(std::vector<Response>& out, Response r) {
  if (r.op == OpType::kAllreduce && r.type == ResponseType::kOp) {
    int64_t bytes = response_bytes(r);
    for (auto it = out.rbegin(); it != out.rend(); ++it) {
      if (!same_fusion_key(*it, r)) continue;
      // Mixed cached/uncached fusion would need per-name flags on the wire; keep them apart.
      if (it->from_cache != r.from_cache) continue;
      if (response_bytes(*it) + bytes > fusion_threshold_) continue;
      it->names.push_back(r.names[0]);
      it->shapes.push_back(r.shapes[0]);
      for (uint32_t id : r.cache_ids) it->cache_ids.push_back(id);
      return;
    }
  }
  out.push_back(std::move(r));
}

void Negotiator::error_on(std::vector<Response>& out, const Pending& p, std::string message) {
  const Request& first = p.by_rank.begin()->second;
  Response r;
  r.type = ResponseType::kError;
  r.op = first.op;
  r.process_set = first.process_set;
  r.names = {first.name};
  r.error = std::move(message);
  out.push_back(std::move(r));
}

void Negotiator::compute_cached(std::vector<Response>& out) {
  // Ids from one cache were validated when their entries were made, and every member sent the
  // same id: nothing to compare. Fused like the general path: in arrival order, each into the
  // latest compatible response with room.
  std::sort(cached_ready_.begin(), cached_ready_.end(),
            [&](uint32_t a, uint32_t b) { return cached_[a].arrival < cached_[b].arrival; });
  const size_t first_new = out.size();
  std::vector<int64_t> bytes;  // of out[first_new + i]
  for (uint32_t id : cached_ready_) {
    CachedPending& c = cached_[id];
    c.pending = false;
    const Request& q = cache_.at(id);
    if (track_readiness_ && q.process_set == 0) readiness_.observe(q.name, c.arrived_at);
    const int64_t size = cache_.elements(id) * static_cast<int64_t>(dtype_size(q.dtype));
    bool fused = false;
    for (size_t i = out.size(); q.op == OpType::kAllreduce && i-- > first_new;) {
      Response& r = out[i];
      if (r.op != OpType::kAllreduce || r.process_set != q.process_set || r.dtype != q.dtype ||
          r.reduce_op != q.reduce_op || r.prescale != q.prescale || r.postscale != q.postscale ||
          r.device != q.device)
        continue;
      if (bytes[i - first_new] + size > fusion_threshold_) continue;
      r.cache_ids.push_back(id);
      bytes[i - first_new] += size;
      fused = true;
      break;
    }
    if (fused) continue;
    Response r;
    r.cache_ids = {id};
    cache_.expand(r, /*names=*/false);
    out.push_back(std::move(r));
    bytes.push_back(size);
  }
  cached_ready_.clear();
  std::erase_if(cached_pending_, [&](uint32_t id) { return !cached_[id].pending; });
}

std::vector<Response> Negotiator::compute() {
  std::vector<Response> out = std::move(immediate_errors_);
  immediate_errors_.clear();
  spread_step();  // a step that some rank has not sent yet waits per hit, as any other
  compute_cached(out);

  // Ready entries in arrival order; groups are released only when complete.
  std::vector<std::pair<uint64_t, std::string>> ready;
  std::map<std::string, int> group_ready;
  for (const auto& [key, p] : table_) {
    if (!is_ready(p)) continue;
    ready.emplace_back(p.arrival, key);
    const Request& first = p.by_rank.begin()->second;
    if (!first.group.empty()) ++group_ready[table_key(first.process_set, first.group)];
  }
  std::sort(ready.begin(), ready.end());

  for (const auto& [arrival, key] : ready) {
    auto it = table_.find(key);
    if (it == table_.end()) continue;  // dropped with a process set removed in this cycle
    const Pending& p = it->second;
    const Request& first = p.by_rank.begin()->second;
    if (!first.group.empty() &&
        group_ready[table_key(first.process_set, first.group)] < first.group_size)
      continue;
    if (std::string error = validate(p); !error.empty()) {
      error_on(out, p, std::move(error));
    } else {
      record_readiness(p);
      Response r = make_response(p);
      apply_membership_change(r);
      if (r.op == OpType::kRemoveProcessSet) fail_pending_on_removed_set(out, r.root, key);
      fuse_into(out, std::move(r));
    }
    table_.erase(key);
  }

  if (!joined_.empty() && static_cast<int>(joined_.size()) == world_size_) {
    Response r;
    r.op = OpType::kJoin;
    r.names = {"join"};
    r.last_joined_rank = last_joined_;
    out.push_back(std::move(r));
    joined_.clear();
  }
  assign_new_cache_ids(out);
  return out;
}

void Negotiator::record_readiness(const Pending& p) {
  const Request& first = p.by_rank.begin()->second;
  if (!track_readiness_ || first.process_set != 0 ||
      static_cast<int>(p.arrived_at.size()) != world_size_)
    return;
  std::vector<Clock::time_point> arrivals;
  arrivals.reserve(world_size_);
  for (const auto& [rank, t] : p.arrived_at) arrivals.push_back(t);
  readiness_.observe(first.name, arrivals);
}

void Negotiator::fail_pending_on_removed_set(std::vector<Response>& out, int32_t removed,
                                             const std::string& removing_key) {
  // Operations still pending on a removed set can never complete.
  for (auto& [other_key, other] : table_)
    if (other.by_rank.begin()->second.process_set == removed && other_key != removing_key)
      error_on(out, other,
               fmt::format("process set {} was removed while '{}' was pending", removed,
                           other.by_rank.begin()->second.name));
  std::erase_if(table_, [&](const auto& kv) {
    return kv.first != removing_key && kv.second.by_rank.begin()->second.process_set == removed;
  });
}

std::optional<Clock::time_point> Negotiator::oldest_pending(Clock::time_point after) const {
  std::optional<Clock::time_point> oldest;
  auto consider = [&](Clock::time_point t) {
    if (t > after) oldest = oldest ? std::min(*oldest, t) : t;
  };
  for (uint32_t id : cached_pending_) consider(cached_[id].first_seen);
  if (step_.active) consider(step_.first_seen);
  for (const auto& entry : table_) consider(entry.second.first_seen);
  if (!joined_.empty()) consider(first_joined_at_);
  return oldest;
}

std::vector<Stall> Negotiator::stalls(Clock::time_point now, double older_than_seconds) const {
  std::vector<Stall> result;
  // A counted hit: its entry's rank bits say who sent it.
  auto counted = [&](uint32_t id, const std::vector<uint64_t>& ranks, Clock::time_point first_seen) {
    const double waited = std::chrono::duration<double>(now - first_seen).count();
    if (waited < older_than_seconds) return;
    const Request& q = cache_.at(id);
    Stall s{q.name, q.op, q.process_set, {}, {}, waited};
    for (int32_t m : members(q.process_set))
      (ranks[m / 64] >> (m % 64) & 1 ? s.ready_ranks : s.missing_ranks).push_back(m);
    result.push_back(std::move(s));
  };
  for (uint32_t id : cached_pending_) counted(id, cached_[id].ranks, cached_[id].first_seen);
  if (step_.active)
    for (uint32_t id : step_.hits) counted(id, step_.ranks, step_.first_seen);
  for (const auto& [key, p] : table_) {
    double waited = std::chrono::duration<double>(now - p.first_seen).count();
    if (waited < older_than_seconds) continue;
    const Request& first = p.by_rank.begin()->second;
    Stall s{first.name, first.op, first.process_set, {}, {}, waited};
    for (int32_t m : members(first.process_set))
      (p.by_rank.count(m) ? s.ready_ranks : s.missing_ranks).push_back(m);
    result.push_back(std::move(s));
  }
  // A join waits for every rank of the job; ranks that never join leave the others in it.
  if (!joined_.empty()) {
    double waited = std::chrono::duration<double>(now - first_joined_at_).count();
    if (waited >= older_than_seconds) {
      Stall s{"join", OpType::kJoin, 0, {}, {}, waited};
      for (int32_t m = 0; m < world_size_; ++m)
        (joined_.count(m) ? s.ready_ranks : s.missing_ranks).push_back(m);
      result.push_back(std::move(s));
    }
  }
  return result;
}

}  // namespace krug::controller
