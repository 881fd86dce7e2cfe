// Communicator over krug's own TCP data plane: authenticated connections made when first
// needed (tcp_links.h). It is the plane between hosts: unlike a full mesh, a job of thousands
// of ranks neither runs out of ports nor spends its start connecting every pair.
//
// The algorithm depends on the number of members only, never on a buffer's size, because it
// fixes how float sums associate (and results must not depend on fusion):
// - up to Options::direct_max_members (16), the rank-ordered direct reduce-scatter and allgather
//   of ordered_reduce.h, as the Gloo and MPI communicators run them: bandwidth-optimal for any
//   member count and bitwise the results of shared memory, Gloo and MPI; n - 1 sockets each;
// - above, the trees of tcp_algorithms.h: O(log n) peers per member, results in the tree's
//   association.
// alltoallv is a pairwise exchange and sendrecv a direct connection at every size.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/ordered_reduce.h"
#include "collectives/tcp/tcp_algorithms.h"
#include "collectives/tcp/tcp_device.h"
#include "collectives/tcp/tcp_links.h"
#include "rendezvous/store.h"

namespace krug::collectives {

class TcpCommunicator : public Communicator {
 public:
  struct Options {
    std::chrono::milliseconds timeout{std::chrono::seconds(30)};
    // Sets of at most this many members reduce in rank order (see above); tests lower it to
    // run the trees on a few threads.
    int direct_max_members = 16;
    // Pipeline segment of the direct reduce-scatter (ordered_reduce.h).
    size_t segment_bytes = size_t{1} << 20;
  };

  // Member `rank` of the `size` members of communicator `name` (unique in the job, the same on
  // every member; its store namespace is a good one). `store`: that communicator's namespace.
  // Makes no connection: each is made on first use.
  TcpCommunicator(std::string name, int rank, int size, std::shared_ptr<rendezvous::Store> store,
                  std::shared_ptr<tcp::Device> device, const Options& options);

  int rank() const override { return links_.rank(); }
  int size() const override { return links_.size(); }
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  bool reduces_in_rank_order() const override { return direct_; }
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override;
  void barrier() override;
  void sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                size_t recv_bytes, int recv_from) override;
  const char* backend_name() const override { return "tcp"; }

  // Sockets this member holds now (for tests and the scale benchmark).
  size_t connections() const { return links_.connections(); }

 private:
  template <typename Call>
  void guarded(const char* what, Call&& call);
  void reduce_in_place(void* data, size_t count, DataType dtype, ReduceOp op);

  tcp::Links links_;
  bool direct_;
  OrderedReducer reducer_;  // the direct path's scratch
  tcp::Buffers buffers_;    // the trees' scratch
};

}  // namespace krug::collectives
