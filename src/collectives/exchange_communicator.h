// The communicators whose data-moving collectives are krug's own algorithms over point-to-point
// messages (ordered_reduce.h): Gloo's and MPI's. Allreduce and reducescatter are the
// rank-ordered reduce-scatter (and allgather), allgatherv and alltoallv direct exchanges,
// written once here; a backend supplies the messages of each call (its Exchange), its own
// broadcast, barrier and sendrecv, and how its errors read.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/ordered_reduce.h"

namespace krug::collectives {

class ExchangeCommunicator : public Communicator {
 public:
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) final;
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) final;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) final;
  void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) final;

 protected:
  // `segment_bytes`: bytes per peer per pipeline step of the reduce-scatter (OrderedReducer).
  explicit ExchangeCommunicator(size_t segment_bytes) : reducer_(segment_bytes) {}

  // What the messages of an exchange are for: backends that tag messages tag each apart.
  enum class Phase { kReduceScatter, kAllgather, kAlltoall };
  // The messages of one phase of one call.
  virtual std::unique_ptr<Exchange> exchange(Phase phase) = 0;
  // Runs `call`; a failure of the transport becomes krug::Error naming the backend, `what`
  // ("allreduce") and this rank.
  virtual void guarded(const char* what, const std::function<void()>& call) = 0;

 private:
  OrderedReducer reducer_;
};

}  // namespace krug::collectives
