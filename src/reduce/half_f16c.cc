// float16 bulk conversions with the F16C instructions, eight elements per instruction: several
// times faster than the portable bit manipulation, which is limited to SSE2. Both round to
// nearest even and quiet NaNs the same way, so results do not depend on the CPU.
#include "reduce/half_bulk.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <cstring>

namespace krug::reduce::detail {
namespace {
constexpr size_t kLanes = 8;
}  // namespace

bool has_f16c() {
  static const bool supported = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return supported;
}

__attribute__((target("avx,f16c"))) void half_to_float_n_f16c(const uint16_t* src, float* dst,
                                                              size_t count) {
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  if (i == count) return;
  // The tail goes through a padded block so that it is converted by the same instruction.
  uint16_t in[kLanes] = {};
  float out[kLanes];
  std::memcpy(in, src + i, (count - i) * sizeof(uint16_t));
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in))));
  std::memcpy(dst + i, out, (count - i) * sizeof(float));
}

__attribute__((target("avx,f16c"))) void float_to_half_n_f16c(const float* src, uint16_t* dst,
                                                              size_t count) {
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  if (i == count) return;
  float in[kLanes] = {};
  uint16_t out[kLanes];
  std::memcpy(in, src + i, (count - i) * sizeof(float));
  const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in), _MM_FROUND_TO_NEAREST_INT);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), h);
  std::memcpy(dst + i, out, (count - i) * sizeof(uint16_t));
}

}  // namespace krug::reduce::detail

#else  // Not x86: there is no F16C; the portable path serves every call.

namespace krug::reduce::detail {

bool has_f16c() {
  return false;
}
void half_to_float_n_f16c(const uint16_t* src, float* dst, size_t count) {
  half_to_float_n_portable(src, dst, count);
}
void float_to_half_n_f16c(const float* src, uint16_t* dst, size_t count) {
  float_to_half_n_portable(src, dst, count);
}

}  // namespace krug::reduce::detail

#endif
