// krug's LibTorch C++ API (include/krug/torch.h) on top of the shared torch adapter.
#include "krug/torch.h"

#include <fmt/format.h>

#include <unordered_set>
#include <utility>

#include "frameworks/torch/adapter.h"
#include "krug/binding_rules.h"

namespace krug::torch {

namespace adapter = torch_adapter;
using at::Tensor;

// ---- TensorHandle: the adapter's handle; wait() returns its (first) output.

struct TensorHandle::State {
  adapter::HandlePtr handle;
};

TensorHandle make_tensor_handle(std::shared_ptr<TensorHandle::State> state) {
  TensorHandle h;
  h.state_ = std::move(state);
  return h;
}

namespace {

const char* kInvalidHandle = "krug::torch::TensorHandle: used before being assigned an operation";

TensorHandle wrap(adapter::HandlePtr handle) {
  auto state = std::make_shared<TensorHandle::State>();
  state->handle = std::move(handle);
  return make_tensor_handle(std::move(state));
}

}  // namespace

bool TensorHandle::poll() const {
  if (!state_) throw Error(kInvalidHandle);
  return state_->handle->poll();
}

std::string TensorHandle::error() const {
  if (!state_) throw Error(kInvalidHandle);
  return state_->handle->poll() ? state_->handle->error() : std::string();
}

Tensor TensorHandle::wait() const {
  if (!state_) throw Error(kInvalidHandle);
  state_->handle->wait();  // throws krug::Error on failure; idempotent
  return state_->handle->output(0);
}

// ---- Allreduce

TensorHandle allreduce_async(const Tensor& tensor, const std::string& name,
                             const ReduceOptions& options) {
  return wrap(adapter::allreduce_async(name_or_unnamed(name, "allreduce", options.process_set),
                                       tensor.detach(), options));
}

TensorHandle allreduce_async_(Tensor& tensor, const std::string& name,
                              const ReduceOptions& options) {
  // detach(): a view sharing the storage, so autograd does not see the write.
  Tensor t = tensor.detach();
  return wrap(adapter::allreduce_async(name_or_unnamed(name, "allreduce", options.process_set), t,
                                       t, options));
}

Tensor allreduce(const Tensor& tensor, const std::string& name, const ReduceOptions& options) {
  return allreduce_async(tensor, name, options).wait();
}

Tensor& allreduce_(Tensor& tensor, const std::string& name, const ReduceOptions& options) {
  allreduce_async_(tensor, name, options).wait();
  return tensor;
}

// ---- Allgather

TensorHandle allgather_async(const Tensor& tensor, const std::string& name, ProcessSet process_set) {
  return wrap(adapter::allgather_async(name_or_unnamed(name, "allgather", process_set),
                                       tensor.detach(), process_set));
}

Tensor allgather(const Tensor& tensor, const std::string& name, ProcessSet process_set) {
  return allgather_async(tensor, name, process_set).wait();
}

// ---- Broadcast

TensorHandle broadcast_async_(Tensor& tensor, int root_rank, const std::string& name,
                              ProcessSet process_set) {
  return wrap(adapter::broadcast_async(name_or_unnamed(name, "broadcast", process_set),
                                       tensor.detach(), root_rank, process_set));
}

Tensor broadcast(const Tensor& tensor, int root_rank, const std::string& name,
                 ProcessSet process_set) {
  Tensor copy = tensor.detach().clone(at::MemoryFormat::Contiguous);
  broadcast_async_(copy, root_rank, name, process_set).wait();
  return copy;
}

Tensor& broadcast_(Tensor& tensor, int root_rank, const std::string& name, ProcessSet process_set) {
  broadcast_async_(tensor, root_rank, name, process_set).wait();
  return tensor;
}

// ---- broadcast_parameters

namespace {

// Starts every broadcast, then waits for all of them (so none is left in flight when one
// fails) and throws the first error.
void broadcast_all(const std::vector<std::pair<std::string, Tensor>>& named, int root_rank) {
  ::torch::NoGradGuard no_grad;
  std::vector<TensorHandle> handles;
  handles.reserve(named.size());
  for (const auto& [name, tensor] : named) {
    Tensor t = tensor;
    handles.push_back(broadcast_async_(t, root_rank, name));
  }
  std::string first_error;
  for (auto& h : handles) {
    try {
      h.wait();
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty()) throw Error("broadcast_parameters: " + first_error);
}

}  // namespace

void broadcast_parameters(const std::vector<Tensor>& tensors, int root_rank) {
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t i = 0; i < tensors.size(); ++i)
    named.emplace_back(fmt::format("broadcast_parameters.{}", i), tensors[i]);
  broadcast_all(named, root_rank);
}

void broadcast_parameters(const ::torch::OrderedDict<std::string, Tensor>& tensors, int root_rank) {
  std::vector<std::pair<std::string, Tensor>> named;
  for (const auto& item : tensors)
    named.emplace_back("broadcast_parameters." + item.key(), item.value());
  broadcast_all(named, root_rank);
}

void broadcast_parameters(::torch::nn::Module& module, int root_rank) {
  std::vector<std::pair<std::string, Tensor>> named;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    named.emplace_back("broadcast_parameters.param." + item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    if (item.value().defined())
      named.emplace_back("broadcast_parameters.buffer." + item.key(), item.value());
  broadcast_all(named, root_rank);
}

// ---- DistributedOptimizer
//
// How gradients get reduced during backward.
//
// Each parameter gets a tensor hook (Tensor::register_hook). For a leaf tensor autograd calls it
// once per backward pass with the parameter's complete gradient of that pass (contributions of
// every use in the graph already summed), *before* AccumulateGrad adds that gradient into .grad.
// So on the N-th pass (N = backward_passes_per_step) the hook computes what .grad is about to
// hold, `grad + .grad` (or a copy of `grad` when .grad is undefined), into a buffer of our own
// and starts an asynchronous allreduce of that buffer right away: communication overlaps the rest
// of backward, which the engine fuses with the neighbouring parameters' gradients. Autograd then
// accumulates .grad as usual; synchronize() overwrites it with the reduced buffer.
//
// Alternatives considered: a post hook on the parameter's AccumulateGrad node (what Horovod's
// Python optimizer does) fires after accumulation and would save one add per parameter, and a
// final callback queued on the autograd engine would see every .grad complete; both are internal
// LibTorch APIs (torch::autograd::impl, Engine::queue_callback), and the callback would start
// every allreduce only once backward ended, losing the overlap. The extra add is cheap next to
// the allreduce itself.
//
// Parameters whose hook did not fire N times by synchronize() (unused in the forward pass, or
// step() called early) are reduced then from their current .grad (zeros when undefined), so the
// set of names is the same on every rank and nobody waits forever.

namespace {
// Waits for completion, success or not (the caller reads error()).
void wait_quietly(const adapter::HandlePtr& h) {
  try {
    h->wait();
  } catch (const Error&) {
  }
}
}  // namespace

struct DistributedOptimizer::Param {
  std::string op_name;
  Tensor tensor;
  unsigned hook = 0;
  int passes = 0;       // backward passes since the last step
  bool pending = false; // an allreduce of `buffer` is in flight (or done, not yet collected)
  Tensor buffer;        // the accumulated gradient, reduced in place
  adapter::HandlePtr handle;
};

DistributedOptimizer::DistributedOptimizer(
    ::torch::optim::Optimizer& optimizer,
    const ::torch::OrderedDict<std::string, Tensor>& named_parameters, int backward_passes_per_step,
    ReduceOp op, ProcessSet process_set, const std::string& name_prefix)
    : optimizer_(optimizer),
      passes_per_step_(backward_passes_per_step),
      op_(op),
      process_set_(process_set) {
  if (backward_passes_per_step < 1)
    throw Error(fmt::format("DistributedOptimizer: backward_passes_per_step must be >= 1, got {}",
                            backward_passes_per_step));
  const std::string prefix = name_prefix.empty() ? "DistributedOptimizer." : name_prefix;
  std::unordered_set<const void*> seen;
  for (const auto& item : named_parameters) {
    const Tensor& t = item.value();
    if (!t.defined() || !t.requires_grad()) continue;
    adapter::check_tensor(t, "DistributedOptimizer parameter '" + item.key() + "'");
    if (!seen.insert(t.unsafeGetTensorImpl()).second)
      throw Error("DistributedOptimizer: parameter '" + item.key() +
                  "' is the same tensor as an earlier one; pass each parameter once");
    auto p = std::make_unique<Param>();
    p->op_name = prefix + item.key();
    p->tensor = t;
    params_.push_back(std::move(p));
  }
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i]->hook =
        params_[i]->tensor.register_hook([this, i](const Tensor& grad) { on_gradient(i, grad); });
}

DistributedOptimizer::~DistributedOptimizer() {
  std::lock_guard lock(mu_);
  for (auto& p : params_) {
    p->tensor.remove_hook(p->hook);
    // The engine may still read or write the buffer: wait (errors are of no use here).
    if (p->pending) wait_quietly(p->handle);
  }
}

void DistributedOptimizer::start_allreduce_locked(Param& p, const Tensor& accumulated) {
  ReduceOptions options;
  options.op = op_;
  options.process_set = process_set_;
  // Average over passes as well as ranks: the gradient of the mean loss over the whole batch.
  if (op_ == ReduceOp::kAverage) options.prescale_factor = 1.0 / passes_per_step_;
  p.buffer = accumulated.is_contiguous() ? accumulated : accumulated.contiguous();
  p.handle = adapter::allreduce_async(p.op_name, p.buffer, p.buffer, options);
  p.pending = true;
}

void DistributedOptimizer::on_gradient(size_t index, const Tensor& grad) {
  ::torch::NoGradGuard no_grad;
  std::lock_guard lock(mu_);
  Param& p = *params_[index];
  synchronized_ = false;
  if (p.passes >= passes_per_step_)
    throw Error(fmt::format(
        "DistributedOptimizer: the gradient of '{}' was computed more than "
        "backward_passes_per_step ({}) times before step(); call step() or synchronize() after "
        "every {} backward pass(es)",
        p.op_name, passes_per_step_, passes_per_step_));
  if (++p.passes < passes_per_step_) return;
  const Tensor& acc = p.tensor.grad();
  // .grad does not hold this pass yet: reduce what it will hold (see the comment above).
  start_allreduce_locked(p, acc.defined() ? grad + acc : grad.clone(at::MemoryFormat::Contiguous));
}

void DistributedOptimizer::synchronize() {
  ::torch::NoGradGuard no_grad;
  std::lock_guard lock(mu_);
  for (auto& p : params_) {
    if (p->pending) continue;
    const Tensor& g = p->tensor.grad();
    start_allreduce_locked(*p, g.defined() ? g.clone(at::MemoryFormat::Contiguous)
                                           : at::zeros_like(p->tensor, at::MemoryFormat::Contiguous));
  }
  // Wait for all before reporting, so that no buffer is left in flight.
  std::string first_error;
  for (auto& p : params_) {
    wait_quietly(p->handle);
    const std::string err = p->handle->error();
    if (!err.empty()) {
      if (first_error.empty()) first_error = err;
    } else {
      Tensor& g = p->tensor.mutable_grad();
      if (g.defined())
        g.copy_(p->buffer);
      else
        g = p->buffer;  // same shape as the parameter; not a view (zero_grad detaches it)
    }
    p->pending = false;
    p->passes = 0;
    p->buffer = Tensor();
    p->handle.reset();
  }
  if (!first_error.empty()) throw Error("DistributedOptimizer: " + first_error);
  synchronized_ = true;
}

void DistributedOptimizer::step() {
  bool done;
  {
    std::lock_guard lock(mu_);
    done = synchronized_;
  }
  if (!done) synchronize();
  optimizer_.step();
  std::lock_guard lock(mu_);
  synchronized_ = false;
}

void DistributedOptimizer::zero_grad() {
  std::lock_guard lock(mu_);
  for (auto& p : params_)
    if (p->pending)
      throw Error("DistributedOptimizer::zero_grad: the gradient allreduce of '" + p->op_name +
                  "' is in flight; call step() or synchronize() after backward");
  optimizer_.zero_grad();
  for (auto& p : params_) p->passes = 0;
}

}  // namespace krug::torch
