// The frontend seam (include/krug/frontend.h) over the process's engine.
#include "krug/frontend.h"

#include <fmt/format.h>

#include <mutex>
#include <utility>

#include "api/request.h"
#include "api/runtime.h"
#include "engine/engine.h"

namespace krug::frontend {

using CoreOp = controller::OpType;
static_assert(static_cast<int>(OpType::kAllreduce) == static_cast<int>(CoreOp::kAllreduce));
static_assert(static_cast<int>(OpType::kAllgather) == static_cast<int>(CoreOp::kAllgather));
static_assert(static_cast<int>(OpType::kBroadcast) == static_cast<int>(CoreOp::kBroadcast));
static_assert(static_cast<int>(OpType::kAlltoall) == static_cast<int>(CoreOp::kAlltoall));
static_assert(static_cast<int>(OpType::kReducescatter) == static_cast<int>(CoreOp::kReducescatter));
static_assert(static_cast<int>(OpType::kJoin) == static_cast<int>(CoreOp::kJoin));

namespace {

CoreOp core(OpType type) {
  return static_cast<CoreOp>(type);
}

bool sized_by_negotiation(OpType type) {
  return type == OpType::kAllgather || type == OpType::kAlltoall || type == OpType::kReducescatter;
}

// A device binding's event, waited for once per operation however many tensors it has.
struct SharedReady {
  std::shared_ptr<ReadyEvent> event;
  std::once_flag once;
};

// The callbacks of tensor `index`, in the engine's form.
void attach(engine::TensorArgs& args, size_t index, const Callbacks& callbacks,
            const std::shared_ptr<SharedReady>& ready) {
  if (callbacks.allocate)
    args.allocate_output = [allocate = callbacks.allocate, index](const Shape& shape) {
      return allocate(index, shape);
    };
  if (ready) args.ready = [ready] { std::call_once(ready->once, [&] { ready->event->wait(); }); };
}

// The engine's form of a tensor's device: its CUDA ordinal, or -1 for host memory.
int32_t device_of(const TensorView& t) {
  return t.device.kind == DeviceKind::kCUDA ? t.device.id : -1;
}

std::shared_ptr<SharedReady> shared_ready(const Callbacks& callbacks) {
  if (!callbacks.ready) return nullptr;
  auto ready = std::make_shared<SharedReady>();
  ready->event = callbacks.ready;
  return ready;
}

Status status_of(const engine::HandleState& state, const engine::Engine& engine, OpType op,
                 int32_t process_set) {
  Status s;
  s.rank = engine.rank();
  s.host = engine.config().hostname;
  s.process_set = process_set;
  s.op = op;
  if (!state.done()) return s;
  s.message = state.error();
  if (!s.message.empty()) {
    s.code = state.rejected()     ? Status::Code::kRejected
             : state.failed_precondition() ? Status::Code::kPrecondition
                                  : Status::Code::kFailed;
    s.tensor = state.failed_tensor();
  }
  return s;
}

// The handle for `state`, with the done callback (if any) attached: it runs on the thread that
// completes the handle, or here when the enqueue already failed it.
Handle finish_enqueue(std::shared_ptr<engine::HandleState> state,
                      std::shared_ptr<const engine::Engine> engine, const Op& op,
                      const Callbacks& callbacks) {
  if (callbacks.done) {
    // The handle's own member runs the callback, so the raw pointer outlives every call.
    engine::HandleState* raw = state.get();
    state->on_done([raw, engine, done = callbacks.done, type = op.type, set = op.process_set.id] {
      done(status_of(*raw, *engine, type, set));
    });
    // Nobody will wait on the handle and drive the loop for it.
    engine->expedite();
  }
  return Handle(krug::Handle(std::move(state)), op, std::move(engine));
}

// An allreduce or broadcast of host memory as the engine takes it by reference (no copies).
engine::TensorView by_reference_view(const std::string& name, const Op& op, const TensorView& input,
                                     void* output) {
  return engine::TensorView{.name = name,
                            .op = core(op.type),
                            .dtype = input.dtype,
                            .shape = input.shape,
                            .process_set = op.process_set.id,
                            .reduce_op = op.reduce_op,
                            .prescale = op.prescale,
                            .postscale = op.postscale,
                            .root = op.root,
                            .input = input.data,
                            .output = output};
}

}  // namespace

std::string_view op_name(OpType op) {
  return controller::op_name(core(op));
}

Op reduction(OpType type, const ReduceOptions& options) {
  Op op;
  op.type = type;
  op.process_set = options.process_set;
  op.reduce_op = options.op;
  op.prescale = options.prescale_factor;
  op.postscale = options.postscale_factor;
  return op;
}

std::string group_member_name(const std::string& name, size_t index) {
  return fmt::format("{}.{}", name, index);
}

Handle::Handle(krug::Handle handle, const Op& op, std::shared_ptr<const engine::Engine> engine)
    : krug::Handle(std::move(handle)),
      op_(op.type),
      process_set_(op.process_set.id),
      engine_(std::move(engine)) {}

Status Handle::status() const {
  if (!engine_) throw Error("krug::frontend::Handle is empty: it was not returned by enqueue");
  return status_of(state(), *engine_, op_, process_set_);
}

bool Handle::rejected() const {
  return valid() && state().rejected();
}

Handle enqueue(const std::string& name, const Op& op, const TensorView& input, void* output,
               const Callbacks& callbacks) {
  std::shared_ptr<engine::Engine> engine = current_engine();
  const bool by_reference = (op.type == OpType::kAllreduce || op.type == OpType::kBroadcast) &&
                            !callbacks.allocate && !callbacks.ready &&
                            input.device.kind == DeviceKind::kCPU;
  if (by_reference) {
    // The per-step path: the engine copies name and shape into an entry it reuses.
    api::check_tensor(name, core(op.type), input);
    auto state = engine->enqueue(by_reference_view(name, op, input, output));
    return finish_enqueue(std::move(state), std::move(engine), op, callbacks);
  }
  engine::TensorArgs args = engine::tensor_args(api::make_request(name, op, input), input.data,
                                                sized_by_negotiation(op.type) ? nullptr : output);
  args.device = device_of(input);
  attach(args, 0, callbacks, shared_ready(callbacks));
  auto state = engine->enqueue(std::move(args));
  return finish_enqueue(std::move(state), std::move(engine), op, callbacks);
}

bool run_direct(const std::string& name, const Op& op, const TensorView& input, void* output) {
  const bool lane_op = op.type == OpType::kAllreduce || op.type == OpType::kBroadcast ||
                       op.type == OpType::kAllgather;
  if (!lane_op || input.device.kind != DeviceKind::kCPU) return false;
  const auto& engine = engine_for_call();
  api::check_tensor(name, core(op.type), input);
  return engine->run_direct(by_reference_view(name, op, input, output));
}

size_t direct_lane_bytes(OpType op) {
  return current_engine()->direct_lane_bytes(core(op));
}

Handle enqueue_group(const std::string& name, const Op& op, std::span<const TensorView> inputs,
                     std::span<void* const> outputs, const Callbacks& callbacks) {
  if (inputs.empty())
    throw InvalidArgument(fmt::format("grouped {} '{}': no tensors", op_name(op.type), name));
  if (!sized_by_negotiation(op.type) && outputs.size() != inputs.size())
    throw InvalidArgument(fmt::format("grouped {} '{}': {} inputs but {} outputs", op_name(op.type),
                                      name, inputs.size(), outputs.size()));
  std::shared_ptr<engine::Engine> engine = current_engine();
  const auto ready = shared_ready(callbacks);
  std::vector<engine::TensorArgs> args;
  args.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    controller::Request q = api::make_request(group_member_name(name, i), op, inputs[i]);
    q.group = name;
    q.group_size = static_cast<int32_t>(inputs.size());
    void* out = sized_by_negotiation(op.type) ? nullptr : outputs[i];
    args.push_back(engine::tensor_args(std::move(q), inputs[i].data, out));
    args.back().device = device_of(inputs[i]);
    attach(args.back(), i, callbacks, ready);
  }
  auto state = engine->enqueue(std::move(args));
  return finish_enqueue(std::move(state), std::move(engine), op, callbacks);
}

Handle join(const Callbacks& callbacks) {
  std::shared_ptr<engine::Engine> engine = current_engine();
  auto state = engine->enqueue(engine::tensor_args(
      api::control_request("__join", CoreOp::kJoin, kGlobalProcessSet.id), nullptr, nullptr));
  return finish_enqueue(std::move(state), std::move(engine), Op{.type = OpType::kJoin}, callbacks);
}

}  // namespace krug::frontend
