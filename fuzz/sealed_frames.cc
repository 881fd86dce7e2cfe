// Encrypted frames (KRUG_ENCRYPT=1, net/cipher.h) as a stranger or a corrupted path delivers them.
// The first byte picks the case:
//   0: the rest is a list of payloads (1-byte length each) sealed as frames, then opened in two
//      reads, which must give back exactly those payloads;
//   otherwise: the rest is opened as sealed bytes, in two reads, which must either throw
//      net::NetError or give well-formed plain frames (a forged tag never opens).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "net/cipher.h"
#include "net/socket.h"

namespace {

using krug::net::Aead;

const std::vector<uint8_t> kKey(krug::net::kKeySize, 0x5a);
constexpr size_t kMaxPayload = 1 << 16;

// Opens `sealed` fed in two parts as the server's read loop does; the plain frames, or false
// on NetError.
bool open_in_two_reads(const uint8_t* data, size_t size, std::vector<uint8_t>& plain) {
  Aead open(kKey, false);
  std::vector<uint8_t> pending(data, data + size / 2);
  try {
    krug::net::open_sealed_frames(open, pending, plain, kMaxPayload);
    pending.insert(pending.end(), data + size / 2, data + size);
    krug::net::open_sealed_frames(open, pending, plain, kMaxPayload);
  } catch (const krug::net::NetError&) {
    return false;
  }
  return true;
}

void check_plain_frames(const std::vector<uint8_t>& plain) {
  size_t pos = 0;
  while (pos < plain.size()) {
    if (plain.size() - pos < 4) __builtin_trap();
    size_t n = 0;
    for (size_t i = 0; i < 4; ++i) n |= size_t{plain[pos + i]} << (8 * i);
    if (n > kMaxPayload || plain.size() - pos - 4 < n) __builtin_trap();
    pos += 4 + n;
  }
}

void round_trip(const uint8_t* data, size_t size) {
  Aead seal(kKey, true);
  std::vector<uint8_t> sealed, expected;
  for (size_t pos = 0; pos < size;) {
    const size_t n = std::min<size_t>(data[pos], size - pos - 1);
    krug::net::append_sealed_frame(seal, data + pos + 1, n, sealed);
    for (size_t i = 0; i < 4; ++i) expected.push_back(static_cast<uint8_t>(n >> (8 * i)));
    expected.insert(expected.end(), data + pos + 1, data + pos + 1 + n);
    pos += 1 + n;
  }
  std::vector<uint8_t> plain;
  if (!open_in_two_reads(sealed.data(), sealed.size(), plain) || plain != expected)
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] == 0) {
    round_trip(data + 1, size - 1);
    return 0;
  }
  std::vector<uint8_t> plain;
  if (open_in_two_reads(data + 1, size - 1, plain)) check_plain_frames(plain);
  return 0;
}
