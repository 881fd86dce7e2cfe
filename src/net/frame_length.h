// The length that starts every frame on krug's TCP streams (plain and sealed, the rendezvous
// store's and the control plane's alike): 4 bytes, little-endian, whatever the host's order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace krug::net {

inline constexpr size_t kFrameLengthSize = 4;

inline void write_frame_length(size_t length, uint8_t* out) {
  for (size_t i = 0; i < kFrameLengthSize; ++i) out[i] = static_cast<uint8_t>(length >> (8 * i));
}

inline void append_frame_length(size_t length, std::vector<uint8_t>& out) {
  const size_t at = out.size();
  out.resize(at + kFrameLengthSize);
  write_frame_length(length, out.data() + at);
}

inline size_t read_frame_length(const uint8_t* in) {
  size_t length = 0;
  for (size_t i = 0; i < kFrameLengthSize; ++i) length |= size_t{in[i]} << (8 * i);
  return length;
}

}  // namespace krug::net
