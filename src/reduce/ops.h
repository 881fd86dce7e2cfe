// Element-wise semantics of each reduction, written as plain expressions and selects so the loops
// in reduce.cc auto-vectorize.
#pragma once

#include <cstdint>
#include <type_traits>

namespace krug::reduce::ops {

// Integer arithmetic is done in an unsigned type at least as wide as unsigned int, so overflow
// wraps instead of being undefined (int8/int16 would otherwise promote to signed int).
template <typename T>
using Wrap = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct Sum {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return a + b;
    } else {
      return static_cast<T>(static_cast<Wrap<T>>(a) + static_cast<Wrap<T>>(b));
    }
  }
};

struct Product {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return a * b;
    } else {
      return static_cast<T>(static_cast<Wrap<T>>(a) * static_cast<Wrap<T>>(b));
    }
  }
};

// Min/max propagate NaN from either side (like torch.minimum). On ties they return a, like
// std::min/std::max, which fixes the sign of min(+0, -0). `|` rather than `||` keeps the
// condition free of branches.
struct Min {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return ((b < a) | (b != b)) ? b : a;
    } else {
      return b < a ? b : a;
    }
  }
};

struct Max {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return ((a < b) | (b != b)) ? b : a;
    } else {
      return a < b ? b : a;
    }
  }
};

// Bool elements are bytes; any nonzero byte is true and results are written as 0 or 1.
struct Or {
  static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a | b) != 0); }
};

struct And {
  static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) & (b != 0)); }
};

}  // namespace krug::reduce::ops
