// Mutual challenge-response authentication. Each side sends a fresh random nonce and proves the
// job secret with HMAC-SHA256 over both nonces, under a label naming its role:
//   server -> client: nonce_s
//   client -> server: nonce_c, HMAC(secret, "krug client" | nonce_s | nonce_c)
//   server -> client: accepted, HMAC(secret, "krug server" | nonce_c | nonce_s)  (or a reason)
// The secret never crosses the wire; a recorded answer is useless on the next connection because
// both nonces change; the labels keep one side's proof from being reflected as the other's; and
// a client never talks to a server that cannot prove the secret (a stray listener on the
// coordinator's address, say).
//
// A connection that is to be encrypted (Protection::kEncrypt) proves under labels of its own, so
// the two ends cannot disagree about it unnoticed, and takes its two keys (one per direction)
// from HMAC(secret, key label | nonce_s | nonce_c): fresh for every connection.
#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <string_view>
#include <thread>

#include "net/socket.h"

namespace krug::net {
namespace {

constexpr size_t kNonceSize = 32;
constexpr size_t kMacSize = 32;  // SHA-256
constexpr uint8_t kAccepted = 1;
constexpr uint8_t kRejected = 0;
constexpr std::string_view kClientLabel = "krug client";
constexpr std::string_view kServerLabel = "krug server";
constexpr std::string_view kEncryptingClientLabel = "krug client aes-256-gcm";
constexpr std::string_view kEncryptingServerLabel = "krug server aes-256-gcm";
constexpr std::string_view kClientToServerKey = "krug key client to server";
constexpr std::string_view kServerToClientKey = "krug key server to client";
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

// What a side proves: HMAC(secret, label | own-side-first nonces).
std::vector<uint8_t> proof(const std::string& secret, std::string_view label,
                           const std::vector<uint8_t>& first, const std::vector<uint8_t>& second) {
  std::vector<uint8_t> msg(label.begin(), label.end());
  msg.insert(msg.end(), first.begin(), first.end());
  msg.insert(msg.end(), second.begin(), second.end());
  return hmac_sha256(secret, msg);
}

std::vector<uint8_t> fresh_nonce() {
  std::vector<uint8_t> nonce(kNonceSize);
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1)
    throw NetError("RAND_bytes failed to produce a nonce");
  return nonce;
}

std::string_view client_label(Protection p) {
  return p == Protection::kEncrypt ? kEncryptingClientLabel : kClientLabel;
}

std::string_view server_label(Protection p) {
  return p == Protection::kEncrypt ? kEncryptingServerLabel : kServerLabel;
}

Protection other(Protection p) {
  return p == Protection::kEncrypt ? Protection::kAuthenticate : Protection::kEncrypt;
}

std::string describe(Protection p) {
  return p == Protection::kEncrypt ? "encrypts (KRUG_ENCRYPT=1)" : "does not encrypt";
}

std::unique_ptr<Cipher> make_cipher(const std::string& secret,
                                    const std::vector<uint8_t>& server_nonce,
                                    const std::vector<uint8_t>& client_nonce, bool client) {
  const auto to_server = proof(secret, kClientToServerKey, server_nonce, client_nonce);
  const auto to_client = proof(secret, kServerToClientKey, server_nonce, client_nonce);
  return std::make_unique<Cipher>(Cipher{Aead(client ? to_server : to_client, true),
                                         Aead(client ? to_client : to_server, false)});
}

bool same_mac(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  return a.size() == kMacSize && b.size() == kMacSize &&
         CRYPTO_memcmp(a.data(), b.data(), kMacSize) == 0;
}

void send_verdict(Connection& conn, std::optional<std::string> reason,
                  const std::vector<uint8_t>& server_proof, const Deadline& deadline) {
  Writer w;
  w.u8(reason ? kRejected : kAccepted);
  if (reason)
    w.str(*reason);
  else  // raw, to the end of the frame
    w.data().insert(w.data().end(), server_proof.begin(), server_proof.end());
  conn.send_frame(w.data(), deadline);
}

}  // namespace

void Connection::authenticate_as_client(const std::string& secret, const Deadline& deadline,
                                        Protection protection) {
  std::vector<uint8_t> server_nonce;
  try {
    server_nonce = recv_frame(deadline, kMaxHandshakeFrame);
  } catch (const PeerClosed&) {
    throw ListenerBusy(fmt::format(
        "{} closed the connection before the handshake began (its listener is busy with other "
        "connections, or it is not a krug server)",
        peer_));
  }
  if (server_nonce.size() != kNonceSize)
    throw NetError(
        fmt::format("handshake with {}: expected a {}-byte nonce, got {} bytes "
                    "(is it a krug server?)",
                    peer_, kNonceSize, server_nonce.size()));
  const auto client_nonce = fresh_nonce();
  std::vector<uint8_t> answer = client_nonce;
  const auto mine = proof(secret, client_label(protection), server_nonce, client_nonce);
  answer.insert(answer.end(), mine.begin(), mine.end());
  send_frame(answer, deadline);
  const auto verdict = recv_frame(deadline, kMaxHandshakeFrame);
  Reader r(verdict);
  if (r.u8() != kAccepted) {
    std::string reason = r.str();
    close();
    throw NetError(fmt::format("{} rejected the handshake: {}", peer_, reason));
  }
  const std::vector<uint8_t> theirs(verdict.begin() + 1, verdict.end());
  // With an empty secret (authentication off) there is nothing the server could prove.
  if (!secret.empty() &&
      !same_mac(theirs, proof(secret, server_label(protection), client_nonce, server_nonce))) {
    close();
    throw NetError(
        fmt::format("{} accepted the handshake but could not prove the job secret: it "
                    "is not this job's server (another process on that address?)",
                    peer_));
  }
  if (protection == Protection::kEncrypt)
    cipher_ = make_cipher(secret, server_nonce, client_nonce, /*client=*/true);
}

std::optional<std::string> Connection::authenticate_as_server(const std::string& secret,
                                                              const Deadline& deadline,
                                                              Protection protection) {
  std::optional<std::string> reason;
  try {
    const auto server_nonce = fresh_nonce();
    send_frame(server_nonce, deadline);
    const auto answer = recv_frame(deadline, kMaxHandshakeFrame);
    std::vector<uint8_t> client_nonce, theirs;
    if (answer.size() != kNonceSize + kMacSize) {
      reason = fmt::format("malformed handshake answer ({} bytes, expected {})", answer.size(),
                           kNonceSize + kMacSize);
    } else {
      client_nonce.assign(answer.begin(), answer.begin() + kNonceSize);
      theirs.assign(answer.begin() + kNonceSize, answer.end());
      // An empty secret accepts everyone, but keeps the same exchange.
      auto proves = [&](Protection p) {
        return same_mac(theirs, proof(secret, client_label(p), server_nonce, client_nonce));
      };
      if (!secret.empty() && !proves(protection))
        reason = proves(other(protection))
                     ? fmt::format(
                           "this server {} and the client {}: give every process of "
                           "the job the same KRUG_ENCRYPT",
                           describe(protection), describe(other(protection)))
                     : "wrong job secret (HMAC mismatch)";
    }
    send_verdict(*this, reason,
                 reason ? std::vector<uint8_t>{}
                        : proof(secret, server_label(protection), client_nonce, server_nonce),
                 deadline);
    if (!reason && protection == Protection::kEncrypt)
      cipher_ = make_cipher(secret, server_nonce, client_nonce, /*client=*/false);
  } catch (const Stopped&) {
    close();
    throw;  // our own stop, not the peer's failure: nothing to report about the peer
  } catch (const NetError& e) {
    reason = std::string("handshake failed: ") + e.what();
  }
  if (reason) close();
  return reason;
}

Connection dial_authenticated(const std::string& host, uint16_t port, const std::string& secret,
                              const Deadline& deadline, Protection protection) {
  for (auto backoff = std::chrono::milliseconds(10);;
       backoff = std::min(backoff * 2, std::chrono::milliseconds(500))) {
    auto conn = Connection::connect(host, port, deadline);
    try {
      conn.authenticate_as_client(secret, deadline, protection);
      return conn;
    } catch (const ListenerBusy& e) {
      if (Clock::now() + backoff >= deadline.at)
        throw ListenerBusy(std::string(e.what()) + "; gave up at the deadline");
    }
    std::this_thread::sleep_for(backoff);
    if (deadline.stop.stop_requested())
      throw Stopped(fmt::format("stopped (interrupted) while connecting to {}:{}", host, port));
  }
}

}  // namespace krug::net
