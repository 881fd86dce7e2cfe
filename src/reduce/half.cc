// Public float16/bfloat16 conversions. The bulk loops are what the kernels use; the portable ones
// take __restrict pointers so the compiler vectorizes them without runtime overlap checks.
#include "reduce/half_bits.h"
#include "reduce/half_bulk.h"
#include "reduce/reduce.h"

namespace krug::reduce {

float half_to_float(uint16_t h) {
  return bits::half_to_float(h);
}
uint16_t float_to_half(float f) {
  return bits::float_to_half(f);
}
float bfloat16_to_float(uint16_t b) {
  return bits::bfloat16_to_float(b);
}
uint16_t float_to_bfloat16(float f) {
  return bits::float_to_bfloat16(f);
}

void detail::half_to_float_n_portable(const uint16_t* __restrict src, float* __restrict dst,
                                      size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = bits::half_to_float(src[i]);
}

void detail::float_to_half_n_portable(const float* __restrict src, uint16_t* __restrict dst,
                                      size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = bits::float_to_half(src[i]);
}

void half_to_float_n(const uint16_t* src, float* dst, size_t count) {
  if (detail::has_f16c()) return detail::half_to_float_n_f16c(src, dst, count);
  detail::half_to_float_n_portable(src, dst, count);
}

void float_to_half_n(const float* src, uint16_t* dst, size_t count) {
  if (detail::has_f16c()) return detail::float_to_half_n_f16c(src, dst, count);
  detail::float_to_half_n_portable(src, dst, count);
}

// bfloat16 has no conversion instructions before AVX-512 BF16; the shifts vectorize well.
void bfloat16_to_float_n(const uint16_t* __restrict src, float* __restrict dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = bits::bfloat16_to_float(src[i]);
}

void float_to_bfloat16_n(const float* __restrict src, uint16_t* __restrict dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = bits::float_to_bfloat16(src[i]);
}

}  // namespace krug::reduce
