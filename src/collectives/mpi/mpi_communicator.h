// Communicator over an MPI communicator (one per process set, from MPI_Comm_create_group).
//
// Determinism first: allreduce and reducescatter are krug's rank-ordered reduce-scatter and
// allgather (collectives/ordered_reduce.h, shared with the Gloo backend) on MPI point-to-point
// messages (mpi_exchange.h), reduced with krug's kernels.
// MPI_Allreduce would not do: MPI does not promise an order of reduction, and Open MPI picks its
// algorithm (and so the order in which each element's contributions meet) by message size, so
// the same tensor would round differently depending on what it was fused with; it also has no
// float16 / bfloat16 types. The other collectives move bytes, where order cannot matter:
// broadcast and barrier are MPI's own (MPI_Ibcast, MPI_Ibarrier); allgatherv and alltoallv are
// direct exchanges (MPI's take int counts and displacements, so they would cap a fused buffer at
// 2 GiB). Everything is nonblocking and waited on with a deadline (mpi_requests.h).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi/mpi_backend.h"
#include "collectives/mpi/mpi_exchange.h"
#include "collectives/ordered_reduce.h"

namespace krug::collectives::mpi {

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor); sets MPI_ERRORS_RETURN on it.
  MpiCommunicator(MPI_Comm comm, const Options& options);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override;
  void barrier() override;
  void sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                size_t recv_bytes, int recv_from) override;
  const char* backend_name() const override { return "mpi"; }

 private:
  // The messages of one ordered collective (collectives/ordered_reduce.h) on this communicator.
  MpiExchange exchange(int tag, const char* what) const;
  template <typename F>
  void guarded(const char* what, F&& f);

  MPI_Comm comm_;
  Options options_;
  int rank_ = 0;
  int size_ = 1;
  OrderedReducer reducer_;
};

}  // namespace krug::collectives::mpi
