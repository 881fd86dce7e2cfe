// Reduction loops and the dtype x op dispatch.
#include "reduce/reduce.h"

#include <algorithm>
#include <string>

#include "reduce/ops.h"

namespace krug::reduce {
namespace {

// Loops over one element type. Each aliasing case gets its own loop so every pointer can be
// __restrict: otherwise the compiler versions the loop on an overlap check, which an exact alias
// (dst == a, the common in-place case) fails, leaving it scalar.
template <typename T, typename Op>
void apply3(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}

template <typename T, typename Op>
void apply_left(T* __restrict dst, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], b[i]);
}

template <typename T, typename Op>
void apply_right(T* __restrict dst, const T* __restrict a, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], dst[i]);
}

template <typename T, typename Op>
void apply_self(T* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], dst[i]);
}

template <typename T, typename Op>
void run(void* dst_v, const void* a_v, const void* b_v, size_t n) {
  auto* dst = static_cast<T*>(dst_v);
  const auto* a = static_cast<const T*>(a_v);
  const auto* b = static_cast<const T*>(b_v);
  if (dst == a && dst == b) {
    apply_self<T, Op>(dst, n);
  } else if (dst == a) {
    apply_left<T, Op>(dst, b, n);
  } else if (dst == b) {
    apply_right<T, Op>(dst, a, n);
  } else {
    apply3<T, Op>(dst, a, b, n);
  }
}

struct HalfFormat {
  static void to_float(const uint16_t* s, float* d, size_t n) { half_to_float_n(s, d, n); }
  static void from_float(const float* s, uint16_t* d, size_t n) { float_to_half_n(s, d, n); }
};

struct BFloat16Format {
  static void to_float(const uint16_t* s, float* d, size_t n) { bfloat16_to_float_n(s, d, n); }
  static void from_float(const float* s, uint16_t* d, size_t n) { float_to_bfloat16_n(s, d, n); }
};

// 16-bit floats: widen a block of each input on the stack, reduce in float32, round back. Each
// block is fully read before it is written, so dst may alias a or b.
template <typename Format, typename Op>
void run16(void* dst_v, const void* a_v, const void* b_v, size_t n) {
  constexpr size_t kBlock = 256;
  auto* dst = static_cast<uint16_t*>(dst_v);
  const auto* a = static_cast<const uint16_t*>(a_v);
  const auto* b = static_cast<const uint16_t*>(b_v);
  alignas(64) float fa[kBlock];
  alignas(64) float fb[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    Format::to_float(a + i, fa, m);
    Format::to_float(b + i, fb, m);
    apply_left<float, Op>(fa, fb, m);
    Format::from_float(fa, dst + i, m);
  }
}

[[noreturn]] void fail(DataType dtype, ReduceOp op) {
  if (op == ReduceOp::kAdasum)
    throw Error("reduce: adasum is not an element-wise reduction: it runs only as an allreduce "
                "(collectives/adasum.h), never through the element-wise kernels");
  throw Error("reduce: unsupported data type " + std::to_string(static_cast<int>(dtype)) + " (" +
              std::string(dtype_name(dtype)) + ") with op " + std::to_string(static_cast<int>(op)) +
              " (" + std::string(reduce_op_name(op)) + ")");
}

// Every dtype but bool, whose ops map onto Or/And instead.
template <typename Op>
void run_numeric(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DataType::kUInt8:
      return run<uint8_t, Op>(dst, a, b, n);
    case DataType::kInt8:
      return run<int8_t, Op>(dst, a, b, n);
    case DataType::kInt16:
      return run<int16_t, Op>(dst, a, b, n);
    case DataType::kInt32:
      return run<int32_t, Op>(dst, a, b, n);
    case DataType::kInt64:
      return run<int64_t, Op>(dst, a, b, n);
    case DataType::kUInt16:
      return run<uint16_t, Op>(dst, a, b, n);
    case DataType::kUInt32:
      return run<uint32_t, Op>(dst, a, b, n);
    case DataType::kUInt64:
      return run<uint64_t, Op>(dst, a, b, n);
    case DataType::kFloat16:
      return run16<HalfFormat, Op>(dst, a, b, n);
    case DataType::kBFloat16:
      return run16<BFloat16Format, Op>(dst, a, b, n);
    case DataType::kFloat32:
      return run<float, Op>(dst, a, b, n);
    case DataType::kFloat64:
      return run<double, Op>(dst, a, b, n);
    case DataType::kBool:
      break;
  }
  fail(dtype, op);
}

}  // namespace

void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  if (dtype == DataType::kBool) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage:
      case ReduceOp::kMax:
        return run<uint8_t, ops::Or>(dst, a, b, count);
      case ReduceOp::kMin:
      case ReduceOp::kProduct:
        return run<uint8_t, ops::And>(dst, a, b, count);
      case ReduceOp::kAdasum:
        break;
    }
    fail(dtype, op);
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return run_numeric<ops::Sum>(dtype, op, dst, a, b, count);
    case ReduceOp::kMin:
      return run_numeric<ops::Min>(dtype, op, dst, a, b, count);
    case ReduceOp::kMax:
      return run_numeric<ops::Max>(dtype, op, dst, a, b, count);
    case ReduceOp::kProduct:
      return run_numeric<ops::Product>(dtype, op, dst, a, b, count);
    case ReduceOp::kAdasum:
      break;
  }
  fail(dtype, op);
}

void reduce_into(DataType dtype, ReduceOp op, void* dst, const void* src, size_t count) {
  reduce(dtype, op, dst, dst, src, count);
}

}  // namespace krug::reduce
