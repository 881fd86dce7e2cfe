// Communicator over an MPI communicator (one per process set, from MPI_Comm_create_group).
//
// Determinism first: allreduce and reducescatter are krug's rank-ordered reduce-scatter and
// allgather (collectives/exchange_communicator.h, shared with the Gloo backend) on MPI
// point-to-point messages (mpi_exchange.h), reduced with krug's kernels.
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

#include "collectives/exchange_communicator.h"
#include "collectives/mpi/mpi_backend.h"

namespace krug::collectives::mpi {

class MpiCommunicator : public ExchangeCommunicator {
 public:
  // Takes ownership of `comm` (freed in the destructor); sets MPI_ERRORS_RETURN on it.
  MpiCommunicator(MPI_Comm comm, const Options& options);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  void sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                size_t recv_bytes, int recv_from) override;
  const char* backend_name() const override { return "mpi"; }

 protected:
  // The messages of one phase, over MPI point-to-point messages (mpi_exchange.h).
  std::unique_ptr<Exchange> exchange(Phase phase) override;
  void guarded(const char* what, const std::function<void()>& call) override;

 private:
  MPI_Comm comm_;
  Options options_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace krug::collectives::mpi
