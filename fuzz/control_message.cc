// The control-plane codec (controller/message.h) on untrusted bytes, as the engine's control
// plane decodes every peer's frame (engine/control_plane.cc). Any bytes either decode or throw
// krug::Error (net::NetError for a truncated frame); a list that decodes encodes to bytes that
// decode and encode to the same bytes again. (Bytes, not messages, are compared: a NaN scale
// factor is equal to itself only as bytes.)
#include <cstddef>
#include <cstdint>
#include <vector>

#include "controller/message.h"
#include "krug/types.h"

namespace {

template <typename Decode>
void check_round_trip(const std::vector<uint8_t>& bytes, Decode decode) {
  std::vector<uint8_t> once;
  try {
    once = encode(decode(bytes));
  } catch (const krug::Error&) {
    return;  // malformed: the documented outcome
  }
  if (encode(decode(once)) != once) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  check_round_trip(bytes, krug::controller::decode_request_list);
  check_round_trip(bytes, krug::controller::decode_response_list);
  return 0;
}
