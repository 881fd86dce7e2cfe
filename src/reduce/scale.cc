// scale(): multiply a buffer by a factor in place (average = sum, then scale by 1/n).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "reduce/reduce.h"

namespace krug::reduce {
namespace {

// Horovod's rule, so that a ported script's results match it bit for bit: the factor is
// rounded to float32 first and the product is a float32 one ((float)f * x). Through double
// instead, x * f would be rounded once and differ from Horovod in the last bit for some x.
void scale_float(float* __restrict p, size_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (size_t i = 0; i < n; ++i) p[i] *= f;
}

void scale_double(double* __restrict p, size_t n, double factor) {
  for (size_t i = 0; i < n; ++i) p[i] *= factor;
}

template <void (*ToFloat)(const uint16_t*, float*, size_t),
          void (*FromFloat)(const float*, uint16_t*, size_t)>
void scale16(uint16_t* p, size_t n, double factor) {
  constexpr size_t kBlock = 256;
  const float f = static_cast<float>(factor);
  alignas(64) float buf[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    ToFloat(p + i, buf, m);
    for (size_t j = 0; j < m; ++j) buf[j] *= f;
    FromFloat(buf, p + i, m);
  }
}

// Horovod's rule, which scripts ported from it rely on (an integer Average is the sum times
// 1/n): the product in double, converted back toward zero. Out-of-range results saturate (where
// Horovod's cast is undefined) and NaN becomes 0. Double holds every bound exactly but the
// 64-bit maxima, which round up to 2^63 and 2^64, past any value the type holds, so the
// comparisons are exact.
template <typename T>
T scale_one(T v, double factor) {
  constexpr double kLo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double kHi = static_cast<double>(std::numeric_limits<T>::max());
  const double x = std::trunc(static_cast<double>(v) * factor);
  if (std::isnan(x)) return 0;
  if (x <= kLo) return std::numeric_limits<T>::min();
  if (x >= kHi) return std::numeric_limits<T>::max();
  return static_cast<T>(x);
}

template <typename T>
void scale_int(void* data, size_t n, double factor) {
  T* p = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i) p[i] = scale_one(p[i], factor);
}

}  // namespace

void scale(DataType dtype, void* data, size_t count, double factor) {
  if (factor == 1.0 || count == 0) return;
  switch (dtype) {
    case DataType::kUInt8:
      return scale_int<uint8_t>(data, count, factor);
    case DataType::kInt8:
      return scale_int<int8_t>(data, count, factor);
    case DataType::kInt16:
      return scale_int<int16_t>(data, count, factor);
    case DataType::kInt32:
      return scale_int<int32_t>(data, count, factor);
    case DataType::kInt64:
      return scale_int<int64_t>(data, count, factor);
    case DataType::kUInt16:
      return scale_int<uint16_t>(data, count, factor);
    case DataType::kUInt32:
      return scale_int<uint32_t>(data, count, factor);
    case DataType::kUInt64:
      return scale_int<uint64_t>(data, count, factor);
    case DataType::kFloat16:
      return scale16<half_to_float_n, float_to_half_n>(static_cast<uint16_t*>(data), count, factor);
    case DataType::kBFloat16:
      return scale16<bfloat16_to_float_n, float_to_bfloat16_n>(static_cast<uint16_t*>(data), count,
                                                               factor);
    case DataType::kFloat32:
      return scale_float(static_cast<float*>(data), count, factor);
    case DataType::kFloat64:
      return scale_double(static_cast<double*>(data), count, factor);
    case DataType::kBool:
      return;
  }
  throw Error("scale: unsupported data type " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace krug::reduce
