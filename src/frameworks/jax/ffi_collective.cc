// krug's JAX binding: one XLA FFI handler (CPU) that runs every collective of krug.jax, eagerly
// and inside jax.jit. It describes XLA's buffers as views and enqueues them through the frontend
// seam (krug/frontend.h), the only part of the core it uses, and returns an asynchronous FFI
// future that the seam's done callback completes on krug's thread. Asynchronous, so that XLA's
// thread never blocks on the network: a program with several collectives enqueues all of them,
// in whatever order XLA runs independent operations on this rank, and the engine's negotiation
// matches them by name across ranks.
//
// XLA fixes every result's shape when the program is traced, so the results that negotiation
// sizes (allgather, alltoall, reducescatter) are written straight into XLA's buffers, after a
// check that the negotiated shape is the traced one; krug.jax works the shapes out (eagerly it
// asks the other ranks first). A mismatch fails the operation on every rank with a message.
//
// Arguments: the tensors (alltoall: then its splits, int32, empty for an even split); results:
// one per tensor (alltoall: then the rows received from each rank, int32; join: the last rank to
// join, int32). int32, not int64: JAX makes 32-bit integers unless jax_enable_x64 is set. Errors:
// what the engine refuses at submission or an argument that can never work is INVALID_ARGUMENT;
// what fails later (a dead peer, mismatched ranks) is INTERNAL. The message is krug's; krug.jax
// raises them as ValueError and HorovodInternalError.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "krug/frontend.h"
#include "krug/krug.h"
#include "krug/types.h"
#include "xla/ffi/api/ffi.h"

namespace {

namespace ffi = xla::ffi;
namespace fe = krug::frontend;
using krug::DataType;

std::optional<DataType> krug_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::U8:
      return DataType::kUInt8;
    case ffi::DataType::S8:
      return DataType::kInt8;
    case ffi::DataType::S16:
      return DataType::kInt16;
    case ffi::DataType::S32:
      return DataType::kInt32;
    case ffi::DataType::S64:
      return DataType::kInt64;
    case ffi::DataType::F16:
      return DataType::kFloat16;
    case ffi::DataType::BF16:
      return DataType::kBFloat16;
    case ffi::DataType::F32:
      return DataType::kFloat32;
    case ffi::DataType::F64:
      return DataType::kFloat64;
    case ffi::DataType::PRED:
      return DataType::kBool;
    default:
      return std::nullopt;
  }
}

// What the operation needs of one XLA buffer after the handler has returned: XLA keeps the memory
// alive until the future completes, but not the call frame that describes it.
struct Buffer {
  void* data = nullptr;
  ffi::DataType dtype = ffi::DataType::INVALID;
  std::vector<int64_t> shape;

  explicit Buffer(const ffi::AnyBuffer& b)
      : data(b.untyped_data()),
        dtype(b.element_type()),
        shape(b.dimensions().begin(), b.dimensions().end()) {}
};

size_t elements(const Buffer& b) {
  size_t n = 1;
  for (int64_t d : b.shape) n *= static_cast<size_t>(d);
  return n;
}

// What the Python side passes as the custom call's attributes.
struct Attributes {
  std::string_view name;
  fe::Op op;
  bool grouped = false;
};

// One running operation: it owns what the engine reads and writes through the views until the
// operation completes. It completes when both the done callback has run and enqueue has returned
// the handle (either may come first), so that results read from the handle (alltoall's received
// splits, join's rank) are there; then it fulfils XLA's promise.
class Operation {
 public:
  // A result after the tensors' own that the handle provides.
  enum class Extra : uint8_t { kNone, kReceivedSplits, kJoinRank };
  Extra extra_result_ = Extra::kNone;

  Operation(std::vector<Buffer> inputs, std::vector<Buffer> outputs)
      : inputs_(std::move(inputs)), outputs_(std::move(outputs)) {}

  ffi::Future future() { return ffi::Future(promise_); }
  std::vector<Buffer>& inputs() { return inputs_; }
  std::vector<Buffer>& outputs() { return outputs_; }
  std::vector<int64_t> splits;

  fe::Callbacks callbacks(const std::shared_ptr<Operation>& self, bool sized_later) {
    fe::Callbacks c;
    c.done = [self](const fe::Status& s) { self->status_arrived(s); };
    if (sized_later) {
      // Weak: the engine's entry must not keep the operation alive through its own callback.
      std::weak_ptr<Operation> weak = self;
      c.allocate = [weak](size_t i, const krug::Shape& shape) -> void* {
        auto op = weak.lock();
        if (!op) throw krug::Error("krug.jax: the operation ended while it ran");
        return op->output_for(i, shape);
      };
    }
    return c;
  }

  void handle_arrived(fe::Handle handle) {
    std::unique_lock lock(mu_);
    handle_ = std::move(handle);
    have_handle_ = true;
    if (status_) finish(lock);
  }

  void fail_now(ffi::Error error) { promise_.SetError(std::move(error)); }

 private:
  // The traced result buffer for tensor `i`, when the engine's result has the traced shape.
  void* output_for(size_t i, const krug::Shape& shape) {
    Buffer& out = outputs_.at(i);
    if (shape != out.shape) {
      throw krug::Error(fmt::format(
          "krug.jax: the result has shape [{}] here, but the JAX program was traced for [{}]. "
          "Under jax.jit every rank must pass tensors of the same shape to allgather, alltoall "
          "and reducescatter (and alltoall splits evenly); call it outside jit otherwise",
          fmt::join(shape, ", "), fmt::join(out.shape, ", ")));
    }
    return out.data != nullptr ? out.data : &empty_room_;  // zero elements: any valid address
  }

  void status_arrived(const fe::Status& s) {
    std::unique_lock lock(mu_);
    status_ = s;
    if (have_handle_) finish(lock);
  }

  // With mu_ held; both halves are there. Runs once.
  void finish(std::unique_lock<std::mutex>& lock) {
    fe::Handle handle = std::move(handle_);  // breaks the cycle handle -> callback -> this
    const fe::Status s = std::move(*status_);
    lock.unlock();
    if (!s.ok()) {
      promise_.SetError(s.code == fe::Status::Code::kRejected
                            ? ffi::Error::InvalidArgument(s.message)
                            : ffi::Error::Internal(s.message));
      return;
    }
    if (!write_extra_results(handle)) return;
    promise_.SetAvailable();
  }

  // Alltoall's received splits and join's last rank: the result after the tensors' own.
  bool write_extra_results(const fe::Handle& handle) {
    if (extra_result_ == Extra::kNone) return true;
    Buffer& out = outputs_.back();
    if (extra_result_ == Extra::kJoinRank) {
      const auto last = static_cast<int32_t>(handle.value());
      std::memcpy(out.data, &last, sizeof(last));
      return true;
    }
    const auto& received = handle.received_splits();
    if (received.size() != elements(out)) {
      promise_.SetError(ffi::Error::Internal(
          fmt::format("krug.jax: alltoall received from {} ranks, the program expected {}",
                      received.size(), elements(out))));
      return false;
    }
    auto* rows = static_cast<int32_t*>(out.data);
    for (size_t i = 0; i < received.size(); ++i) rows[i] = static_cast<int32_t>(received[i]);
    return true;
  }

  std::vector<Buffer> inputs_;
  std::vector<Buffer> outputs_;
  ffi::Promise promise_;
  std::mutex mu_;
  fe::Handle handle_;
  bool have_handle_ = false;
  std::optional<fe::Status> status_;
  char empty_room_ = 0;
};

ffi::Future failed(ffi::Error error) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(std::move(error));
  return future;
}

// The views of the operation's tensors (its first `n` inputs); their shapes live in `op`.
std::vector<fe::TensorView> views(Operation& op, size_t n) {
  static constexpr char kEmpty = 0;  // the address of a tensor without elements
  std::vector<fe::TensorView> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Buffer& b = op.inputs()[i];
    const auto dtype = krug_dtype(b.dtype);
    if (!dtype) {
      throw krug::InvalidArgument(fmt::format(
          "krug.jax: XLA element type {} is not supported; use (b)float16/32/64, int8-64, "
          "uint8 or bool",
          static_cast<int>(b.dtype)));
    }
    v.push_back(fe::TensorView{.dtype = *dtype,
                               .shape = {b.shape.data(), b.shape.size()},
                               .data = b.data != nullptr ? b.data : &kEmpty});
  }
  return v;
}

fe::Handle start(const std::shared_ptr<Operation>& op, const Attributes& a) {
  const std::string name(a.name);
  const bool sized_later = a.op.type == fe::OpType::kAllgather ||
                           a.op.type == fe::OpType::kAlltoall ||
                           a.op.type == fe::OpType::kReducescatter;
  const fe::Callbacks callbacks = op->callbacks(op, sized_later);
  if (a.op.type == fe::OpType::kJoin) {
    op->extra_result_ = Operation::Extra::kJoinRank;
    return fe::join(callbacks);
  }
  size_t tensors = op->inputs().size();
  fe::Op how = a.op;
  if (how.type == fe::OpType::kAlltoall) {
    // The last input is the splits; the last result the received splits.
    const Buffer& splits = op->inputs().back();
    const auto* first = static_cast<const int32_t*>(splits.data);
    op->splits.assign(first, first + elements(splits));
    how.splits = op->splits;
    op->extra_result_ = Operation::Extra::kReceivedSplits;
    tensors -= 1;
  }
  std::vector<fe::TensorView> in = views(*op, tensors);
  std::vector<void*> out;
  if (!sized_later) {
    for (size_t i = 0; i < tensors; ++i) out.push_back(op->outputs()[i].data);
    if (how.type == fe::OpType::kBroadcast) {
      // The seam broadcasts in place: the root's tensor is its output's starting value.
      for (size_t i = 0; i < tensors; ++i) {
        const Buffer& b = op->inputs()[i];
        if (out[i] != b.data && out[i] != nullptr) {
          std::memcpy(out[i], b.data, krug::dtype_size(in[i].dtype) * elements(b));
        }
        in[i].data = out[i] != nullptr ? out[i] : in[i].data;
      }
    }
  }
  if (!a.grouped)
    return fe::enqueue(name, how, in.at(0), sized_later ? nullptr : out.at(0), callbacks);
  return fe::enqueue_group(name, how, in, out, callbacks);
}

ffi::Future collective(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view name,
                       int64_t op_type, int64_t reduce_op, double prescale, double postscale,
                       int64_t root, int64_t process_set, int64_t grouped) {
  std::vector<Buffer> inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return failed(b.error());
    inputs.emplace_back(*b);
  }
  std::vector<Buffer> outputs;
  for (size_t i = 0; i < rets.size(); ++i) {
    auto b = rets.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return failed(b.error());
    outputs.emplace_back(**b);
  }
  Attributes a{.name = name,
               .op = fe::Op{.type = static_cast<fe::OpType>(op_type),
                            .process_set = krug::ProcessSet{static_cast<int32_t>(process_set)},
                            .reduce_op = static_cast<krug::ReduceOp>(reduce_op),
                            .prescale = prescale,
                            .postscale = postscale,
                            .root = static_cast<int32_t>(root)},
               .grouped = grouped != 0};
  auto op = std::make_shared<Operation>(std::move(inputs), std::move(outputs));
  ffi::Future future = op->future();
  try {
    op->handle_arrived(start(op, a));
  } catch (const krug::InvalidArgument& e) {
    op->fail_now(ffi::Error::InvalidArgument(e.what()));
  } catch (const std::exception& e) {
    op->fail_now(ffi::Error::Internal(e.what()));
  }
  return future;
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(KrugJaxCollective, collective,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("op")
                                  .Attr<int64_t>("reduce_op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale")
                                  .Attr<int64_t>("root")
                                  .Attr<int64_t>("process_set")
                                  .Attr<int64_t>("grouped"));
