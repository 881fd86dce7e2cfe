// Slow, obviously-correct reference conversions for the 16-bit float formats, written from the
// IEEE definitions with ldexp/frexp/nearbyint and no bit tricks, so the tests do not check the
// kernels against themselves.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace krug::reduce::ref {

struct Format16 {
  int man_bits;
  int exp_bits;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  int exp_all_ones() const { return (1 << exp_bits) - 1; }
};
inline constexpr Format16 kHalf{10, 5};
inline constexpr Format16 kBFloat16{7, 8};

inline bool ref_is_nan(uint16_t bits, Format16 fmt) {
  const int e = (bits >> fmt.man_bits) & fmt.exp_all_ones();
  const int m = bits & ((1 << fmt.man_bits) - 1);
  return e == fmt.exp_all_ones() && m != 0;
}

inline double ref_decode(uint16_t bits, Format16 fmt) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int e = (bits >> fmt.man_bits) & fmt.exp_all_ones();
  const int m = bits & ((1 << fmt.man_bits) - 1);
  if (e == fmt.exp_all_ones()) {
    return m != 0 ? std::numeric_limits<double>::quiet_NaN()
                  : sign * std::numeric_limits<double>::infinity();
  }
  if (e == 0) return sign * std::ldexp(m, 1 - fmt.bias() - fmt.man_bits);
  return sign * std::ldexp(m + (1 << fmt.man_bits), e - fmt.bias() - fmt.man_bits);
}

// Nearest representable value, ties to even (nearbyint in the default rounding mode). NaN maps
// to the canonical quiet NaN; callers compare NaNs with ref_is_nan.
inline uint16_t ref_encode(double x, Format16 fmt) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const uint16_t inf = static_cast<uint16_t>(fmt.exp_all_ones() << fmt.man_bits);
  if (std::isnan(x)) return static_cast<uint16_t>(inf | (1 << (fmt.man_bits - 1)));
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | inf;
  if (a == 0) return sign;
  const int emin = 1 - fmt.bias();
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e with f in [0.5, 1)
  int exp = std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, exp - fmt.man_bits);
  double m = std::nearbyint(a / quantum);        // a / quantum is exact: quantum is a power of two
  if (m == std::ldexp(1.0, fmt.man_bits + 1)) {  // rounded up into the next binade
    m /= 2;
    ++exp;
  }
  if (exp > fmt.bias()) return sign | inf;
  const int mi = static_cast<int>(m);
  if (mi < (1 << fmt.man_bits)) return static_cast<uint16_t>(sign | mi);  // subnormal or zero
  return static_cast<uint16_t>(sign | ((exp + fmt.bias()) << fmt.man_bits) |
                               (mi - (1 << fmt.man_bits)));
}

}  // namespace krug::reduce::ref
