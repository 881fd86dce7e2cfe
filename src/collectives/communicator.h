// The data plane seen by the engine: collectives over raw buffers for one process set.
//
// A communicator knows ranks and bytes, never tensor names. Every call blocks until done or
// throws krug::Error (dead peer, timeout) naming the backend and what failed; after a throw the
// communicator must not be used again.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "krug/types.h"

namespace krug::collectives {

// One tensor of a fused allreduce: `count` elements read from `in` (nullptr: zeros, a joined
// rank's contribution) and written to `out` (nullptr: the result is not kept). `in` may equal
// `out`; parts must not otherwise overlap.
struct FusedPart {
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place over `count` elements. Each element is reduced in an order that depends only on the
  // members, never on its offset or the buffer's size, so results are bitwise identical however
  // tensors were fused into the buffer: rank order (r0 op r1 op ...) where
  // reduces_in_rank_order(), otherwise the backend's documented tree.
  virtual void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) = 0;
  virtual bool reduces_in_rank_order() const { return true; }
  // Whether allreduce_parts() works here: backends that read and write the tensors of a fused
  // allreduce in place implement it and save the fusion buffer's two copies.
  virtual bool has_allreduce_parts() const { return false; }
  // Allreduce of `parts` as if they were one buffer, their concatenation: inputs scaled by
  // `prescale`, results by `postscale` (reduce::scale each, so every element is bitwise what
  // scaling and reducing a fusion buffer gives). Only where has_allreduce_parts().
  virtual void allreduce_parts(const std::vector<FusedPart>& /*parts*/, DataType /*dtype*/,
                               ReduceOp /*op*/, double /*prescale*/, double /*postscale*/) {
    throw Error(std::string(backend_name()) + " communicator: no allreduce over separate parts; "
                "fuse them into one buffer");
  }
  // `in` holds sum(counts) elements; `out` receives the reduced counts[rank()] elements that
  // start at offset sum(counts[0..rank())). Same order of reduction as allreduce.
  virtual void reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                             DataType dtype, ReduceOp op) = 0;
  // `out` receives bytes_per_rank[r] bytes from each rank r, in rank order.
  virtual void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // send_bytes[r] bytes go to rank r (consecutive in `in`); recv_bytes[r] arrive from rank r.
  virtual void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                         const std::vector<size_t>& recv_bytes) = 0;
  virtual void barrier() = 0;

  // Point to point, between ranks of this set (indexes in [0, size())). Sends `send_bytes` from
  // `send_data` to rank `send_to` while receiving exactly `recv_bytes` into `recv_data` from rank
  // `recv_from`; returns when both are done. A peer of -1 skips that direction. Messages between
  // two ranks match in call order, per direction, independently of the collectives above (only
  // the two ranks involved take part), so the sender's byte count must equal the receiver's.
  // A zero byte count sends (or expects) nothing. Blocking, like MPI_Ssend: a send may not
  // complete before the peer posts the matching receive.
  virtual void sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                        size_t recv_bytes, int recv_from) = 0;
  void send(const void* data, size_t bytes, int peer) { sendrecv(data, bytes, peer, nullptr, 0, -1); }
  void recv(void* data, size_t bytes, int peer) { sendrecv(nullptr, 0, -1, data, bytes, peer); }

  virtual const char* backend_name() const = 0;

  // What a device data plane keeps for this communicator's ranks (engine/device_planes.cc: the
  // NCCL communicator or host staging made on first use). It lives and dies with this
  // communicator, so it never outlives its process set.
  std::shared_ptr<void> device_plane;

 protected:
  // The part of sendrecv that host-memory backends share: checks that each peer is a rank of
  // this set or -1 and that this rank is both peers or neither (throwing krug::Error that names
  // the backend and the exchange, before any message), then does an exchange with itself, a
  // copy. Returns true when that was the whole exchange.
  bool sendrecv_with_self(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                          size_t recv_bytes, int recv_from) const;
};

// "send of 8 bytes to rank 1 and receive of 8 bytes from rank 2": a sendrecv, for errors (a
// direction with peer -1 is left out).
std::string describe_sendrecv(size_t send_bytes, int send_to, size_t recv_bytes, int recv_from);

}  // namespace krug::collectives
