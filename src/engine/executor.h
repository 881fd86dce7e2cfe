// The executor: the data movement of one decided response on a process set's communicator.
//
// It fuses the tensors of an allreduce into a buffer it reuses (or hands them to a data plane
// that reads and writes them in place), applies the scale factors, sizes the outputs of
// allgather, alltoall and reducescatter, and records the timeline's phases. It knows tensors
// only by their arguments: the engine finds them, waits for their ready events, and completes
// their handles. Unit-tested against a fake communicator (tests/unit/executor_test.cc).
//
// Device (CUDA) tensors take the same steps through device memory operations on krug's stream
// and a device data plane (device_planes.h: NCCL or host staging) instead of the process set's
// CPU communicator; each operation returns once krug's stream has finished it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/communicator.h"
#include "engine/device_planes.h"
#include "engine/handle_state.h"
#include "engine/memory.h"
#include "engine/tensor_args.h"
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
  bool on_device = false;   // the tensors are CUDA device memory (on every rank of the set)
};

class Executor {
 public:
  // `timeline`: where phases are recorded, or null. Not owned; outlives the executor.
  // `device`: for device tensors (their planes are made on first use).
  explicit Executor(observe::Timeline* timeline = nullptr, const DeviceOptions& device = {});
  ~Executor();
  Executor(Executor&&) noexcept;
  Executor& operator=(Executor&&) noexcept;

  // Where phases are recorded from now on, or null (a timeline started or stopped at run time).
  void set_timeline(observe::Timeline* timeline) { timeline_ = timeline; }

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
  // Where an operation runs: host memory and the set's CPU communicator, or a device's memory
  // operations and its data plane. `device` -1: host memory.
  struct Target {
    Memory* memory;
    collectives::Communicator* comm;
    collectives::Communicator* cpu;  // the set's CPU communicator (Adasum runs there)
    int device;
    std::shared_ptr<void> current;  // the device made current for the operation
  };
  Target target(collectives::Communicator& cpu, int device, bool nccl_can = true);
  // Always a device's: `device` -1 is the one this rank used last (a joined rank).
  Target device_target(collectives::Communicator& cpu, int device, bool nccl_can);
  // Waits for a device operation's last copies (nothing for host memory).
  void finish(const Target& t, std::string_view op);
  DevicePlanes& devices();

  void begin(const std::string* name, std::string_view phase);
  void end(const std::string* name, std::string_view phase);
  void reduce_in_place(const Target& t, const Reduction& r, void* data, size_t total);
  void allreduce_in_parts(collectives::Communicator& comm, const Reduction& r,
                          std::span<const FusedTensor> tensors);
  void allreduce_fused(const Target& t, const Reduction& r, std::span<const FusedTensor> tensors,
                       size_t total);

  observe::Timeline* timeline_;
  HostMemory host_;
  DeviceOptions device_options_;
  std::unique_ptr<DevicePlanes> devices_;  // made for the first device tensor
  std::vector<collectives::FusedPart> parts_;
  std::vector<size_t> counts_;  // per tensor: Adasum works tensor by tensor in a fused buffer
};

// Divides by the set's size for kAverage; the kernel then sums.
ReduceOp kernel_op(ReduceOp op);
double postscale_for(const Reduction& r, size_t set_size);

}  // namespace krug::engine
