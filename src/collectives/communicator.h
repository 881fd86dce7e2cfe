// The data plane seen by the engine: collectives over raw buffers for one process set.
//
// A communicator knows ranks and bytes, never tensor names. Every call blocks until done or
// throws krug::Error (dead peer, timeout) naming the backend and what failed; after a throw the
// communicator must not be used again.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "krug/types.h"

namespace krug::collectives {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place over `count` elements. Each element is reduced in rank order (r0 op r1 op ...), so
  // results are bitwise identical however tensors were fused into the buffer.
  virtual void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) = 0;
  // `in` holds sum(counts) elements; `out` receives the reduced counts[rank()] elements that
  // start at offset sum(counts[0..rank())). Same rank-ordered reduction as allreduce.
  virtual void reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                             DataType dtype, ReduceOp op) = 0;
  // `out` receives bytes_per_rank[r] bytes from each rank r, in rank order.
  virtual void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // send_bytes[r] bytes go to rank r (consecutive in `in`); recv_bytes[r] arrive from rank r.
  virtual void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                         const std::vector<size_t>& recv_bytes) = 0;
  virtual void barrier() = 0;
  virtual const char* backend_name() const = 0;
};

}  // namespace krug::collectives
