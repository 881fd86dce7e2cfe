// The elastic protocol's text codecs (rendezvous/elastic_protocol.h) on untrusted text, as
// workers and the driver read each other's values from the rendezvous store. Any text either
// decodes or throws krug::Error; what decodes encodes to text that decodes and encodes to the
// same text again.
#include "rendezvous/elastic_protocol.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "krug/types.h"

namespace {

namespace elastic = krug::rendezvous::elastic;

template <typename Decode>
void check_round_trip(std::string_view text, Decode decode) {
  std::string once;
  try {
    once = elastic::encode(decode(text));
  } catch (const krug::Error&) {
    return;  // malformed: the documented outcome
  }
  if (elastic::encode(decode(once)) != once) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_round_trip(text, elastic::decode_assignment);
  check_round_trip(text, elastic::decode_hosts_version);
  check_round_trip(text, elastic::decode_health);
  return 0;
}
