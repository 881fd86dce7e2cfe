// The listening end of krug's TCP data plane: one socket per engine, shared by every TCP
// communicator of that engine.
//
// Connections are made when a communicator first needs them (tcp_links.h), and each one proves
// the job secret both ways before it carries a byte of data (net::Connection's mutual
// handshake), then names the communicator and member it belongs to. A connection that fails the
// proof is logged with the peer's address and dropped; the job never sees it. Handshakes run on
// their own threads, at most kMaxPendingHandshakes at once and each within a deadline
// (kHandshakeTimeout), so a peer that connects and stalls cannot hold the listener; while the
// slots are full, new connections are closed at once, and members' dials retry (tcp_links.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "net/socket.h"

namespace krug::collectives::tcp {

inline constexpr size_t kMaxPendingHandshakes = 64;
inline constexpr std::chrono::seconds kHandshakeTimeout{10};

class Device {
 public:
  // Listens on `bind_host` (an address of this host that the other ranks can reach) at a free
  // port. `secret`: the job secret every connection must prove (empty: no authentication).
  // `rank`: this process's rank, for log lines. `handshake_timeout`: how long a connection may
  // take to prove the secret (tests shorten it). `protection`: whether connections are also
  // encrypted (KRUG_ENCRYPT=1), on both ends.
  Device(const std::string& bind_host, std::string secret, int rank,
         std::chrono::milliseconds handshake_timeout = kHandshakeTimeout,
         net::Protection protection = net::Protection::kAuthenticate);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // "host:port", what peers dial.
  const std::string& address() const { return address_; }

  // Dials `address` ("host:port") and introduces this end as member `from` of communicator
  // `name`. Throws net::NetError naming the address when it cannot connect or authenticate.
  net::Connection dial(const std::string& address, const std::string& name, int from,
                       net::Clock::time_point deadline) const {
    return dial(address, secret_, protection_, name, from, deadline);
  }
  // The same from a process that has no Device of its own (a rank dialling the control plane).
  static net::Connection dial(const std::string& address, const std::string& secret,
                              net::Protection protection, const std::string& name, int from,
                              const net::Deadline& deadline);
  // The connection member `from` of communicator `name` dialled to this device, waited for until
  // `deadline` (then throws net::NetError, or net::Stopped once its stop is requested).
  net::Connection take(const std::string& name, int from, const net::Deadline& deadline);

 private:
  void accept_loop(const std::stop_token& stop);
  void handshake(net::Connection conn, const std::stop_token& stop);
  void reap_finished_handshakes();

  std::string secret_;
  int rank_;
  std::chrono::milliseconds handshake_timeout_;
  net::Protection protection_;
  net::Listener listener_;
  std::string address_;

  std::mutex mu_;
  std::condition_variable arrived_cv_;
  std::map<std::pair<std::string, int>, net::Connection> arrived_;
  // Handshakes in flight, each on its own thread; finished ones are joined by the accept loop.
  struct Handshake {
    std::jthread thread;
    bool finished = false;
  };
  std::list<Handshake> handshakes_;
  std::jthread acceptor_;  // last: it uses everything above
};

}  // namespace krug::collectives::tcp
