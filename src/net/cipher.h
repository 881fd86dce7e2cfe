// Encryption of a connection after its handshake (KRUG_ENCRYPT=1; docs/security.md).
//
// AES-256-GCM, one key per direction (derived by the handshake from the job secret and both of
// its nonces, so every connection has keys of its own), and a 96-bit nonce that counts the
// records sent in that direction. A record that was altered, dropped, repeated or reordered
// fails to open, because its nonce or tag no longer fits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace krug::net {

inline constexpr size_t kKeySize = 32;  // AES-256
inline constexpr size_t kTagSize = 16;  // GCM

// One direction of a connection: its key and how many records it has sealed or opened.
class Aead {
 public:
  Aead(std::span<const uint8_t> key, bool sealing);
  Aead(Aead&&) noexcept;
  Aead& operator=(Aead&&) noexcept;
  ~Aead();

  // Encrypts n bytes of `in` into `out` (which may be `in`) and writes the kTagSize-byte tag.
  // `aad` is authenticated but not encrypted.
  void seal(std::span<const uint8_t> aad, const uint8_t* in, size_t n, uint8_t* out, uint8_t* tag);
  // Decrypts n bytes in place. False when the record is not the next one sealed with this key.
  [[nodiscard]] bool open(std::span<const uint8_t> aad, uint8_t* data, size_t n,
                          const uint8_t* tag);

 private:
  void start_record(bool sealing);
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
  uint64_t records_ = 0;
};

// Both directions of one end of a connection.
struct Cipher {
  Aead send;
  Aead recv;
};

// Sealed frames: a 4-byte little-endian length (of what follows), the ciphertext and its tag.
// The length is authenticated with the record.
void append_sealed_frame(Aead& send, const void* data, size_t size, std::vector<uint8_t>& out);
// Opens every complete sealed frame at the front of `sealed` (removing it) and appends it to
// `plain` as a plain frame (length + payload). Throws NetError on a frame whose payload would
// exceed `max_size`, or one that does not open.
void open_sealed_frames(Aead& recv, std::vector<uint8_t>& sealed, std::vector<uint8_t>& plain,
                        size_t max_size);

}  // namespace krug::net
