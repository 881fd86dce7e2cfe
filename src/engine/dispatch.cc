// Runs each response the ranks agreed on: process-set changes, join and barrier here, and the
// collectives on the process set's communicator through the executor.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collectives/adasum.h"
#include "common/shape.h"
#include "engine/engine_impl.h"
#include "engine/timeline_observer.h"

namespace krug::engine {

using controller::OpType;
using controller::Response;

namespace {

// What an allreduce or reducescatter response decided, as the executor takes it.
Reduction reduction(const Response& r) {
  return Reduction{.dtype = r.dtype,
                   .op = r.reduce_op,
                   .prescale = r.prescale,
                   .postscale = r.postscale,
                   .process_set = r.process_set,
                   .on_device = r.device != controller::kHostMemory};
}

}  // namespace

void Engine::Impl::execute(const Response& r) {
  switch (r.op) {
    case OpType::kAddProcessSet:
    case OpType::kRemoveProcessSet:
    case OpType::kJoin:
    case OpType::kBarrier:
      return execute_control(r);
    default:
      break;
  }
  ProcessSets::Set* set = sets_->find(r.process_set);
  if (!set || set->my_index < 0) return;
  if (r.op == OpType::kAllreduce) return run_allreduce(r, *set);
  run_one(r, *set);
}

void Engine::Impl::execute_control(const Response& r) {
  switch (r.op) {
    case OpType::kAddProcessSet:
      add_process_set(r.process_set, r.set_ranks);
      for (const auto& name : r.names) {
        auto key = controller::table_key(0, name);
        if (TableSlot* slot = table_.find(key)) slot->second.handle->result().value = r.process_set;
        finish(key);
      }
      return;
    case OpType::kRemoveProcessSet:
      sets_->remove(r.root);
      queue_.remove_process_set(r.root);
      for (const auto& name : r.names) finish(controller::table_key(0, name));
      return;
    case OpType::kJoin: {
      auto key = controller::table_key(0, "__join");
      if (TableSlot* slot = table_.find(key))
        slot->second.handle->result().value = r.last_joined_rank;
      finish(key);
      return;
    }
    default:  // kBarrier
      // Negotiation itself synchronized the ranks: the response exists only once all arrived.
      for (const auto& name : r.names) finish(controller::table_key(r.process_set, name));
      return;
  }
}

void Engine::Impl::run_one(const Response& r, ProcessSets::Set& set) {
  auto key = controller::table_key(r.process_set, r.names.at(0));
  TableSlot* slot = table_.find(key);
  if (!slot)
    throw Error(fmt::format("no local tensor for {} '{}' (only allreduce runs on joined ranks)",
                            controller::op_name(r.op), r.names[0]));
  LocalEntry& e = slot->second;
  wait_ready(e.args);
  std::string phase;
  if (observers_.tensors()) {
    phase = phase_name(r.op);
    const auto now = Clock::now();
    observers_.each([&](CycleObserver& o) { o.on_phase_begin(r.names[0], phase, now); });
  }
  auto& comm = *set.comm;
  switch (r.op) {
    case OpType::kAllgather:
      executor_.allgather(comm, r.dtype, r.rank_dims, e.args, e.handle->result());
      break;
    case OpType::kBroadcast:
      executor_.broadcast(comm, r.dtype, r.shapes[0], r.root, e.args);
      break;
    case OpType::kAlltoall:
      executor_.alltoall(comm, r.dtype, r.rank_dims, e.args, e.handle->result());
      break;
    case OpType::kReducescatter:
      executor_.reducescatter(comm, reduction(r), e.args, e.handle->result());
      break;
    default:
      throw Error(fmt::format("unexpected op {}", controller::op_name(r.op)));
  }
  if (observers_.tensors()) {
    const auto now = Clock::now();
    observers_.each([&](CycleObserver& o) { o.on_phase_end(r.names[0], phase, now); });
  }
  finish(key);
}

void Engine::Impl::run_allreduce(const Response& r, ProcessSets::Set& set) {
  // A response from the cache carries ids only (its names are expanded only for the timeline).
  const bool by_id = r.names.empty();
  const size_t n = by_id ? r.cache_ids.size() : r.names.size();
  auto& slots = allreduce_slots_;  // null: no tensor here (a joined rank contributes zeros)
  auto& tensors = allreduce_tensors_;
  slots.assign(n, nullptr);
  tensors.assign(n, FusedTensor{});
  for (size_t i = 0; i < n; ++i) {
    if (by_id) {
      slots[i] = table_.by_id(r.cache_ids[i], cache_);
      tensors[i].count = static_cast<size_t>(cache_.elements(r.cache_ids[i]));
    } else {
      slots[i] = table_.find(controller::table_key(r.process_set, r.names[i]));
      tensors[i].count = static_cast<size_t>(shape_elements(r.shapes[i]));
    }
    if (slots[i]) {
      wait_ready(slots[i]->second.args);
      tensors[i].args = &slots[i]->second.args;
    }
    if (!r.names.empty()) tensors[i].name = &r.names[i];
  }
  if (r.reduce_op == ReduceOp::kAdasum) {
    // The coordinator rejects these already; every rank reaches the same verdict without
    // talking to the others, so failing the names here leaves the engine running.
    std::string why =
        collectives::adasum_unsupported(r.dtype, static_cast<int>(set.ranks.size()), r.process_set);
    if (!why.empty()) {
      fail_names(r, fmt::format("allreduce of [{}]: {}", fmt::join(names_of(r), ", "), why),
                 /*precondition=*/true);  // nothing sent, and the same calls would fail again
      return;
    }
  }
  executor_.allreduce(*set.comm, reduction(r), tensors);
  negotiation_->completed(table_.finish(slots));
}

}  // namespace krug::engine
