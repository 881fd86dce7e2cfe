// Branch-free float32 <-> float16/bfloat16 conversions, inline so that the bulk loops in half.cc
// auto-vectorize: every case is computed and the answer picked with selects, never a branch.
#pragma once

#include <bit>
#include <cstdint>

namespace krug::reduce::bits {

// c ? a : b as masks. A ternary lets the compiler sink the float arithmetic of the unused arm
// into a branch, and a branch around a (possibly trapping) float op blocks vectorization.
inline uint32_t select(bool c, uint32_t a, uint32_t b) {
  return b ^ ((a ^ b) & (0u - static_cast<uint32_t>(c)));
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const uint32_t normal = (em << 13) + 0x38000000u;  // exponent bias 15 -> 127
  // NaNs come out quiet, as F16C's vcvtph2ps makes them, so both paths agree bit for bit.
  const uint32_t inf_nan = (em << 13) | select(em > 0x7c00u, 0x7fc00000u, 0x7f800000u);
  // A subnormal is mantissa * 2^-24; the int -> float conversion of the mantissa is exact.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(em)) * 0x1p-24f);
  uint32_t r = select(em >= 0x7c00u, inf_nan, normal);
  r = select(em < 0x0400u, subnormal, r);
  return std::bit_cast<float>(r | sign);
}

inline uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ua = x & 0x7fffffffu;
  // Signed compares: |x| fits in int32 and SSE2 has no unsigned vector compare.
  const int32_t a = static_cast<int32_t>(ua);
  // Rebias and round the 13 dropped bits to nearest even. A carry out of the mantissa correctly
  // bumps the exponent, up to infinity for values in [65520, 65536).
  const uint32_t normal = (ua - 0x38000000u + 0x0fffu + ((ua >> 13) & 1u)) >> 13;
  // Below 2^-14, adding 0.5 leaves the value in units of 2^-24 (the half subnormal step) in the
  // low mantissa bits, rounded to nearest even by the FPU.
  const uint32_t subnormal = std::bit_cast<uint32_t>(std::bit_cast<float>(ua) + 0.5f) - 0x3f000000u;
  // Keep the payload's top bits and force the quiet bit so the result stays a NaN.
  const uint32_t nan = 0x7e00u | ((ua >> 13) & 0x03ffu);
  uint32_t r = select(a < 0x38800000, subnormal, normal);  // 0x38800000 == 2^-14
  r = select(a >= 0x47800000, 0x7c00u, r);                 // 0x47800000 == 2^16
  r = select(a > 0x7f800000, nan, r);
  return static_cast<uint16_t>(r | sign);
}

inline float bfloat16_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t float_to_bfloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  // Round the low 16 bits to nearest even; a carry into the exponent gives infinity on overflow.
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  // Truncating a NaN could leave a zero mantissa (infinity): force the quiet bit.
  const uint32_t nan = (x >> 16) | 0x0040u;
  const int32_t a = static_cast<int32_t>(x & 0x7fffffffu);
  return static_cast<uint16_t>(select(a > 0x7f800000, nan, rounded));
}

}  // namespace krug::reduce::bits
