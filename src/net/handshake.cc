// Challenge-response authentication: the server sends a fresh random nonce, the client answers
// HMAC-SHA256(secret, nonce). The secret itself never crosses the wire, and a recorded answer
// is useless for the next connection because the nonce changes.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fmt/format.h>

#include "net/socket.h"

namespace krug::net {
namespace {

constexpr size_t kNonceSize = 32;
constexpr size_t kMacSize = 32;  // SHA-256
constexpr uint8_t kAccepted = 1;
constexpr uint8_t kRejected = 0;
// Handshake frames are tiny; refuse anything bigger from a peer we do not trust yet.
constexpr size_t kMaxHandshakeFrame = 4096;

std::vector<uint8_t> hmac_sha256(const std::string& secret, const std::vector<uint8_t>& msg) {
  std::vector<uint8_t> mac(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(), msg.size(),
            mac.data(), &len))
    throw NetError("HMAC-SHA256 failed");
  mac.resize(len);
  return mac;
}

void send_verdict(Connection& conn, std::optional<std::string> reason, const Deadline& deadline) {
  Writer w;
  w.u8(reason ? kRejected : kAccepted);
  if (reason) w.str(*reason);
  conn.send_frame(w.data(), deadline);
}

}  // namespace

void Connection::authenticate_as_client(const std::string& secret, const Deadline& deadline) {
  auto nonce = recv_frame(deadline, kMaxHandshakeFrame);
  if (nonce.size() != kNonceSize)
    throw NetError(fmt::format("handshake with {}: expected a {}-byte nonce, got {} bytes "
                               "(is it a krug server?)", peer_, kNonceSize, nonce.size()));
  send_frame(hmac_sha256(secret, nonce), deadline);
  auto verdict = recv_frame(deadline, kMaxHandshakeFrame);
  Reader r(verdict);
  if (r.u8() == kAccepted) return;
  std::string reason = r.str();
  close();
  throw NetError(fmt::format("{} rejected the handshake: {}", peer_, reason));
}

std::optional<std::string> Connection::authenticate_as_server(const std::string& secret,
                                                              const Deadline& deadline) {
  std::optional<std::string> reason;
  try {
    std::vector<uint8_t> nonce(kNonceSize);
    if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1)
      throw NetError("RAND_bytes failed to produce a nonce");
    send_frame(nonce, deadline);
    auto answer = recv_frame(deadline, kMaxHandshakeFrame);
    if (!secret.empty()) {  // an empty secret accepts everyone, but keeps the same exchange
      auto expected = hmac_sha256(secret, nonce);
      if (answer.size() != kMacSize)
        reason = fmt::format("malformed handshake answer ({} bytes, expected {})", answer.size(),
                             kMacSize);
      else if (CRYPTO_memcmp(answer.data(), expected.data(), kMacSize) != 0)
        reason = "wrong job secret (HMAC mismatch)";
    }
    send_verdict(*this, reason, deadline);
  } catch (const Stopped&) {
    close();
    throw;  // our own stop, not the peer's failure: nothing to report about the peer
  } catch (const NetError& e) {
    reason = std::string("handshake failed: ") + e.what();
  }
  if (reason) close();
  return reason;
}

}  // namespace krug::net
