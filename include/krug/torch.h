// krug's LibTorch C++ API: collectives on torch::Tensor and a data-parallel optimizer.
//
// The C++ counterpart of Horovod's horovod.torch. Start the program with krugrun, call
// krug::init(), make every rank start from the same weights, and wrap the optimizer:
//
//   krug::init();
//   auto model = std::make_shared<Net>();
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   krug::torch::broadcast_parameters(*model, /*root_rank=*/0);
//   krug::torch::DistributedOptimizer opt(sgd, model->named_parameters());
//   for (auto& batch : my_shard_of_the_data) {
//     opt.zero_grad();
//     loss_fn(model->forward(batch.data), batch.target).backward();  // allreduces start here
//     opt.step();  // waits for the averaged gradients, then steps the wrapped optimizer
//   }
//   krug::shutdown();
//
// Tensors live on the CPU, or on a CUDA device in a build with CUDA (docs/gpu.md), and may
// have any of krug's data types: uint8, int8, int16, int32, int64, float16, bfloat16, float32,
// float64, bool. Non-contiguous inputs are copied to a contiguous buffer first. Like every
// krug operation, each call has a name that identifies it across ranks: every rank of the
// process set must make the same call with the same name, dtype and shape (allgather: the first
// dimension may differ). An empty name makes one up from a counter per operation and process set
// ("allreduce.noname.3", krug::unnamed_op_name in krug/binding_rules.h), which is right only
// when every rank makes its unnamed calls in the same order; the counters start again at every
// init(), on every rank (so survivors and new workers agree after an elastic reset). Failures
// (mismatched shapes, a dead peer, a timeout) throw krug::Error on every rank involved, from
// the synchronous call or from Handle::wait().
//
// Link with the krug_torch library (built with -DKRUG_BUILD_TORCH=ON).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "krug/elastic.h"
#include "krug/krug.h"

namespace krug::torch {

// An allreduce in flight. wait() returns the reduced tensor (a new tensor for allreduce_async,
// for the in-place forms a tensor sharing the input's storage) or throws krug::Error.
class TensorHandle {
 public:
  TensorHandle() = default;

  // True once finished, successfully or not. Never blocks.
  bool poll() const;
  // Blocks until finished; returns the result or throws krug::Error with the failure message.
  // May be called more than once; later calls return the same tensor.
  ::torch::Tensor wait() const;
  // Empty until finished and on success, else what went wrong.
  std::string error() const;
  bool valid() const { return static_cast<bool>(state_); }

  struct State;  // internal

 private:
  friend TensorHandle make_tensor_handle(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

// ---- Allreduce. options.op: kAverage (default; divides by the process set's size), kSum, kMin,
// kMax, kProduct; prescale/postscale factors multiply the input / the result.

// Returns a new tensor with the reduction over ranks; `tensor` is left unchanged.
::torch::Tensor allreduce(const ::torch::Tensor& tensor, const std::string& name = "",
                          const ReduceOptions& options = {});
// Reduces in place and returns `tensor`.
::torch::Tensor& allreduce_(::torch::Tensor& tensor, const std::string& name = "",
                            const ReduceOptions& options = {});
// Starts the reduction and returns at once; wait() gives a new tensor with the result. Leave
// `tensor` unchanged until the handle completes (it is read while the operation runs).
TensorHandle allreduce_async(const ::torch::Tensor& tensor, const std::string& name = "",
                             const ReduceOptions& options = {});
// In place: wait() returns `tensor` holding the result.
TensorHandle allreduce_async_(::torch::Tensor& tensor, const std::string& name = "",
                              const ReduceOptions& options = {});

// ---- Allgather: every rank's tensor concatenated along the first dimension (in rank order of
// the process set); the first dimension may differ between ranks, the others may not.
::torch::Tensor allgather(const ::torch::Tensor& tensor, const std::string& name = "",
                          ProcessSet process_set = kGlobalProcessSet);
TensorHandle allgather_async(const ::torch::Tensor& tensor, const std::string& name = "",
                             ProcessSet process_set = kGlobalProcessSet);

// ---- Broadcast from `root_rank` (its index within the process set).

// Returns a new tensor with root's values; `tensor` is left unchanged.
::torch::Tensor broadcast(const ::torch::Tensor& tensor, int root_rank, const std::string& name = "",
                          ProcessSet process_set = kGlobalProcessSet);
// In place (also on tensors that require grad: runs under torch::NoGradGuard). Returns `tensor`.
::torch::Tensor& broadcast_(::torch::Tensor& tensor, int root_rank, const std::string& name = "",
                            ProcessSet process_set = kGlobalProcessSet);
TensorHandle broadcast_async_(::torch::Tensor& tensor, int root_rank,
                              const std::string& name = "",
                              ProcessSet process_set = kGlobalProcessSet);

// ---- Model state.

// Overwrites every tensor in place with root_rank's values (all broadcasts run concurrently).
// Operation names are "broadcast_parameters.<i>": every rank must pass the same list.
void broadcast_parameters(const std::vector<::torch::Tensor>& tensors, int root_rank = 0);
// Same for named tensors (module.named_parameters()); names are "broadcast_parameters.<name>".
void broadcast_parameters(const ::torch::OrderedDict<std::string, ::torch::Tensor>& named,
                          int root_rank = 0);
// Every parameter and buffer of the module (recursively), by their dotted names.
void broadcast_parameters(::torch::nn::Module& module, int root_rank = 0);

// ---- Data-parallel optimizer.
//
// Wraps an optimizer built on the same parameters. During backward, each parameter's gradient is
// allreduced in the background as soon as autograd has produced it, so communication overlaps
// the rest of backward; step() waits for the results, writes them into the parameters' .grad and
// steps the wrapped optimizer.
//
// backward_passes_per_step = N accumulates the gradients of N backward passes locally (in .grad,
// as plain LibTorch does) and allreduces during the N-th; call step() after every N-th backward.
// With op kAverage (the default) the result is the average over ranks *and* passes, i.e. the
// gradient of the mean loss over the combined batch of every rank and every pass; kSum sums both.
//
// Operation names are "<name_prefix><parameter name>", the prefix "DistributedOptimizer." unless
// given: every rank must pass the same named parameters, in any order. Parameters that got no
// gradient in a step (unused in the forward pass) are reduced as zeros, so ranks never wait on
// each other. Errors of the allreduces (mismatched shapes between ranks, say) throw krug::Error
// from step() or synchronize(). The object registers hooks on the parameters and removes them
// when destroyed;
// it cannot be copied or moved.
class DistributedOptimizer {
 public:
  DistributedOptimizer(::torch::optim::Optimizer& optimizer,
                       const ::torch::OrderedDict<std::string, ::torch::Tensor>& named_parameters,
                       int backward_passes_per_step = 1, ReduceOp op = ReduceOp::kAverage,
                       ProcessSet process_set = kGlobalProcessSet, const std::string& name_prefix = "");
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Waits for every gradient allreduce (starting those of parameters whose hooks did not fire
  // N times) and writes the results into .grad. step() calls it unless called since the last
  // backward; call it yourself to clip or inspect the reduced gradients before step().
  void synchronize();
  // synchronize(), then the wrapped optimizer's step().
  void step();
  // The wrapped optimizer's zero_grad(). Throws krug::Error while allreduces are in flight (a
  // backward without its step()): call synchronize() or step() first.
  void zero_grad();

  ::torch::optim::Optimizer& optimizer() { return optimizer_; }
  int backward_passes_per_step() const { return passes_per_step_; }

 private:
  struct Param;
  void on_gradient(size_t index, const ::torch::Tensor& grad);
  void start_allreduce_locked(Param& p, const ::torch::Tensor& accumulated);

  ::torch::optim::Optimizer& optimizer_;
  const int passes_per_step_;
  const ReduceOp op_;
  const ProcessSet process_set_;
  std::mutex mu_;  // hooks may run on autograd's threads
  std::vector<std::unique_ptr<Param>> params_;
  bool synchronized_ = false;  // synchronize() ran since the last gradient arrived
};

}  // namespace krug::torch

namespace krug::torch::elastic {

// The elastic training state of a LibTorch model and its optimizer (include/krug/elastic.h):
//
//   krug::init();
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   krug::torch::DistributedOptimizer opt(sgd, model->named_parameters());
//   krug::torch::elastic::TorchState state(*model, sgd);
//   state.values["epoch"] = 0;
//   krug::elastic::run(state, [&] {
//     for (; state.values["epoch"] < epochs; ++state.values["epoch"]) {
//       ... train one epoch, calling state.commit() at consistent points ...
//     }
//   });
//
// What it keeps: every parameter and buffer of the model (recursively), the optimizer's
// per-parameter state (momentum buffers, Adam's moments and step counts, ...) and the options of
// each parameter group (learning rate, ...), the user's `values`, and commits(). The model and
// the optimizer are held by reference and must outlive the state; their parameters must stay the
// same tensors (restore() and sync() write into them in place, so a DistributedOptimizer built
// on them stays valid). Its saved copies stay on each tensor's own device.
class TorchState : public krug::elastic::State {
 public:
  // Saves at once, so restore() is valid from the start.
  TorchState(::torch::nn::Module& model, ::torch::optim::Optimizer& optimizer);

  // Counters of the user's loop (epoch, batch, ...), saved, restored and synced with the rest.
  std::map<std::string, int64_t> values;

  // Deep copies of the parameters, the buffers, the optimizer's state and options, `values` and
  // the commit count. Rank-local.
  void save() override;
  // Copies the last save() back in place. Rank-local. Throws krug::Error when the model's
  // parameters or buffers no longer match the saved ones (names, shapes, dtypes).
  void restore() override;
  // Collective: every rank's parameters, buffers, optimizer state and options and `values`
  // become rank 0's (broadcast_parameters, then the rest serialized on rank 0 and broadcast as
  // bytes), then save().
  void sync() override;

 private:
  ::torch::nn::Module& model_;
  ::torch::optim::Optimizer& optimizer_;
  std::vector<std::pair<std::string, ::torch::Tensor>> saved_tensors_;  // parameters, buffers
  std::string saved_rest_;  // the optimizer and `values`, serialized
};

}  // namespace krug::torch::elastic
