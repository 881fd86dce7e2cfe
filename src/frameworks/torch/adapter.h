// The torch adapter: krug's named collectives on at::Tensor, shared by the Python frontend
// (python/krug/torch, through the pybind11 module in python_module.cc) and the LibTorch C++ API
// (include/krug/torch.h).
//
// Each *_async function validates the tensors locally (dtype, device), describes them as views
// and enqueues them through the frontend seam (krug/frontend.h), the only part of the core a
// binding uses; it returns a TorchHandle that owns everything the operation needs while it runs
// (the input, contiguous copies, the output tensors). Outputs whose size is only known after
// negotiation (allgather, alltoall, reducescatter) are allocated as at::Tensor by the seam's
// output allocator, with the input's dtype and device, so results never go through an
// intermediate byte buffer.
//
// CPU and CUDA tensors are supported (CUDA when libkrug was built with CUDA; the binding itself
// uses only c10's device-generic API, so it builds against a torch without CUDA). For a CUDA
// tensor the binding records an event on the current stream of its device at enqueue, which
// the engine waits for before it reads the tensor; the engine's own stream is ordered with the
// default stream, and a handle completes only once krug's work on the device is done. Errors
// found before enqueueing (a dtype krug cannot reduce, an unsupported device, input and output
// on different devices, a wrong output shape) throw UnsupportedTensor; errors found by
// the engine (mismatched shapes across ranks, a dead peer, a reused name) complete the handle,
// and TorchHandle::wait() throws krug::Error with the engine's message.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "krug/frontend.h"
#include "krug/krug.h"
#include "krug/types.h"

namespace krug::torch_adapter {

// A tensor krug cannot take (unsupported dtype or device, wrong output shape). Thrown before
// anything is enqueued; the Python frontend raises it (and the seam's InvalidArgument, of which
// it is one) as ValueError.
class UnsupportedTensor : public frontend::InvalidArgument {
 public:
  using frontend::InvalidArgument::InvalidArgument;
};

// torch dtype <-> krug::DataType. uint8, int8, int16, int32, int64, float16, bfloat16, float32,
// float64 and bool are supported; any other dtype throws UnsupportedTensor naming it.
DataType to_krug_dtype(at::ScalarType type);
at::ScalarType to_torch_dtype(DataType type);
// "torch.float32", as Python prints it.
std::string torch_dtype_name(at::ScalarType type);

// Throws UnsupportedTensor unless `t` is a defined dense CPU or CUDA tensor of a supported dtype.
// `what` names the operation and tensor for the message ("allreduce 'grad'").
void check_tensor(const at::Tensor& t, const std::string& what);

Shape shape_of(const at::Tensor& t);

// Completion of one (possibly grouped) operation on tensors. Thread-safe.
class TorchHandle {
 public:
  TorchHandle();
  // Waits for a still-running operation so that the memory it writes stays alive.
  ~TorchHandle();
  TorchHandle(const TorchHandle&) = delete;
  TorchHandle& operator=(const TorchHandle&) = delete;

  // True once the operation finished, successfully or not. Never blocks.
  bool poll() const;
  // Blocks until finished; throws krug::Error with the failure message. On success copies the
  // results into in-place targets that were not contiguous (once). Does not touch Python: call
  // it with the GIL released.
  void wait();
  // Blocks at most `timeout_seconds`; returns poll().
  bool wait_for(std::chrono::nanoseconds timeout) const;
  // After completion: empty on success, else what went wrong.
  std::string error() const;

  // After wait(): the result tensors, one per tensor of the operation (for in-place ops the
  // tensors the caller passed in).
  std::vector<at::Tensor> outputs() const;
  at::Tensor output(size_t i = 0) const;
  // alltoall: rows received from each rank of the process set.
  std::vector<int64_t> received_splits() const;
  // join: the rank that joined last.
  int64_t value() const;

  // Internal, used by the enqueue functions.
  struct Slot {
    at::Tensor target;  // what the caller gets (in place: the caller's tensor)
    at::Tensor work;    // the contiguous memory the engine reads/writes (may be `target`)
    at::Tensor input;   // contiguous input kept alive while the op runs
  };
  struct Shared;  // outputs written by the engine's allocate_output callbacks
  explicit TorchHandle(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
  frontend::Handle handle_;

 private:
  void finalize();
  mutable std::mutex mu_;
  bool finalized_ = false;
};

using HandlePtr = std::shared_ptr<TorchHandle>;

// output = reduction of input over the ranks of options.process_set. `output` may be the same
// tensor as `input` (in place); it must have the input's dtype and shape. Either may be
// non-contiguous (a contiguous copy is reduced and copied back on wait()).
HandlePtr allreduce_async(const std::string& name, const at::Tensor& input,
                          const at::Tensor& output, const ReduceOptions& options = {});
// The same allreduce run at once on the caller's thread when the direct lane takes it
// (frontend::run_direct): true when the result is in `output`; false when nothing ran, and the
// caller then runs allreduce_async. Contiguous CPU tensors of one dtype and shape only; for any
// other it is false (allreduce_async then checks them and says what is wrong).
bool allreduce_direct(const std::string& name, const at::Tensor& input, const at::Tensor& output,
                      const ReduceOptions& options);
// The same for an in-place broadcast on the global set from rank `root`, and for an allgather
// on the global set into `output` of size() x the input's rows (the lane runs it only where
// every rank's shape is the same).
bool broadcast_direct(const std::string& name, const at::Tensor& tensor, int root);
bool allgather_direct(const std::string& name, const at::Tensor& input, const at::Tensor& output);
// The output of a direct call whose caller brings none (hvd.allreduce, hvd.allgather): empty and
// contiguous, `rows` times the input's first dimension (1 for an allreduce, size() for an
// allgather). nullopt for a tensor the lane would not take, so that a larger one, which takes
// the engine, is not allocated twice.
std::optional<at::Tensor> direct_output(const at::Tensor& input, int64_t rows);
// Out of place into a newly allocated tensor (outputs()[0]).
HandlePtr allreduce_async(const std::string& name, const at::Tensor& input,
                          const ReduceOptions& options = {});
// One request for all tensors (named "<name>.0", "<name>.1", ...); `outputs` empty = allocate
// new tensors, else one output per input (each may be its input: in place).
HandlePtr grouped_allreduce_async(const std::string& name, const std::vector<at::Tensor>& inputs,
                                  const std::vector<at::Tensor>& outputs,
                                  const ReduceOptions& options = {});

// Concatenation of every rank's tensor along the first dimension (which may differ per rank).
HandlePtr allgather_async(const std::string& name, const at::Tensor& input,
                          ProcessSet process_set = kGlobalProcessSet);
HandlePtr grouped_allgather_async(const std::string& name, const std::vector<at::Tensor>& inputs,
                                  ProcessSet process_set = kGlobalProcessSet);

// In place: `tensor` of `root` (rank index within the process set) is copied to every rank.
HandlePtr broadcast_async(const std::string& name, const at::Tensor& tensor, int root,
                          ProcessSet process_set = kGlobalProcessSet);

// Sends splits[r] rows to rank r (empty = an even split); the output holds the rows received,
// received_splits() how many came from each rank.
HandlePtr alltoall_async(const std::string& name, const at::Tensor& input,
                         const std::vector<int64_t>& splits = {},
                         ProcessSet process_set = kGlobalProcessSet);

// Reduction over ranks; rank r keeps its share of the first dimension (split as evenly as
// possible, lower ranks get the extra rows).
HandlePtr reducescatter_async(const std::string& name, const at::Tensor& input,
                              const ReduceOptions& options = {});
HandlePtr grouped_reducescatter_async(const std::string& name,
                                      const std::vector<at::Tensor>& inputs,
                                      const ReduceOptions& options = {});

// join: value() is the rank that joined last.
HandlePtr join_async();

// True when this build's core has ReduceOp::kAdasum; adasum_op() is its value (-1 without).
bool adasum_available();
int adasum_op();

}  // namespace krug::torch_adapter
