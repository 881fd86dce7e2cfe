// The rendezvous server krugrun runs for a job: a key-value store over authenticated TCP.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include "net/socket.h"
#include "rendezvous/store.h"

namespace krug::rendezvous {

class RendezvousServer {
 public:
  // Listens on bind_host:port (port 0 = any free port) and serves until destroyed. Clients must
  // prove `secret` (HMAC handshake); rejected clients are logged through `log` with the reason.
  // With Protection::kEncrypt, every client must encrypt too (KRUG_ENCRYPT=1).
  RendezvousServer(const std::string& bind_host, uint16_t port, std::string secret,
                   std::function<void(const std::string&)> log = {},
                   net::Protection protection = net::Protection::kAuthenticate);
  ~RendezvousServer();  // stops the server thread and closes every connection
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  uint16_t port() const;
  // Number of clients rejected by the handshake so far, each counted after its log line (tests
  // use it).
  int rejected_clients() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Store implementation talking to a RendezvousServer. Thread-safe. Throws krug::Error with the
// server address when the server cannot be reached or refuses the secret.
class RendezvousClient : public Store {
 public:
  // Every wait of this client (connecting, and each request until release_stop()) also ends
  // once `stop` is requested, throwing krug::Error: what makes init() interruptible.
  RendezvousClient(const std::string& host, uint16_t port, const std::string& secret,
                   std::chrono::milliseconds connect_timeout, std::stop_token stop = {},
                   net::Protection protection = net::Protection::kAuthenticate);
  ~RendezvousClient() override;
  // Later requests no longer watch the constructor's `stop`: init() is over, and a stop
  // requested after it must not break the job's store.
  void release_stop();
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  void erase(const std::string& key) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A random secret (hex, 256 bits from the OS RNG) for a new job.
std::string make_job_secret();

}  // namespace krug::rendezvous
