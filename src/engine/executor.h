// The executor: the data movement of one decided response on a process set's communicator.
//
// It fuses the tensors of an allreduce into a buffer it reuses (or hands them to a data plane
// that reads and writes them in place), applies the scale factors, sizes the outputs of
// allgather, alltoall and reducescatter, and records the timeline's phases. It knows tensors
// only by their arguments: the engine finds them, waits for their ready events, and completes
// their handles. Unit-tested against a fake communicator (tests/unit/executor_test.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/communicator.h"
#include "engine/engine.h"
#include "engine/handle_state.h"
#include "krug/types.h"

namespace krug::observe {
class Timeline;
}

namespace krug::engine {

// One tensor of a fused allreduce.
struct FusedTensor {
  TensorArgs* args = nullptr;         // null: not on this rank (it joined); it contributes zeros
  size_t count = 0;                   // elements
  const std::string* name = nullptr;  // for the timeline; null when not known here
};

// What negotiation decided for a reduction.
struct Reduction {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t process_set = 0;  // for Adasum's messages
};

class Executor {
 public:
  // `timeline`: where phases are recorded, or null. Not owned; outlives the executor.
  explicit Executor(observe::Timeline* timeline = nullptr) : timeline_(timeline) {}

  // The tensors reduced over `comm` as one buffer, in order; kAverage divides by comm.size().
  void allreduce(collectives::Communicator& comm, const Reduction& r,
                 std::span<const FusedTensor> tensors);
  // Every rank's rows (rank_rows[i] from rank i) concatenated into the output.
  void allgather(collectives::Communicator& comm, DataType dtype,
                 std::span<const int64_t> rank_rows, TensorArgs& args, OpResult& out);
  // `shape`'s elements of the root's input into every rank's output.
  void broadcast(collectives::Communicator& comm, DataType dtype, std::span<const int64_t> shape,
                 int root, TensorArgs& args);
  // rank_rows[s * size + d]: the rows rank s sends rank d.
  void alltoall(collectives::Communicator& comm, DataType dtype, std::span<const int64_t> rank_rows,
                TensorArgs& args, OpResult& out);
  // The first dimension split as evenly as possible, lower ranks taking the extra rows.
  void reducescatter(collectives::Communicator& comm, const Reduction& r, TensorArgs& args,
                     OpResult& out);

 private:
  void begin(const std::string* name, std::string_view phase);
  void end(const std::string* name, std::string_view phase);
  void reduce_in_place(collectives::Communicator& comm, const Reduction& r, void* data,
                       size_t total);
  void allreduce_in_parts(collectives::Communicator& comm, const Reduction& r,
                          std::span<const FusedTensor> tensors);
  void allreduce_fused(collectives::Communicator& comm, const Reduction& r,
                       std::span<const FusedTensor> tensors, size_t total);
  uint8_t* fusion(size_t bytes);

  observe::Timeline* timeline_;
  // Reused from response to response: a step allocates nothing of the fused size (on glibc,
  // an allocation of a kilobyte or more first consolidates every small free chunk).
  std::vector<uint8_t> fusion_;
  std::vector<collectives::FusedPart> parts_;
  std::vector<size_t> counts_;  // per tensor: Adasum works tensor by tensor in a fused buffer
};

// Divides by the set's size for kAverage; the kernel then sums.
ReduceOp kernel_op(ReduceOp op);
double postscale_for(const Reduction& r, size_t set_size);

}  // namespace krug::engine
