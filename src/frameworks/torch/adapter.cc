#include "frameworks/torch/adapter.h"

#include <ATen/core/grad_mode.h>  // at::NoGradGuard (torch 2.x's ATen.h no longer has it)
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here)
#include <torch/version.h>

#include <thread>
#include <type_traits>
#include <utility>

// torch 2.3 added the unsigned 16/32/64-bit dtypes; torch 1.13 (Debian's) builds without them.
#define KRUG_TORCH_HAS_UNSIGNED \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3))

namespace krug::torch_adapter {

using frontend::OpType;

// Outputs allocated on the engine's thread (allocate_output), read by the caller after
// completion; the handle's completion orders the two.
struct TorchHandle::Shared {
  std::vector<Slot> slots;
};

namespace {

// ReduceOp::kAdasum exists once the Adasum branch is in the core; detected at compile time so
// that enabling it here needs no edit.
template <typename E, typename = void>
struct HasAdasum : std::false_type {};
template <typename E>
struct HasAdasum<E, std::void_t<decltype(E::kAdasum)>> : std::true_type {};
template <typename E>
int adasum_value() {
  if constexpr (HasAdasum<E>::value) {
    return static_cast<int>(E::kAdasum);
  } else {
    return -1;
  }
}

// c10::Event::synchronize() arrived after torch 1.13; there, waiting polls query().
template <typename E, typename = void>
struct HasSynchronize : std::false_type {};
template <typename E>
struct HasSynchronize<E, std::void_t<decltype(std::declval<const E&>().synchronize())>>
    : std::true_type {};

// A template, so that the branch a torch lacks is never instantiated.
template <typename E>
void wait_for_event(const E& event) {
  if constexpr (HasSynchronize<E>::value) {
    event.synchronize();
  } else {
    while (!event.query()) std::this_thread::yield();
  }
}

// The seam's ready event for CUDA tensors: recorded on the current stream of the tensor's
// device when the operation is enqueued (after the binding's own copies), waited for by the
// engine before it reads the tensor. Only that event, never the device. Uses c10's
// device-generic API, so the binding builds against a torch without CUDA too.
class StreamReady final : public frontend::ReadyEvent {
 public:
  explicit StreamReady(const at::Device& device) : event_(c10::DeviceType::CUDA) {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    event_.record(impl.getStream(device));
  }
  void wait() override { wait_for_event(event_); }

 private:
  c10::Event event_;
};

// The callbacks' ready event when the tensors are on a CUDA device, else none.
std::shared_ptr<frontend::ReadyEvent> ready_event(const at::Tensor& t) {
  if (!t.is_cuda()) return nullptr;
  return std::make_shared<StreamReady>(t.device());
}

std::string describe(OpType op, const std::string& name) {
  return fmt::format("{} '{}'", frontend::op_name(op), name);
}

// The seam's view of a contiguous tensor (its sizes stay valid while `t` lives).
frontend::TensorView view_of(const at::Tensor& t) {
  const auto sizes = t.sizes();
  frontend::Device device;
  if (t.is_cuda())
    device = {.kind = frontend::DeviceKind::kCUDA, .id = static_cast<int32_t>(t.get_device())};
  return frontend::TensorView{.dtype = to_krug_dtype(t.scalar_type()),
                              .shape = {sizes.data(), sizes.size()},
                              .device = device,
                              .data = t.data_ptr()};
}

// Writes through raw pointers and the copies below must not be recorded by autograd (the
// Python frontend's autograd Functions already account for them), nor trip its leaf checks.
at::Tensor contiguous(const at::Tensor& t) {
  at::NoGradGuard no_grad;
  return t.is_contiguous() ? t : t.contiguous();
}

std::optional<DataType> krug_dtype(at::ScalarType type) {
  switch (type) {
    case at::kByte:
      return DataType::kUInt8;
    case at::kChar:
      return DataType::kInt8;
    case at::kShort:
      return DataType::kInt16;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBFloat16;
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    case at::kBool:
      return DataType::kBool;
#if KRUG_TORCH_HAS_UNSIGNED
    case at::kUInt16:
      return DataType::kUInt16;
    case at::kUInt32:
      return DataType::kUInt32;
    case at::kUInt64:
      return DataType::kUInt64;
#endif
    default:
      return std::nullopt;
  }
}

// What check_tensor accepts, without building its message: the per-call path of every op
// (the message is formatted only for a tensor that fails).
bool usable(const at::Tensor& t) {
  return t.defined() && (t.device().is_cpu() || t.is_cuda()) && t.layout() == at::kStrided &&
         !t.is_sparse() && krug_dtype(t.scalar_type()).has_value();
}

void check_same_device(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  if (a.device() != b.device())
    throw UnsupportedTensor(fmt::format("{}: the output is on {} but the input on {}; krug "
                                        "needs both on one device",
                                        what, b.device().str(), a.device().str()));
}

void check_same(const at::Tensor& input, const at::Tensor& output, const std::string& what) {
  check_tensor(output, what);
  if (output.scalar_type() != input.scalar_type())
    throw UnsupportedTensor(fmt::format("{}: the output's dtype {} differs from the input's {}",
                                        what, torch_dtype_name(output.scalar_type()),
                                        torch_dtype_name(input.scalar_type())));
  if (output.sizes() != input.sizes())
    throw UnsupportedTensor(fmt::format("{}: the output's shape [{}] differs from the input's [{}]",
                                        what, fmt::join(output.sizes(), ", "),
                                        fmt::join(input.sizes(), ", ")));
  check_same_device(input, output, what);
}

// Input and output slots of an op whose output has the input's shape (allreduce, broadcast).
TorchHandle::Slot same_shape_slot(const at::Tensor& input, const at::Tensor& output) {
  TorchHandle::Slot s;
  s.target = output;
  if (output.is_same(input)) {
    s.work = contiguous(input);  // in place: the copy (if any) is both read and written
    s.input = s.work;
  } else {
    s.input = contiguous(input);
    s.work = output.is_contiguous() ? output : at::empty(input.sizes(), input.options());
  }
  return s;
}

// The seam's output allocator: tensor i of the operation becomes a fresh tensor with the
// options of input i, stored in slot i.
frontend::OutputAllocator allocator(const std::shared_ptr<TorchHandle::Shared>& shared,
                                    const std::vector<at::Tensor>& like) {
  std::vector<at::TensorOptions> options;
  for (const auto& t : like) options.push_back(t.options());
  // Captures the shared state weakly: the engine's queue entry must not keep the handle's
  // tensors alive on its own, and the handle outlives the operation (its destructor waits).
  std::weak_ptr<TorchHandle::Shared> weak = shared;
  return [weak, options = std::move(options)](size_t i, const Shape& shape) -> void* {
    auto s = weak.lock();
    if (!s) throw Error("the output tensor's handle was destroyed while the operation ran");
    at::Tensor out = at::empty(shape, options.at(i));
    s->slots[i].target = out;
    s->slots[i].work = out;
    return out.data_ptr();
  };
}

// The engine rejects a request with bad arguments (a name already in flight, a process set this
// rank is not in, alltoall rows it cannot split) before sending anything: raise at the call, as
// Horovod does, rather than at synchronize.
HandlePtr with_handle(std::shared_ptr<TorchHandle::Shared> shared, frontend::Handle handle) {
  if (handle.rejected()) throw UnsupportedTensor(handle.error());
  auto h = std::make_shared<TorchHandle>(std::move(shared));
  h->handle_ = std::move(handle);
  return h;
}

// One ready event for an operation's tensors, which must share a device (one stream waits).
std::shared_ptr<frontend::ReadyEvent> group_ready(const std::vector<at::Tensor>& tensors,
                                                  const std::string& what) {
  for (const auto& t : tensors) check_same_device(tensors.front(), t, what);
  return tensors.empty() ? nullptr : ready_event(tensors.front());
}

// Ops whose output is sized after negotiation: one slot per input, allocated by the seam.
HandlePtr sized_later(const std::string& name, const frontend::Op& op,
                      const std::vector<at::Tensor>& inputs, bool grouped) {
  auto shared = std::make_shared<TorchHandle::Shared>();
  shared->slots.resize(inputs.size());
  std::vector<frontend::TensorView> views;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string what =
        describe(op.type, grouped ? frontend::group_member_name(name, i) : name);
    check_tensor(inputs[i], what);
    if (inputs[i].dim() == 0)
      throw UnsupportedTensor(fmt::format(
          "{}: the tensor must have at least one dimension (it is split or concatenated along "
          "the first)",
          what));
    shared->slots[i].input = contiguous(inputs[i]);
    views.push_back(view_of(shared->slots[i].input));
  }
  frontend::Callbacks callbacks;
  callbacks.allocate = allocator(shared, inputs);
  callbacks.ready = group_ready(inputs, describe(op.type, name));
  frontend::Handle handle = grouped ? frontend::enqueue_group(name, op, views, {}, callbacks)
                                    : frontend::enqueue(name, op, views.at(0), nullptr, callbacks);
  return with_handle(std::move(shared), std::move(handle));
}

frontend::Op on_set(OpType type, ProcessSet process_set) {
  return frontend::Op{.type = type, .process_set = process_set};
}

}  // namespace

DataType to_krug_dtype(at::ScalarType type) {
  if (auto dtype = krug_dtype(type)) return *dtype;
  throw UnsupportedTensor(
      fmt::format("krug does not support tensors of dtype {}; supported: torch.uint8, torch.int8, "
                  "torch.int16, torch.int32, torch.int64, "
#if KRUG_TORCH_HAS_UNSIGNED
                  "torch.uint16, torch.uint32, torch.uint64, "
#endif
                  "torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool",
                  torch_dtype_name(type)));
}

at::ScalarType to_torch_dtype(DataType type) {
  switch (type) {
    case DataType::kUInt8:
      return at::kByte;
    case DataType::kInt8:
      return at::kChar;
    case DataType::kInt16:
      return at::kShort;
    case DataType::kInt32:
      return at::kInt;
    case DataType::kInt64:
      return at::kLong;
    case DataType::kFloat16:
      return at::kHalf;
    case DataType::kBFloat16:
      return at::kBFloat16;
    case DataType::kFloat32:
      return at::kFloat;
    case DataType::kFloat64:
      return at::kDouble;
    case DataType::kBool:
      return at::kBool;
#if KRUG_TORCH_HAS_UNSIGNED
    case DataType::kUInt16:
      return at::kUInt16;
    case DataType::kUInt32:
      return at::kUInt32;
    case DataType::kUInt64:
      return at::kUInt64;
#else
    case DataType::kUInt16:
    case DataType::kUInt32:
    case DataType::kUInt64:
      break;
#endif
  }
  throw Error(fmt::format("unknown krug data type {}", static_cast<int>(type)));
}

std::string torch_dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kByte:
      return "torch.uint8";
    case at::kChar:
      return "torch.int8";
    case at::kShort:
      return "torch.int16";
    case at::kInt:
      return "torch.int32";
    case at::kLong:
      return "torch.int64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kBool:
      return "torch.bool";
#if KRUG_TORCH_HAS_UNSIGNED
    case at::kUInt16:
      return "torch.uint16";
    case at::kUInt32:
      return "torch.uint32";
    case at::kUInt64:
      return "torch.uint64";
#endif
    case at::kComplexHalf:
      return "torch.complex32";
    case at::kComplexFloat:
      return "torch.complex64";
    case at::kComplexDouble:
      return "torch.complex128";
    default:
      return std::string("torch.") + c10::toString(type);
  }
}

void check_tensor(const at::Tensor& t, const std::string& what) {
  if (!t.defined()) throw UnsupportedTensor(fmt::format("{}: the tensor is undefined", what));
  if (!t.device().is_cpu() && !t.is_cuda())
    throw UnsupportedTensor(fmt::format("{}: {} tensors are not supported; only CPU and CUDA "
                                        "tensors are", what, t.device().str()));
  if (t.is_sparse() || t.layout() != at::kStrided)
    throw UnsupportedTensor(fmt::format("{}: only dense (strided) tensors are supported", what));
  try {
    to_krug_dtype(t.scalar_type());
  } catch (const UnsupportedTensor& e) {
    throw UnsupportedTensor(fmt::format("{}: {}", what, e.what()));
  }
}

Shape shape_of(const at::Tensor& t) {
  return Shape(t.sizes().begin(), t.sizes().end());
}

// ---- TorchHandle ----

TorchHandle::TorchHandle() : shared_(std::make_shared<Shared>()) {}
TorchHandle::TorchHandle(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

TorchHandle::~TorchHandle() {
  // Never let the engine write into freed memory: an in-flight op keeps its tensors until done.
  // The engine completes every handle within its timeout, even when a peer dies. Its error is
  // for wait() to report, not a destructor.
  if (handle_.valid() && !handle_.poll()) {
    try {
      handle_.wait();
    } catch (const Error&) {
    }
  }
}

bool TorchHandle::poll() const {
  return handle_.poll();
}

bool TorchHandle::wait_for(std::chrono::nanoseconds timeout) const {
  return handle_.wait_for(timeout);
}

std::string TorchHandle::error() const {
  return handle_.error();
}

void TorchHandle::wait() {
  handle_.wait();  // throws krug::Error with the failure message
  finalize();
}

void TorchHandle::finalize() {
  std::lock_guard lock(mu_);
  if (finalized_) return;
  finalized_ = true;
  at::NoGradGuard no_grad;
  for (auto& s : shared_->slots) {
    if (s.target.defined() && s.work.defined() && !s.target.is_same(s.work)) s.target.copy_(s.work);
    s.work = s.target;
    s.input = at::Tensor();  // the input copy is no longer needed
  }
}

std::vector<at::Tensor> TorchHandle::outputs() const {
  std::vector<at::Tensor> out;
  for (const auto& s : shared_->slots) out.push_back(s.target);
  return out;
}

at::Tensor TorchHandle::output(size_t i) const {
  if (i >= shared_->slots.size())
    throw Error(fmt::format("this operation has {} outputs, not {}", shared_->slots.size(), i + 1));
  return shared_->slots[i].target;
}

std::vector<int64_t> TorchHandle::received_splits() const {
  return handle_.received_splits();
}

int64_t TorchHandle::value() const {
  return handle_.value();
}

// ---- operations ----

namespace {

// One allreduce tensor's slot in `shared` (its input and the tensor it reduces into), its
// arguments checked. `output` null: a new tensor.
const TorchHandle::Slot& allreduce_slot(const std::string& tname, const at::Tensor& in,
                                        const at::Tensor* output, TorchHandle::Shared& shared) {
  at::Tensor out;
  if (!output) {
    if (!usable(in)) check_tensor(in, describe(OpType::kAllreduce, tname));
    out = at::empty(in.sizes(), in.options());
  } else {
    out = *output;
    if (!usable(in) || !usable(out) || out.scalar_type() != in.scalar_type() ||
        out.sizes() != in.sizes() || out.device() != in.device()) {
      const std::string what = describe(OpType::kAllreduce, tname);
      check_tensor(in, what);
      check_same(in, out, what);
    }
  }
  shared.slots.push_back(same_shape_slot(in, out));
  return shared.slots.back();
}

// Every gradient of every step comes here: the seam hands the engine name and shape by
// reference, and the engine copies them into an entry it reuses; no request or list is built.
HandlePtr single_allreduce(const std::string& name, const at::Tensor& input,
                           const at::Tensor* output, const ReduceOptions& options) {
  auto shared = std::make_shared<TorchHandle::Shared>();
  const TorchHandle::Slot& slot = allreduce_slot(name, input, output, *shared);
  void* out = slot.work.data_ptr();
  frontend::Callbacks callbacks;
  callbacks.ready = ready_event(slot.work);  // after the binding's own copies, if any
  frontend::Handle handle =
      frontend::enqueue(name, frontend::reduction(OpType::kAllreduce, options),
                        view_of(slot.input), out, callbacks);
  return with_handle(std::move(shared), std::move(handle));
}

}  // namespace

HandlePtr allreduce_async(const std::string& name, const at::Tensor& input,
                          const at::Tensor& output, const ReduceOptions& options) {
  return single_allreduce(name, input, &output, options);
}

namespace {

// A tensor the direct lane can read or write in place: dense host memory.
bool lane_tensor(const at::Tensor& t) {
  return usable(t) && t.device().is_cpu() && t.is_contiguous();
}

}  // namespace

bool allreduce_direct(const std::string& name, const at::Tensor& input, const at::Tensor& output,
                      const ReduceOptions& options) {
  if (!lane_tensor(input) || !lane_tensor(output) || output.scalar_type() != input.scalar_type() ||
      output.sizes() != input.sizes())
    return false;
  return frontend::run_direct(name, frontend::reduction(OpType::kAllreduce, options),
                              view_of(input), output.data_ptr());
}

bool broadcast_direct(const std::string& name, const at::Tensor& tensor, int root) {
  if (!lane_tensor(tensor)) return false;
  return frontend::run_direct(name, frontend::Op{.type = OpType::kBroadcast, .root = root},
                              view_of(tensor), tensor.data_ptr());
}

std::optional<at::Tensor> direct_output(const at::Tensor& input, int64_t rows) {
  if (!lane_tensor(input) || (rows != 1 && input.dim() == 0)) return std::nullopt;
  const auto bytes = static_cast<size_t>(input.numel()) * input.element_size();
  const auto op = rows == 1 ? OpType::kAllreduce : OpType::kAllgather;
  if (bytes == 0 || bytes > frontend::direct_lane_bytes(op)) return std::nullopt;
  // Made here rather than in Python, where an allocation costs torch's argument parsing: on a
  // 2-core VM 2.5 us, more than the lane's call itself.
  if (rows == 1) return at::empty_like(input, at::MemoryFormat::Contiguous);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes[0] *= rows;
  return at::empty(sizes, input.options());
}

bool allgather_direct(const std::string& name, const at::Tensor& input, const at::Tensor& output) {
  if (!lane_tensor(input) || !lane_tensor(output) || output.scalar_type() != input.scalar_type() ||
      output.numel() != input.numel() * krug::size())
    return false;
  return frontend::run_direct(name, frontend::Op{.type = OpType::kAllgather}, view_of(input),
                              output.data_ptr());
}

HandlePtr allreduce_async(const std::string& name, const at::Tensor& input,
                          const ReduceOptions& options) {
  return single_allreduce(name, input, nullptr, options);
}

HandlePtr grouped_allreduce_async(const std::string& name, const std::vector<at::Tensor>& inputs,
                                  const std::vector<at::Tensor>& outputs,
                                  const ReduceOptions& options) {
  // A single tensor goes through here too (not grouped: its name is `name`).
  const bool grouped = inputs.size() != 1 || outputs.size() > 1;
  if (!outputs.empty() && outputs.size() != inputs.size())
    throw UnsupportedTensor(fmt::format("grouped allreduce '{}': {} inputs but {} outputs", name,
                                        inputs.size(), outputs.size()));
  if (inputs.empty())
    throw UnsupportedTensor(fmt::format("grouped allreduce '{}': no tensors", name));
  if (!grouped)
    return single_allreduce(name, inputs[0], outputs.empty() ? nullptr : &outputs[0], options);
  auto shared = std::make_shared<TorchHandle::Shared>();
  std::vector<frontend::TensorView> views;
  std::vector<void*> works;
  shared->slots.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& slot = allreduce_slot(frontend::group_member_name(name, i), inputs[i],
                                      outputs.empty() ? nullptr : &outputs[i], *shared);
    views.push_back(view_of(slot.input));
    works.push_back(slot.work.data_ptr());
  }
  std::vector<at::Tensor> works_tensors;
  for (const auto& slot : shared->slots) works_tensors.push_back(slot.work);
  frontend::Callbacks callbacks;
  callbacks.ready = group_ready(works_tensors, describe(OpType::kAllreduce, name));
  frontend::Handle handle = frontend::enqueue_group(
      name, frontend::reduction(OpType::kAllreduce, options), views, works, callbacks);
  return with_handle(std::move(shared), std::move(handle));
}

HandlePtr allgather_async(const std::string& name, const at::Tensor& input,
                          ProcessSet process_set) {
  return sized_later(name, on_set(OpType::kAllgather, process_set), {input}, false);
}

HandlePtr grouped_allgather_async(const std::string& name, const std::vector<at::Tensor>& inputs,
                                  ProcessSet process_set) {
  return sized_later(name, on_set(OpType::kAllgather, process_set), inputs, true);
}

HandlePtr broadcast_async(const std::string& name, const at::Tensor& tensor, int root,
                          ProcessSet process_set) {
  check_tensor(tensor, describe(OpType::kBroadcast, name));
  auto shared = std::make_shared<TorchHandle::Shared>();
  shared->slots.push_back(same_shape_slot(tensor, tensor));
  const at::Tensor& work = shared->slots.back().work;
  frontend::Op op = on_set(OpType::kBroadcast, process_set);
  op.root = root;
  frontend::Callbacks callbacks;
  callbacks.ready = ready_event(work);
  frontend::Handle handle = frontend::enqueue(name, op, view_of(work), work.data_ptr(), callbacks);
  return with_handle(std::move(shared), std::move(handle));
}

HandlePtr alltoall_async(const std::string& name, const at::Tensor& input,
                         const std::vector<int64_t>& splits, ProcessSet process_set) {
  frontend::Op op = on_set(OpType::kAlltoall, process_set);
  op.splits = splits;
  return sized_later(name, op, {input}, false);
}

HandlePtr reducescatter_async(const std::string& name, const at::Tensor& input,
                              const ReduceOptions& options) {
  return sized_later(name, frontend::reduction(OpType::kReducescatter, options), {input}, false);
}

HandlePtr grouped_reducescatter_async(const std::string& name,
                                      const std::vector<at::Tensor>& inputs,
                                      const ReduceOptions& options) {
  return sized_later(name, frontend::reduction(OpType::kReducescatter, options), inputs, true);
}

HandlePtr join_async() {
  return with_handle(std::make_shared<TorchHandle::Shared>(), frontend::join());
}

bool adasum_available() {
  return HasAdasum<ReduceOp>::value;
}
int adasum_op() {
  return adasum_value<ReduceOp>();
}

}  // namespace krug::torch_adapter
