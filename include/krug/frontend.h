// The frontend seam: the one interface every framework binding (the torch module, the LibTorch
// API, TensorFlow ops, a JAX FFI handler) uses to reach krug's core. A binding describes its
// tensors as views (dtype, shape, device, data pointer), enqueues a named collective on them and
// learns of the result through a pollable Handle, a completion callback, or both. Besides this
// header a binding uses only krug/krug.h's lifecycle, timeline and process-set functions (init,
// rank, start_timeline / stop_timeline, add_process_set, ...) and krug/types.h; nothing under
// src/. A binding's start_timeline / stop_timeline are those two calls: what they do (rank 0
// writes; a second start switches files; the errors) is defined there, once for every binding.
//
//   std::vector<int64_t> shape{1000};
//   krug::frontend::Op op{.type = krug::frontend::OpType::kAllreduce,
//                         .reduce_op = krug::ReduceOp::kAverage};
//   krug::frontend::TensorView in{.dtype = krug::DataType::kFloat32, .shape = shape,
//                                 .data = grad.data()};
//   auto handle = krug::frontend::enqueue("grad", op, in, grad.data());
//   handle.wait();  // or handle.poll(), or Callbacks::done
//
// Ownership: the caller keeps the input (and the output, for allreduce and broadcast) valid and
// untouched until the handle completes. Every rank of the process set must enqueue the same name
// with the same op, dtype and shape (allgather / alltoall: the first dimension may differ).
//
// Errors: an argument that can never work (an empty name, a grouped op without tensors, a
// device this build does not drive) throws InvalidArgument before anything is enqueued;
// what the engine refuses at submission (a name still in flight, a process set this rank is not
// in) completes the handle at once with code kRejected (Handle::rejected()); what negotiation
// refuses on every rank (mismatched shapes across ranks) completes it with kPrecondition; a
// failure while it runs (a dead peer, a timeout) with kFailed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "krug/krug.h"
#include "krug/types.h"

namespace krug::engine {
class Engine;
}

namespace krug::frontend {

// The collectives a binding enqueues. Values match the engine's wire format.
enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kJoin = 6,  // join() only
};
// "allreduce", "allgather", ... as messages spell them.
std::string_view op_name(OpType op);

enum class DeviceKind : uint8_t { kCPU = 0, kCUDA = 1 };
struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int32_t id = 0;  // the device's ordinal (CUDA); 0 on the CPU
};

// One tensor as the engine reads it: dense, row-major, borrowed for the operation's lifetime.
struct TensorView {
  DataType dtype = DataType::kFloat32;
  std::span<const int64_t> shape = {};
  Device device = {};
  const void* data = nullptr;
};

// What to do with the tensors. The fields an op does not use are ignored.
struct Op {
  OpType type = OpType::kAllreduce;
  ProcessSet process_set = kGlobalProcessSet;
  ReduceOp reduce_op = ReduceOp::kSum;   // allreduce, reducescatter (kAverage divides by size)
  double prescale = 1.0;                 // allreduce, reducescatter: applied to the input
  double postscale = 1.0;                // allreduce, reducescatter: applied to the result
  int32_t root = 0;                      // broadcast: rank index within the process set
  std::span<const int64_t> splits = {};  // alltoall: rows to each rank; empty = an even split
};
// An Op of `type` with the reduction, scale factors and process set of `options`.
Op reduction(OpType type, const ReduceOptions& options);

// Thrown before anything is enqueued when an argument can never work (krug/types.h).
using krug::InvalidArgument;

// How an operation ended.
struct Status {
  enum class Code : uint8_t {
    kOk = 0,
    kFailed = 1,    // the engine or a peer failed it; `message` says why and where it started
    kRejected = 2,  // refused at submission, nothing sent: this caller's arguments (a name in
                    // flight, a process set this rank is not in, rows alltoall cannot split)
    kPrecondition = 3,  // refused by negotiation on every rank: the ranks' requests disagree
                        // (shapes, dtypes, ops, roots) or the operation cannot run as asked
                        // (Adasum on integers); nothing sent, and the same calls would fail
                        // again (TensorFlow: FailedPreconditionError, as Horovod's)
  };
  Code code = Code::kOk;
  int rank = -1;            // the rank reporting it (the message names the rank it began on)
  std::string host = {};    // that rank's host
  int32_t process_set = 0;  // the operation's process set
  OpType op = OpType::kAllreduce;
  std::string tensor = {};   // the failing tensor's name, when the engine knows which one
  std::string message = {};  // the engine's message: what failed, on which rank, what to do

  bool ok() const { return code == Code::kOk; }
};

// Blocks until a tensor's data is written, for inputs a device produces asynchronously: a CUDA
// binding's implementation synchronizes on the event it recorded on the producing stream (that
// event, not the whole device). The engine calls wait() on one of its threads, once, before it
// reads any tensor of the operation. CPU bindings pass none: the data is ready at enqueue.
class ReadyEvent {
 public:
  virtual ~ReadyEvent() = default;
  virtual void wait() = 0;
};

// Memory for a result whose shape only negotiation decides (allgather, alltoall,
// reducescatter): called once per tensor, on one of krug's threads, with the tensor's index in
// the operation and the result's shape; returns room for that many elements of the input's
// dtype, valid until the handle completes (a framework allocates its own tensor here). An
// exception it throws fails the operation on every rank with its message. Without it the
// result lives in Handle::output().
using OutputAllocator = std::function<void*(size_t tensor, const Shape& shape)>;

struct Callbacks {
  OutputAllocator allocate = {};
  std::shared_ptr<ReadyEvent> ready = {};
  // Called exactly once when the operation ends, successfully or not, on the thread that ends
  // it (one of krug's, or the caller's when it has already failed at enqueue). What an
  // asynchronous kernel's `done` needs. It must not block on other krug operations.
  std::function<void(const Status&)> done = {};
};

// Completion of an enqueued operation: krug::Handle's poll / wait / results, and its status.
class Handle : public krug::Handle {
 public:
  Handle() = default;
  // Internal: made by enqueue().
  Handle(krug::Handle handle, const Op& op, std::shared_ptr<const engine::Engine> engine);

  // Code kOk until completion; then how the operation ended. Never blocks.
  Status status() const;
  // Whether the engine refused the operation at submission (Status::Code::kRejected): a
  // binding raises at the call then, as Horovod does, rather than at the wait. No allocation.
  bool rejected() const;

 private:
  OpType op_ = OpType::kAllreduce;
  int32_t process_set_ = 0;
  std::shared_ptr<const engine::Engine> engine_;  // the engine it ran on (rank, host)
};

// One tensor. `output`: allreduce and broadcast write there (it may equal input.data; broadcast
// requires it); the others ignore it and size their result through callbacks.allocate.
// An allreduce or broadcast without callbacks allocates nothing on the way to the engine beyond
// the handle (the engine copies name and shape into storage it reuses).
Handle enqueue(const std::string& name, const Op& op, const TensorView& input, void* output,
               const Callbacks& callbacks = {});

// A synchronous allreduce, broadcast or allgather of host memory, run at once on the caller's
// thread when it can skip negotiation: every rank is on this one host, this rank has nothing
// else in flight, and every rank makes the same call (name, dtype, shape, op, scale factors,
// root) within 4 x KRUG_BUSY_POLL_MICROSECONDS of the first; up to direct_lane_bytes(op.type)
// of input (the direct lane, docs/architecture.md). An allgather's `output` holds size() times
// the input (the same shape on every rank). Returns true when the result is in `output`; false
// when nothing ran: the caller then enqueues the call and waits, as it would have without this.
// Throws InvalidArgument as enqueue() does.
bool run_direct(const std::string& name, const Op& op, const TensorView& input, void* output);
// The most bytes of input run_direct() takes on this rank for `op`. An allreduce: this rank's
// share of KRUG_DIRECT_LANE_BYTES, which counts every rank's input together (512 KiB at 2 ranks
// by default). A broadcast, whose root alone posts its input, every rank's share (1 MiB), and an
// allgather this rank's; but where the ranks may read each other's memory, the lane reads a
// broadcast or allgather of 32 KiB or more in place, up to 8 MiB of result (the broadcast's
// tensor; all ranks' inputs of an allgather). 0 where this job has no direct lane (ranks on
// several hosts, no busy polling, KRUG_DIRECT_LANE_BYTES=0, or a share under 64 bytes). For a
// binding that must allocate an output only the lane needs (an allgather's), and would waste it
// otherwise.
size_t direct_lane_bytes(OpType op = OpType::kAllreduce);

// Several tensors as one request, named "<name>.0", "<name>.1", ...: negotiated together, run
// once all are ready on every rank, fused where they fit; one handle for all. `outputs`: one
// per input for allreduce (each may be its input), empty for the ops sized by negotiation.
Handle enqueue_group(const std::string& name, const Op& op, std::span<const TensorView> inputs,
                     std::span<void* const> outputs, const Callbacks& callbacks = {});

// For a rank that ran out of data; Handle::value() is the rank that joined last.
Handle join(const Callbacks& callbacks = {});

// The name of tensor `index` of a group called `name`: "<name>.<index>".
std::string group_member_name(const std::string& name, size_t index);

}  // namespace krug::frontend
