// krug's LibTorch C++ API (include/krug/torch.h) on top of the shared torch adapter.
#include "krug/torch.h"

#include <fmt/format.h>

#include <atomic>
#include <functional>
#include <unordered_set>
#include <utility>

namespace krug::torch {

// ---- Backend: what this file needs from the engine, on at::Tensor.
namespace {

using at::Tensor;

DataType krug_dtype(const Tensor& t, const std::string& what) {
  switch (t.scalar_type()) {
    case at::kByte: return DataType::kUInt8;
    case at::kChar: return DataType::kInt8;
    case at::kShort: return DataType::kInt16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kBool: return DataType::kBool;
    default:
      throw Error(fmt::format("{}: krug does not support tensors of type {}", what,
                              c10::toString(t.scalar_type())));
  }
}

void check_tensor(const Tensor& t, const std::string& what) {
  if (!t.defined()) throw Error(what + ": the tensor is undefined");
  if (!t.device().is_cpu())
    throw Error(fmt::format("{}: krug supports CPU tensors only, got a tensor on {}", what,
                            t.device().str()));
  if (t.layout() != at::kStrided) throw Error(what + ": krug supports dense (strided) tensors only");
  krug_dtype(t, what);
}

Shape shape_of(const Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end()); }

Handle enqueue_allreduce(const std::string& name, const Tensor& in, Tensor& out,
                         const ReduceOptions& options) {
  return krug::allreduce_async(name, in.data_ptr(), out.data_ptr(), krug_dtype(in, name),
                               shape_of(in), options);
}

Handle enqueue_broadcast(const std::string& name, Tensor& data, int root, ProcessSet set) {
  return krug::broadcast_async(name, data.data_ptr(), krug_dtype(data, name), shape_of(data), root,
                               set);
}

// The result tensor is made once the handle completed.
std::pair<Handle, std::function<Tensor(const Handle&)>> enqueue_allgather(const std::string& name,
                                                                          const Tensor& in,
                                                                          ProcessSet set) {
  Handle h = krug::allgather_async(name, in.data_ptr(), krug_dtype(in, name), shape_of(in), set);
  auto options = in.options();
  return {h, [options](const Handle& done) {
            Tensor out = at::empty(done.output_shape(), options);
            std::memcpy(out.data_ptr(), done.output().data(), done.output().size());
            return out;
          }};
}

}  // namespace

// ---- TensorHandle

struct TensorHandle::State {
  Handle handle;
  Tensor input;  // keeps the engine's input alive while it runs
  // Called once after a successful wait: the tensor wait() returns.
  std::function<Tensor(const Handle&)> finish;
  std::mutex mu;
  bool finished = false;
  Tensor result;
};

TensorHandle make_tensor_handle(std::shared_ptr<TensorHandle::State> state) {
  TensorHandle h;
  h.state_ = std::move(state);
  return h;
}

namespace {

const char* kInvalidHandle = "krug::torch::TensorHandle: used before being assigned an operation";

std::string auto_name(const std::string& name, const char* op) {
  if (!name.empty()) return name;
  static std::atomic<uint64_t> counters[3];
  const int index = op[0] == 'a' ? (op[3] == 'r' ? 0 : 1) : 2;  // allreduce, allgather, broadcast
  return fmt::format("{}.noname.{}", op, counters[index]++);
}

// A contiguous tensor with the same values (the tensor itself when already contiguous).
Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

}  // namespace

bool TensorHandle::poll() const {
  if (!state_) throw Error(kInvalidHandle);
  return state_->handle.poll();
}

std::string TensorHandle::error() const {
  if (!state_) throw Error(kInvalidHandle);
  return state_->handle.poll() ? state_->handle.error() : std::string();
}

Tensor TensorHandle::wait() const {
  if (!state_) throw Error(kInvalidHandle);
  state_->handle.wait();  // throws krug::Error on failure
  std::lock_guard lock(state_->mu);
  if (!state_->finished) {
    state_->result = state_->finish(state_->handle);
    state_->finished = true;
    state_->input = Tensor();
  }
  return state_->result;
}

// ---- Allreduce

namespace {

// Reduces `input` into `output` (both contiguous, may be the same tensor); wait() runs `finish`.
TensorHandle start_allreduce(const std::string& name, const Tensor& input, Tensor output,
                             const ReduceOptions& options,
                             std::function<Tensor(const Handle&)> finish) {
  auto state = std::make_shared<TensorHandle::State>();
  state->handle = enqueue_allreduce(name, input, output, options);
  state->input = input;
  state->finish = std::move(finish);
  return make_tensor_handle(std::move(state));
}

}  // namespace

TensorHandle allreduce_async(const Tensor& tensor, const std::string& name,
                             const ReduceOptions& options) {
  const std::string n = auto_name(name, "allreduce");
  check_tensor(tensor, "allreduce '" + n + "'");
  Tensor in = contiguous(tensor);
  Tensor out = at::empty_like(in, at::MemoryFormat::Contiguous);
  return start_allreduce(n, in, out, options, [out](const Handle&) { return out; });
}

TensorHandle allreduce_async_(Tensor& tensor, const std::string& name,
                              const ReduceOptions& options) {
  const std::string n = auto_name(name, "allreduce");
  check_tensor(tensor, "allreduce '" + n + "'");
  Tensor target = tensor;  // shares storage with the caller's tensor
  if (target.is_contiguous())
    return start_allreduce(n, target, target, options, [target](const Handle&) { return target; });
  // Reduce a contiguous copy, written back on completion.
  Tensor buffer = target.contiguous();
  return start_allreduce(n, buffer, buffer, options, [target, buffer](const Handle&) {
    ::torch::NoGradGuard no_grad;
    Tensor t = target;
    t.copy_(buffer);
    return t;
  });
}

Tensor allreduce(const Tensor& tensor, const std::string& name, const ReduceOptions& options) {
  return allreduce_async(tensor, name, options).wait();
}

Tensor& allreduce_(Tensor& tensor, const std::string& name, const ReduceOptions& options) {
  ::torch::NoGradGuard no_grad;
  allreduce_async_(tensor, name, options).wait();
  return tensor;
}

// ---- Allgather

TensorHandle allgather_async(const Tensor& tensor, const std::string& name, ProcessSet process_set) {
  const std::string n = auto_name(name, "allgather");
  check_tensor(tensor, "allgather '" + n + "'");
  if (tensor.dim() == 0)
    throw Error("allgather '" + n + "': the tensor needs at least one dimension (it is a scalar)");
  Tensor in = contiguous(tensor);
  auto state = std::make_shared<TensorHandle::State>();
  auto [handle, finish] = enqueue_allgather(n, in, process_set);
  state->handle = handle;
  state->input = in;
  state->finish = std::move(finish);
  return make_tensor_handle(std::move(state));
}

Tensor allgather(const Tensor& tensor, const std::string& name, ProcessSet process_set) {
  return allgather_async(tensor, name, process_set).wait();
}

// ---- Broadcast

TensorHandle broadcast_async_(Tensor& tensor, int root_rank, const std::string& name,
                              ProcessSet process_set) {
  const std::string n = auto_name(name, "broadcast");
  check_tensor(tensor, "broadcast '" + n + "'");
  Tensor target = tensor;
  auto state = std::make_shared<TensorHandle::State>();
  if (target.is_contiguous()) {
    state->handle = enqueue_broadcast(n, target, root_rank, process_set);
    state->input = target;
    state->finish = [target](const Handle&) { return target; };
  } else {
    Tensor buffer = target.contiguous();
    state->handle = enqueue_broadcast(n, buffer, root_rank, process_set);
    state->input = buffer;
    state->finish = [target, buffer](const Handle&) {
      ::torch::NoGradGuard no_grad;
      Tensor t = target;
      t.copy_(buffer);
      return t;
    };
  }
  return make_tensor_handle(std::move(state));
}

Tensor broadcast(const Tensor& tensor, int root_rank, const std::string& name,
                 ProcessSet process_set) {
  Tensor copy = tensor.detach().clone(at::MemoryFormat::Contiguous);
  broadcast_async_(copy, root_rank, name, process_set).wait();
  return copy;
}

Tensor& broadcast_(Tensor& tensor, int root_rank, const std::string& name, ProcessSet process_set) {
  ::torch::NoGradGuard no_grad;
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
void wait_quietly(const Handle& h) {
  try {
    h.wait();
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
  Handle handle;
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
    check_tensor(t, "DistributedOptimizer parameter '" + item.key() + "'");
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
  p.handle = enqueue_allreduce(p.op_name, p.buffer, p.buffer, options);
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
    const std::string err = p->handle.error();
    if (!err.empty()) {
      if (first_error.empty()) first_error = err;
    } else {
      Tensor& g = p->tensor.mutable_grad();
      if (g.defined())
        g.copy_(p->buffer);
      else
        g = p->buffer.view(p->tensor.sizes());
    }
    p->pending = false;
    p->passes = 0;
    p->buffer = Tensor();
    p->handle = Handle();
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
