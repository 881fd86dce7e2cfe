// The element count of a dense tensor's shape: what every layer computes from a request, a
// response or a view (1 for a scalar's empty shape).
#pragma once

#include <cstdint>
#include <span>

namespace krug {

inline int64_t shape_elements(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace krug
