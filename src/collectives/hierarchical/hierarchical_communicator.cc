#include "collectives/hierarchical/hierarchical_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "reduce/reduce.h"

namespace krug::collectives {

HierarchicalCommunicator::HierarchicalCommunicator(HostLayout layout, int index,
                                                   std::unique_ptr<Communicator> flat,
                                                   const CommunicatorFactory& make,
                                                   size_t latency_bound_bytes)
    : layout_(std::move(layout)),
      index_(index),
      latency_bound_bytes_(latency_bound_bytes),
      flat_(std::move(flat)) {
  if (!flat_ || flat_->size() != layout_.members() || flat_->rank() != index)
    throw Error(fmt::format("hierarchical communicator: the flat communicator must span the "
                            "{} members of host layout {} as member {}",
                            layout_.members(), layout_.describe(), index));
  host_ = layout_.host_of(index);
  local_index_ = layout_.local_index(index);
  slices_ = layout_.max_local_size();
  const auto& peers = layout_.hosts[host_];
  const int local_size = static_cast<int>(peers.size());
  const int host_count = static_cast<int>(layout_.hosts.size());
  if (local_size > 1)
    local_ = make(fmt::format("local/{}", host_), local_index_, local_size);
  if (host_count > 1)
    for (int s = local_index_; s < slices_; s += local_size)
      cross_[s] = make(fmt::format("cross/{}", s), host_, host_count);
}

HierarchicalCommunicator::~HierarchicalCommunicator() {
  // A device plane kept there may use this communicator's groups (derive()): it goes first.
  device_plane.reset();
}

std::unique_ptr<HierarchicalCommunicator> HierarchicalCommunicator::derive(
    std::unique_ptr<Communicator> flat, const GroupFactory& like,
    size_t latency_bound_bytes) const {
  // The constructor asks for the same groups, in the same order, as it did for this one.
  return std::make_unique<HierarchicalCommunicator>(
      layout_, index_, std::move(flat),
      [&](const std::string& scope, int, int) {
        constexpr std::string_view kCross = "cross/";
        if (scope.rfind(kCross, 0) == 0)
          return like(*cross_.at(std::stoi(scope.substr(kCross.size()))), false);
        return like(*local_, true);
      },
      latency_bound_bytes);
}

template <typename F>
void HierarchicalCommunicator::step(const char* what, int slice, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    // Sub-communicators number their members from 0: say which set member this is.
    throw Error(fmt::format("hierarchical allreduce (members by host: {}): {}{} failed on "
                            "member {}: {}",
                            layout_.describe(), what,
                            slice < 0 ? "" : fmt::format(" (group of slice {})", slice), index_,
                            e.what()));
  }
}

void HierarchicalCommunicator::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0 || size() == 1) return;
  const size_t esize = dtype_size(dtype);
  if (count * esize <= latency_bound_bytes_) return allreduce_by_allgather(data, count, dtype, op);
  auto* bytes = static_cast<uint8_t*>(data);
  // Slice s holds count / K elements, the first count % K slices one more; offset[K] = count.
  std::vector<size_t> offset(slices_ + 1, 0);
  for (int s = 0; s < slices_; ++s)
    offset[s + 1] = offset[s] + count / slices_ + (static_cast<size_t>(s) < count % slices_ ? 1 : 0);
  auto slice_count = [&](int s) { return s < slices_ ? offset[s + 1] - offset[s] : 0; };
  auto at = [&](int s) { return bytes + offset[std::min(s, slices_)] * esize; };

  const int local_size = static_cast<int>(layout_.hosts[host_].size());
  const int rounds = (slices_ + local_size - 1) / local_size;
  // Round r covers slices [r L, r L + L): one each for the host's members (none past K).
  auto round_counts = [&](int r) {
    std::vector<size_t> counts(local_size);
    for (int i = 0; i < local_size; ++i) counts[i] = slice_count(r * local_size + i);
    return counts;
  };
  if (local_) {
    step("reduce-scatter inside the host", -1, [&] {
      for (int r = 0; r < rounds; ++r)
        local_->reducescatter(at(r * local_size), at(r * local_size + local_index_),
                              round_counts(r), dtype, op);
    });
  }
  for (auto& [s, cross] : cross_) {
    step("allreduce across hosts", s, [&] { cross->allreduce(at(s), slice_count(s), dtype, op); });
  }
  if (local_) {
    step("allgather inside the host", -1, [&] {
      for (int r = 0; r < rounds; ++r) {
        auto counts = round_counts(r);
        for (auto& c : counts) c *= esize;
        local_->allgatherv(at(r * local_size + local_index_), at(r * local_size), counts);
      }
    });
  }
}

uint8_t* HierarchicalCommunicator::scratch_for(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void HierarchicalCommunicator::fold(void* acc, const uint8_t* parts, int n, size_t count,
                                    DataType dtype, ReduceOp op) {
  const size_t bytes = count * dtype_size(dtype);
  std::memcpy(acc, parts, bytes);
  for (int k = 1; k < n; ++k) reduce::reduce_into(dtype, op, acc, parts + k * bytes, count);
}

void HierarchicalCommunicator::allreduce_by_allgather(void* data, size_t count, DataType dtype,
                                                      ReduceOp op) {
  const size_t bytes = count * dtype_size(dtype);
  const int local_size = static_cast<int>(layout_.hosts[host_].size());
  const int host_count = static_cast<int>(layout_.hosts.size());
  uint8_t* parts = scratch_for(bytes * std::max(local_size, host_count));
  if (local_) {
    step("allgather inside the host", -1, [&] {
      local_->allgatherv(data, parts, std::vector<size_t>(local_size, bytes));
    });
    fold(data, parts, local_size, count, dtype, op);  // this host's partial, on every member
  }
  if (cross_.empty()) return;
  if (!cross_.begin()->second->reduces_in_rank_order())
    return allreduce_across(data, count, dtype, op);
  // Every group this member is in gathers the same host partials (a host's members all hold
  // its partial); a member of several groups (a host with fewer members) serves each of them.
  for (auto& [s, cross] : cross_) {
    step("allgather across hosts", s, [&] {
      cross->allgatherv(data, parts, std::vector<size_t>(host_count, bytes));
    });
  }
  fold(data, parts, host_count, count, dtype, op);
}

void HierarchicalCommunicator::allreduce_across(void* data, size_t count, DataType dtype,
                                                ReduceOp op) {
  // A cross-host group that associates its own way (a tree) must reduce the host partials
  // itself: a left fold here would make small buffers round differently from large ones.
  const size_t bytes = count * dtype_size(dtype);
  uint8_t* partial = scratch_for(2 * bytes);
  std::memcpy(partial, data, bytes);
  bool first = true;
  for (auto& [s, cross] : cross_) {
    // Every group gets the same partial; the first group's result is this member's.
    uint8_t* buffer = first ? static_cast<uint8_t*>(data) : partial + bytes;
    if (!first) std::memcpy(buffer, partial, bytes);
    step("allreduce across hosts", s, [&] { cross->allreduce(buffer, count, dtype, op); });
    first = false;
  }
}

}  // namespace krug::collectives
