#include "collectives/exchange_communicator.h"

namespace krug::collectives {

void ExchangeCommunicator::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0 || size() == 1) return;
  guarded("allreduce", [&] {
    const auto reduce_scatter = exchange(Phase::kReduceScatter);
    const auto allgather = exchange(Phase::kAllgather);
    reducer_.allreduce(*reduce_scatter, *allgather, data, count, dtype, op);
  });
}

void ExchangeCommunicator::reducescatter(const void* in, void* out,
                                         const std::vector<size_t>& counts, DataType dtype,
                                         ReduceOp op) {
  guarded("reducescatter", [&] {
    reducer_.reduce_scatter(*exchange(Phase::kReduceScatter), in, out, counts, dtype, op);
  });
}

void ExchangeCommunicator::allgatherv(const void* in, void* out,
                                      const std::vector<size_t>& bytes_per_rank) {
  guarded("allgather",
          [&] { collectives::allgatherv(*exchange(Phase::kAllgather), in, out, bytes_per_rank); });
}

void ExchangeCommunicator::alltoallv(const void* in, const std::vector<size_t>& send_bytes,
                                     void* out, const std::vector<size_t>& recv_bytes) {
  if (size() == 1) {
    copy_own_part(0, in, send_bytes, out, recv_bytes);
    return;
  }
  guarded("alltoall", [&] {
    collectives::alltoallv(*exchange(Phase::kAlltoall), in, send_bytes, out, recv_bytes);
  });
}

}  // namespace krug::collectives
