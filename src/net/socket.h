// TCP sockets with deadlines, length-prefixed frames and an HMAC challenge-response handshake.
//
// Used by the rendezvous store and the engine's control plane. Every blocking call takes a
// deadline and throws NetError when it passes or the peer goes away; nothing blocks forever.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "krug/types.h"
#include "net/cipher.h"

namespace krug::net {

using Clock = std::chrono::steady_clock;

// When a blocking call gives up: at a time, or sooner once `stop` is requested (a binding whose
// user pressed Ctrl-C during init()). A wait with a stop token looks at it every kStopCheck.
struct Deadline {
  Deadline(Clock::time_point at) : at(at) {}  // NOLINT(google-explicit-constructor): most waits
  Deadline(Clock::time_point at, std::stop_token stop) : at(at), stop(std::move(stop)) {}
  Clock::time_point at;
  std::stop_token stop;
};
inline constexpr std::chrono::milliseconds kStopCheck{50};

class NetError : public Error {
 public:
  using Error::Error;
};

// Thrown by a wait whose Deadline's stop was requested.
class Stopped : public NetError {
 public:
  using NetError::NetError;
};

// The peer closed the connection (end of stream or reset) while we read from it.
class PeerClosed : public NetError {
 public:
  using NetError::NetError;
};

// A server closed a new connection before its handshake began: its listener has all its
// handshake slots taken (strangers that connect and stall), or it is not a krug server. Waiting
// and dialling again helps in the first case; dial_authenticated does.
class ListenerBusy : public NetError {
 public:
  using NetError::NetError;
};

// Largest frame sent or accepted (bounds what a peer can make us allocate).
inline constexpr size_t kMaxFrameSize = size_t{1} << 30;

// What a connection's handshake sets up: proof of the job secret only, or also encryption of
// every byte after it (KRUG_ENCRYPT=1). Both ends must ask for the same.
enum class Protection : uint8_t { kAuthenticate, kEncrypt };
inline Protection protection_for(bool encrypt) {
  return encrypt ? Protection::kEncrypt : Protection::kAuthenticate;
}

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept;
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// A connected TCP stream carrying frames: 4-byte little-endian length + payload.
class Connection {
 public:
  Connection() = default;
  explicit Connection(Fd fd, std::string peer) : fd_(std::move(fd)), peer_(std::move(peer)) {}

  // Connects to host:port, retrying refused connections until the deadline (the peer may not
  // be listening yet). Throws NetError naming host:port on failure.
  static Connection connect(const std::string& host, uint16_t port, const Deadline& deadline);

  void send_frame(const void* data, size_t size, const Deadline& deadline);
  void send_frame(const std::vector<uint8_t>& frame, const Deadline& deadline) {
    send_frame(frame.data(), frame.size(), deadline);
  }
  // Throws NetError on EOF ("peer closed the connection") or timeout.
  std::vector<uint8_t> recv_frame(const Deadline& deadline);
  // Same, rejecting frames longer than max_size (used before the peer is authenticated).
  std::vector<uint8_t> recv_frame(const Deadline& deadline, size_t max_size);

  // Client side of the mutual handshake (handshake.cc): proves knowledge of `secret` and checks
  // the server proves it too. Throws NetError with the server's reason if rejected, or naming
  // the peer if the server cannot prove the secret. With Protection::kEncrypt, every frame after
  // it is sealed (cipher.h), and the server must encrypt too.
  void authenticate_as_client(const std::string& secret, const Deadline& deadline,
                              Protection protection = Protection::kAuthenticate);
  // Server side: returns std::nullopt on success (the client then holds the server's proof), or
  // the reason the peer was rejected (the connection is then closed). An empty secret accepts
  // everyone. A client that does not ask for the same protection is rejected. A stop of
  // `deadline` is not the peer's fault: it closes the connection and throws Stopped.
  std::optional<std::string> authenticate_as_server(
      const std::string& secret, const Deadline& deadline,
      Protection protection = Protection::kAuthenticate);
  // The connection's keys when its handshake set up encryption, else null. Code that moves
  // bytes on fd() itself must seal and open them with it (send_frame and recv_frame do).
  Cipher* cipher() { return cipher_.get(); }

  int fd() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }
  const std::string& peer() const { return peer_; }
  void close() { fd_.reset(); }

 private:
  void recv_exact(void* out, size_t size, Clock::time_point started, const Deadline& deadline);
  void send_all(const void* header, size_t header_size, const void* data, size_t size,
                const Deadline& deadline);
  Fd fd_;
  std::string peer_;
  std::unique_ptr<Cipher> cipher_;
};

// Connects to host:port and runs the client's handshake, dialling again with backoff while the
// server is not listening yet or closes new connections unheard (ListenerBusy), until the
// deadline. Other failures (a rejected proof, a server that cannot prove the secret) are thrown
// at once.
Connection dial_authenticated(const std::string& host, uint16_t port, const std::string& secret,
                              const Deadline& deadline,
                              Protection protection = Protection::kAuthenticate);

// A listening TCP socket. Port 0 picks a free port.
class Listener {
 public:
  Listener(const std::string& bind_host, uint16_t port);
  uint16_t port() const { return port_; }
  int fd() const { return fd_.get(); }
  // Returns std::nullopt if nothing arrived before the deadline.
  std::optional<Connection> accept(const Deadline& deadline);

 private:
  Fd fd_;
  uint16_t port_ = 0;
};

// This machine's host name (gethostname), used in error messages.
std::string hostname();

// Helpers to build and parse frames.
class Writer {
 public:
  void u8(uint8_t v) { bytes_.push_back(v); }
  void u32(uint32_t v);
  void u64(uint64_t v);
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f64(double v);
  void str(std::string_view s);
  void bytes(const void* data, size_t size);
  std::vector<uint8_t>& data() { return bytes_; }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads what Writer wrote; throws NetError("truncated message") on short input.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  explicit Reader(const std::vector<uint8_t>& v) : Reader(v.data(), v.size()) {}
  // Reader borrows the bytes: reading a temporary would dangle.
  explicit Reader(std::vector<uint8_t>&&) = delete;
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  int64_t i64() { return static_cast<int64_t>(u64()); }
  double f64();
  std::string str();
  std::vector<uint8_t> bytes();
  // A list's length (u32) whose elements take at least `min_bytes_each` on the wire: throws
  // NetError when the rest of the message cannot hold that many, before the caller allocates
  // for them (a hostile or corrupt length would otherwise ask for gigabytes).
  size_t count(size_t min_bytes_each);
  bool done() const { return pos_ == size_; }

 private:
  void need(size_t n) const;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace krug::net
