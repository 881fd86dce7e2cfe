#include "net/cipher.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <climits>

#include "net/frame_length.h"
#include "net/socket.h"

namespace krug::net {
namespace {

constexpr size_t kIvSize = 12;  // GCM's native nonce: no extra hashing of the IV
constexpr size_t kHeaderSize = kFrameLengthSize;

void check(int ok, const char* what) {
  if (ok != 1) throw NetError(fmt::format("AES-256-GCM: {} failed", what));
}

int as_int(size_t n) {
  if (n > static_cast<size_t>(INT_MAX)) throw NetError("AES-256-GCM: record too large");
  return static_cast<int>(n);
}

}  // namespace

struct Aead::Ctx {
  struct Free {
    void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
  };
  std::unique_ptr<EVP_CIPHER_CTX, Free> ctx{EVP_CIPHER_CTX_new()};
};

Aead::Aead(std::span<const uint8_t> key, bool sealing) : ctx_(std::make_unique<Ctx>()) {
  if (key.size() != kKeySize) throw NetError("AES-256-GCM: the key must be 32 bytes");
  if (!ctx_->ctx) throw NetError("AES-256-GCM: out of memory");
  // The key schedule is computed once; each record only sets its nonce.
  check(EVP_CipherInit_ex(ctx_->ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), nullptr,
                          sealing ? 1 : 0),
        "setting the key");
}

Aead::Aead(Aead&&) noexcept = default;
Aead& Aead::operator=(Aead&&) noexcept = default;
Aead::~Aead() = default;

void Aead::start_record(bool sealing) {
  // The record's number is its nonce: 4 zero bytes, then 8 little-endian bytes. 2^64 records
  // of one connection cannot be reached, so a nonce is never used twice with a key.
  uint8_t iv[kIvSize] = {};
  for (size_t i = 0; i < 8; ++i) iv[4 + i] = static_cast<uint8_t>(records_ >> (8 * i));
  ++records_;
  check(EVP_CipherInit_ex(ctx_->ctx.get(), nullptr, nullptr, nullptr, iv, sealing ? 1 : 0),
        "setting the nonce");
}

void Aead::seal(std::span<const uint8_t> aad, const uint8_t* in, size_t n, uint8_t* out,
                uint8_t* tag) {
  EVP_CIPHER_CTX* c = ctx_->ctx.get();
  start_record(true);
  int len = 0;
  if (!aad.empty())
    check(EVP_EncryptUpdate(c, nullptr, &len, aad.data(), as_int(aad.size())), "aad");
  if (n > 0) check(EVP_EncryptUpdate(c, out, &len, in, as_int(n)), "encrypting");
  check(EVP_EncryptFinal_ex(c, out + n, &len), "finishing a record");
  check(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTagSize), tag),
        "reading the tag");
}

bool Aead::open(std::span<const uint8_t> aad, uint8_t* data, size_t n, const uint8_t* tag) {
  EVP_CIPHER_CTX* c = ctx_->ctx.get();
  start_record(false);
  int len = 0;
  if (!aad.empty())
    check(EVP_DecryptUpdate(c, nullptr, &len, aad.data(), as_int(aad.size())), "aad");
  if (n > 0) check(EVP_DecryptUpdate(c, data, &len, data, as_int(n)), "decrypting");
  check(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kTagSize),
                            const_cast<uint8_t*>(tag)),
        "setting the tag");
  return EVP_DecryptFinal_ex(c, data + n, &len) == 1;
}

void append_sealed_frame(Aead& send, const void* data, size_t size, std::vector<uint8_t>& out) {
  const size_t start = out.size();
  out.resize(start + kHeaderSize + size + kTagSize);
  uint8_t* header = out.data() + start;
  write_frame_length(size + kTagSize, header);
  send.seal({header, kHeaderSize}, static_cast<const uint8_t*>(data), size, header + kHeaderSize,
            header + kHeaderSize + size);
}

void open_sealed_frames(Aead& recv, std::vector<uint8_t>& sealed, std::vector<uint8_t>& plain,
                        size_t max_size) {
  size_t pos = 0;
  while (sealed.size() - pos >= kHeaderSize) {
    uint8_t* header = sealed.data() + pos;
    const size_t len = read_frame_length(header);
    // Bound what the peer can make us buffer before anything is authenticated.
    if (len < kTagSize || len - kTagSize > max_size)
      throw NetError(fmt::format(
          "sealed frame of {} bytes is malformed or exceeds the {} byte limit", len, max_size));
    if (sealed.size() - pos - kHeaderSize < len) break;
    const size_t n = len - kTagSize;
    uint8_t* payload = header + kHeaderSize;
    if (!recv.open({header, kHeaderSize}, payload, n, payload + n))
      throw NetError("a frame failed authentication (altered, replayed or not this job's key)");
    const size_t at = plain.size();
    plain.resize(at + kHeaderSize + n);
    write_frame_length(n, plain.data() + at);
    std::copy(payload, payload + n, plain.data() + at + kHeaderSize);
    pos += kHeaderSize + len;
  }
  sealed.erase(sealed.begin(), sealed.begin() + static_cast<std::ptrdiff_t>(pos));
}

}  // namespace krug::net
