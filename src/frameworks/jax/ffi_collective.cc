// krug's JAX binding: one XLA FFI handler (CPU) that runs every collective of krug.jax, eagerly
// and inside jax.jit. It describes XLA's buffers as views, enqueues them through the frontend
// seam (krug/frontend.h), the only part of the core it uses, and waits on XLA's thread for the
// result, running krug's loop there meanwhile as krug.torch's synchronize does. Synchronous on
// purpose: krug.jax chains a program's collectives one after another (python/krug/jax/ops.py,
// _ProgramOrder), so an asynchronous handler gains no overlap, and the rest of the program must
// go on on XLA's thread, not on krug's (a host callback after a collective may call krug).
//
// XLA fixes every result's shape when the program is traced, so the results that negotiation
// sizes (allgather, alltoall, reducescatter) are written straight into XLA's buffers, after a
// check that the negotiated shape is the traced one; krug.jax works the shapes out (eagerly it
// asks the other ranks first). A mismatch fails the operation on every rank with a message.
//
// Arguments: the tensors (alltoall: then its splits, int32, empty for an even split), then with
// attribute `after` the previous collective's result, which only orders the program; results:
// one per tensor (alltoall: then the rows received from each rank, int32; join: the last rank to
// join, int32). int32, not int64: JAX makes 32-bit integers unless jax_enable_x64 is set.
// Errors: what the engine refuses at submission or an argument that can never work is
// INVALID_ARGUMENT; what fails later (a dead peer, mismatched ranks) is INTERNAL. The message is
// krug's; krug.jax raises them as ValueError and HorovodInternalError.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdint>
#include <cstring>
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
    case ffi::DataType::U16:
      return DataType::kUInt16;
    case ffi::DataType::U32:
      return DataType::kUInt32;
    case ffi::DataType::U64:
      return DataType::kUInt64;
    default:
      return std::nullopt;
  }
}

// The name numpy gives the XLA element types users meet that krug has no type for.
std::string element_type_name(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::C64:
      return "complex64";
    case ffi::DataType::C128:
      return "complex128";
    default:
      return fmt::format("XLA element type {}", static_cast<int>(t));
  }
}

// What the operation needs of one XLA buffer: its data, element type and shape (the views borrow
// the shape).
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

bool sized_by_negotiation(fe::OpType type) {
  return type == fe::OpType::kAllgather || type == fe::OpType::kAlltoall ||
         type == fe::OpType::kReducescatter;
}

// The seam's allocate callback for results that negotiation sizes: XLA's buffer for tensor `i`,
// once the engine's result has the traced shape (`empty`: the address of a result without
// elements). It only runs while the handler waits.
fe::OutputAllocator traced_outputs(std::vector<Buffer>& outputs, char& empty) {
  return [&outputs, &empty](size_t i, const krug::Shape& shape) -> void* {
    Buffer& out = outputs.at(i);
    if (shape != out.shape) {
      throw krug::Error(fmt::format(
          "krug.jax: the result has shape [{}] here, but the JAX program was traced for [{}]. "
          "Under jax.jit every rank must pass tensors of the same shape to allgather and "
          "alltoall (and alltoall splits evenly); call it outside jit otherwise",
          fmt::join(shape, ", "), fmt::join(out.shape, ", ")));
    }
    return out.data != nullptr ? out.data : &empty;
  };
}

// The views of the first `n` inputs (their shapes live in `inputs`; `empty`: the address of a
// tensor without elements).
std::vector<fe::TensorView> views(const std::vector<Buffer>& inputs, size_t n, const char& empty) {
  std::vector<fe::TensorView> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const Buffer& b = inputs[i];
    const auto dtype = krug_dtype(b.dtype);
    if (!dtype) {
      throw krug::InvalidArgument(fmt::format(
          "krug.jax: {} is not supported; use (b)float16/32/64, int8-64, uint8 or bool",
          element_type_name(b.dtype)));
    }
    v.push_back(fe::TensorView{.dtype = *dtype,
                               .shape = {b.shape.data(), b.shape.size()},
                               .data = b.data != nullptr ? b.data : &empty});
  }
  return v;
}

// Enqueues the operation; `splits` receives alltoall's (the seam borrows them until it ends),
// `empty` is the address of tensors without elements. What the callbacks and views reference
// lives in the caller, which waits until the operation ends.
fe::Handle start(const Attributes& a, const std::vector<Buffer>& inputs,
                 std::vector<Buffer>& outputs, std::vector<int64_t>& splits, char& empty) {
  fe::Callbacks callbacks;
  if (sized_by_negotiation(a.op.type)) callbacks.allocate = traced_outputs(outputs, empty);
  if (a.op.type == fe::OpType::kJoin) return fe::join(callbacks);
  size_t tensors = inputs.size();
  fe::Op how = a.op;
  if (how.type == fe::OpType::kAlltoall) {
    const Buffer& given = inputs.back();  // the last input is the splits
    const auto* first = static_cast<const int32_t*>(given.data);
    splits.assign(first, first + elements(given));
    how.splits = splits;
    tensors -= 1;
  }
  std::vector<fe::TensorView> in = views(inputs, tensors, empty);
  std::vector<void*> out;
  if (!sized_by_negotiation(how.type)) {
    for (size_t i = 0; i < tensors; ++i) {
      out.push_back(outputs[i].data);
      if (how.type == fe::OpType::kBroadcast && out[i] != nullptr) {
        // The seam broadcasts in place: the root's tensor is its output's starting value.
        if (out[i] != inputs[i].data)
          std::memcpy(out[i], inputs[i].data, krug::dtype_size(in[i].dtype) * elements(inputs[i]));
        in[i].data = out[i];
      }
    }
  }
  const std::string name(a.name);
  if (!a.grouped)
    return fe::enqueue(name, how, in.at(0), out.empty() ? nullptr : out[0], callbacks);
  return fe::enqueue_group(name, how, in, out, callbacks);
}

// Alltoall's received splits and join's last rank: the result after the tensors' own.
ffi::Error write_extra_result(const Attributes& a, const fe::Handle& handle, Buffer& out) {
  if (a.op.type == fe::OpType::kJoin) {
    const auto last = static_cast<int32_t>(handle.value());
    std::memcpy(out.data, &last, sizeof(last));
    return ffi::Error::Success();
  }
  const auto& received = handle.received_splits();
  if (received.size() != elements(out)) {
    return ffi::Error::Internal(
        fmt::format("krug.jax: alltoall received from {} ranks, the program expected {}",
                    received.size(), elements(out)));
  }
  auto* rows = static_cast<int32_t*>(out.data);
  for (size_t i = 0; i < received.size(); ++i) rows[i] = static_cast<int32_t>(received[i]);
  return ffi::Error::Success();
}

ffi::Error run(const Attributes& a, std::vector<Buffer>& inputs, std::vector<Buffer>& outputs) {
  std::vector<int64_t> splits;
  char empty = 0;
  fe::Handle handle = start(a, inputs, outputs, splits, empty);
  // The engine ends every operation within its timeouts (it fails them on a lost peer), so
  // this wait ends; krug's loop runs on this thread while it waits.
  while (!handle.wait_for(std::chrono::seconds(1))) continue;
  const fe::Status s = handle.status();
  if (s.code == fe::Status::Code::kRejected) return ffi::Error::InvalidArgument(s.message);
  if (!s.ok()) return ffi::Error::Internal(s.message);
  if (a.op.type == fe::OpType::kJoin || a.op.type == fe::OpType::kAlltoall)
    return write_extra_result(a, handle, outputs.back());
  return ffi::Error::Success();
}

ffi::Error collective(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view name,
                      int64_t op_type, int64_t reduce_op, double prescale, double postscale,
                      int64_t root, int64_t process_set, int64_t grouped, int64_t after) {
  // Nothing may cross XLA's C interface as an exception: every error becomes XLA's.
  try {
    std::vector<Buffer> inputs;
    for (size_t i = 0; i < args.size(); ++i) {
      auto b = args.get<ffi::AnyBuffer>(i);
      if (!b.has_value()) return b.error();
      inputs.emplace_back(*b);
    }
    // The previous collective's result, an operand only to order the program (krug.jax's
    // _ProgramOrder): not part of the operation.
    if (after != 0 && !inputs.empty()) inputs.pop_back();
    std::vector<Buffer> outputs;
    for (size_t i = 0; i < rets.size(); ++i) {
      auto b = rets.get<ffi::AnyBuffer>(i);
      if (!b.has_value()) return b.error();
      outputs.emplace_back(**b);
    }
    const Attributes a{
        .name = name,
        .op = fe::Op{.type = static_cast<fe::OpType>(op_type),
                     .process_set = krug::ProcessSet{static_cast<int32_t>(process_set)},
                     .reduce_op = static_cast<krug::ReduceOp>(reduce_op),
                     .prescale = prescale,
                     .postscale = postscale,
                     .root = static_cast<int32_t>(root)},
        .grouped = grouped != 0};
    return run(a, inputs, outputs);
  } catch (const krug::InvalidArgument& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  } catch (...) {
    return ffi::Error::Internal("krug.jax: the collective failed with an unknown exception");
  }
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
                                  .Attr<int64_t>("grouped")
                                  .Attr<int64_t>("after"));
