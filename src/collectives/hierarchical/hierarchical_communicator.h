// Hierarchical allreduce: reduce inside each host, allreduce across hosts, spread inside each
// host. Every other collective runs on a flat communicator over the whole set.
//
// Why: a flat allreduce over N = H x L ranks (H hosts, L ranks each) makes every host send
// 2 L (H-1)/H of the buffer over its network link (each rank exchanges (N-1)/N of it, and all
// but its L-1 host peers are remote). Reducing inside the host first leaves 2 (H-1)/H of the
// buffer per host on the network: L times less, at the price of intra-host traffic, which is
// cheaper wherever the network is the bottleneck.
//
// Algorithm ("2D", as in NCCL's and Horovod's hierarchical modes): the buffer is cut into
// K = (most ranks of the set on one host) slices; on a host with L members, member i owns the
// slices s with s % L == i.
//   1. Inside each host, a reduce-scatter leaves each slice reduced over the host's members at
//      its owner (ceil(K / L) rounds of the local communicator's reducescatter).
//   2. For each slice s, its owners on all hosts allreduce it across hosts (one communicator per
//      slice, H members in host order). With the same L on every host, K = L and each member
//      handles exactly one slice, so L cross-host allreduces of 1/L of the buffer run side by
//      side: the network and the reduction work are spread over every rank instead of one
//      leader per host, which would move all of the cross-host bytes and reduce L buffers alone.
//      A host with fewer members gives each of them several slices, one after another.
//   3. Inside each host, an allgather spreads the owners' slices to every member.
// Those are 4 message rounds (2 inside the host, 2 across) where the flat ring has 2. Buffers
// of at most kLatencyBoundBytes are latency-bound, so they take 2 rounds instead: every member
// gathers its host's buffers and folds them in member order, then the members of each slice's
// group gather the host partials and fold them in host order. More bytes (L-1 + H-1 buffers
// per member) but half the rounds, and the same association, hence the same bits: the choice
// by size cannot make a tensor's result depend on how it was fused.
//
// Association: element x ends up as  H_0 op H_1 op ... op H_(H-1), hosts ordered by their lowest
// member, in the association of the cross-host groups (a left fold over Gloo or MPI, the tree of
// tcp_algorithms.h over krug's TCP plane; the small path then allreduces the host partials
// through those groups instead of folding them itself), where H_h = m_0 op m_1 op ... is the
// left fold over host h's members in set order. The same for every element whatever its offset or
// the buffer's length, so results are bitwise identical across ranks and across fusion layouts, and
// run to run. It differs from the flat order (x0 op x1 op ... op x(N-1)) only in association:
// identical for integers, min, max and any float values whose partial results are exact; for other
// float sums and products it is a different rounding of the same sum (docs/architecture.md).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/hierarchical/host_layout.h"

namespace krug::collectives {

// Builds a communicator among `size` ranks, this one being `rank`; `scope` ("local/1",
// "cross/0") names the group so that each group rendezvouses apart from the others.
using CommunicatorFactory =
    std::function<std::unique_ptr<Communicator>(const std::string& scope, int rank, int size)>;

class HierarchicalCommunicator : public Communicator {
 public:
  // Member `index` of a set laid out as `layout`. `flat` spans the whole set and carries every
  // collective but allreduce. The local and cross communicators come from `make`, in an order
  // that cannot deadlock: each member builds its host's group, then its slices' groups in
  // ascending slice order. Buffers up to `latency_bound_bytes` take the two-round path (tests
  // set 0 or SIZE_MAX to force either).
  HierarchicalCommunicator(HostLayout layout, int index, std::unique_ptr<Communicator> flat,
                           const CommunicatorFactory& make,
                           size_t latency_bound_bytes = kLatencyBoundBytes);
  ~HierarchicalCommunicator() override;

  int rank() const override { return index_; }
  int size() const override { return flat_->size(); }
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  bool reduces_in_rank_order() const override { return false; }
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override {
    flat_->reducescatter(in, out, counts, dtype, op);
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override {
    flat_->allgatherv(in, out, bytes_per_rank);
  }
  void broadcast(void* data, size_t bytes, int root) override { flat_->broadcast(data, bytes, root); }
  void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override {
    flat_->alltoallv(in, send_bytes, out, recv_bytes);
  }
  void barrier() override { flat_->barrier(); }
  void sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                size_t recv_bytes, int recv_from) override {
    flat_->sendrecv(send_data, send_bytes, send_to, recv_data, recv_bytes, recv_from);
  }
  const char* backend_name() const override { return "hierarchical"; }

  const HostLayout& layout() const { return layout_; }

  // Makes one group of a derived communicator from this one's group of the same members in the
  // same order; `inside_host`: the group of this member's host, else a cross-host group.
  using GroupFactory =
      std::function<std::unique_ptr<Communicator>(Communicator& group, bool inside_host)>;
  // A hierarchical communicator of the same layout and member over other transports: `flat`
  // spans the set, and every group comes from `like` (a GPU plane's groups bootstrap over, or
  // stage through, these CPU groups). Collective, like the constructor. Pass
  // latency_bound_bytes 0 when the buffers are not host memory: only the communicators then
  // touch the data.
  std::unique_ptr<HierarchicalCommunicator> derive(std::unique_ptr<Communicator> flat,
                                                   const GroupFactory& like,
                                                   size_t latency_bound_bytes) const;

  // Default bound of the two-round allgather path (see above).
  static constexpr size_t kLatencyBoundBytes = 64 * 1024;

 private:
  void allreduce_by_allgather(void* data, size_t count, DataType dtype, ReduceOp op);
  // The small path's step across hosts over groups that do not reduce in rank order.
  void allreduce_across(void* data, size_t count, DataType dtype, ReduceOp op);
  // acc = parts[0] op parts[1] op ... op parts[n-1], a left fold as GlooCommunicator's.
  static void fold(void* acc, const uint8_t* parts, int n, size_t count, DataType dtype,
                   ReduceOp op);
  uint8_t* scratch_for(size_t bytes);
  // Runs one step of the allreduce, adding which step, which group (slice >= 0: that slice's
  // cross-host group) and which member to a failure.
  template <typename F>
  void step(const char* what, int slice, F&& f);

  HostLayout layout_;
  int index_;
  int host_;         // index of this member's host in layout_.hosts
  int local_index_;  // place among its host's members
  int slices_;       // K
  size_t latency_bound_bytes_;
  std::unique_ptr<Communicator> flat_;
  std::unique_ptr<Communicator> local_;                 // null when alone on its host
  std::map<int, std::unique_ptr<Communicator>> cross_;  // slice -> group; empty for one host
  std::vector<uint8_t> scratch_;                        // gathered buffers of the small path
};

}  // namespace krug::collectives
