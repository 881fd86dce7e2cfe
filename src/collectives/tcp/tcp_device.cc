#include "collectives/tcp/tcp_device.h"

#include <fmt/format.h>

#include <vector>

#include "common/log.h"
#include "net/address.h"

namespace krug::collectives::tcp {
namespace {

// A hello names the communicator (a store prefix) and the member: a few hundred bytes at most.
constexpr size_t kMaxHelloBytes = 4096;

}  // namespace

Device::Device(const std::string& bind_host, std::string secret, int rank,
               std::chrono::milliseconds handshake_timeout, net::Protection protection)
    : secret_(std::move(secret)),
      rank_(rank),
      handshake_timeout_(handshake_timeout),
      protection_(protection),
      listener_(bind_host, 0),
      address_(net::join_host_port(bind_host, listener_.port())),
      acceptor_([this](const std::stop_token& stop) { accept_loop(stop); }) {}

Device::~Device() {
  acceptor_.request_stop();
  acceptor_.join();
  // Each handshake thread sees its stop within net::kStopCheck; the list's destructor joins them.
  std::lock_guard lock(mu_);
  for (auto& h : handshakes_) h.thread.request_stop();
}

void Device::accept_loop(const std::stop_token& stop) {
  while (!stop.stop_requested()) {
    std::optional<net::Connection> conn;
    try {
      conn = listener_.accept(net::Deadline(net::Clock::now() + std::chrono::seconds(1), stop));
    } catch (const net::Stopped&) {
      return;
    } catch (const std::exception& e) {
      log::at(log::Level::kWarning, rank_, "listener {}: accept failed: {}", address_, e.what());
      continue;
    }
    reap_finished_handshakes();
    if (!conn) continue;
    std::lock_guard lock(mu_);
    if (handshakes_.size() >= kMaxPendingHandshakes) {
      log::at(log::Level::kWarning, rank_, "listener {}: refused {}: {} handshakes already pending",
              address_, conn->peer(), kMaxPendingHandshakes);
      continue;
    }
    auto it = handshakes_.emplace(handshakes_.end());
    it->thread = std::jthread([this, it, c = std::move(*conn)](const std::stop_token& st) mutable {
      handshake(std::move(c), st);
      std::lock_guard done(mu_);
      it->finished = true;
    });
  }
}

void Device::reap_finished_handshakes() {
  std::list<Handshake> finished;
  {
    std::lock_guard lock(mu_);
    for (auto it = handshakes_.begin(); it != handshakes_.end();) {
      auto next = std::next(it);
      if (it->finished) finished.splice(finished.end(), handshakes_, it);
      it = next;
    }
  }
  // `finished` joins its threads here, outside the lock they took last.
}

void Device::handshake(net::Connection conn, const std::stop_token& stop) {
  const net::Deadline deadline(net::Clock::now() + handshake_timeout_, stop);
  const std::string peer = conn.peer();
  try {
    if (auto reason = conn.authenticate_as_server(secret_, deadline, protection_)) {
      log::at(log::Level::kWarning, rank_, "listener {}: rejected a connection from {}: {}",
              address_, peer, *reason);
      return;
    }
    const auto hello = conn.recv_frame(deadline, kMaxHelloBytes);
    net::Reader r(hello);
    std::string name = r.str();
    const auto from = static_cast<int>(r.u32());
    if (!r.done()) throw net::NetError("malformed hello");
    std::lock_guard lock(mu_);
    arrived_[{std::move(name), from}] = std::move(conn);
    arrived_cv_.notify_all();
  } catch (const net::Stopped&) {
  } catch (const std::exception& e) {
    log::at(log::Level::kWarning, rank_, "listener {}: dropped a connection from {}: {}", address_,
            peer, e.what());
  }
}

net::Connection Device::dial(const std::string& address, const std::string& secret,
                             net::Protection protection, const std::string& name, int from,
                             const net::Deadline& deadline) {
  const auto [host, port] = net::split_host_port(address);
  auto conn = net::dial_authenticated(host, port, secret, deadline, protection);
  net::Writer hello;
  hello.str(name);
  hello.u32(static_cast<uint32_t>(from));
  conn.send_frame(hello.take(), deadline);
  return conn;
}

net::Connection Device::take(const std::string& name, int from, const net::Deadline& deadline) {
  std::unique_lock lock(mu_);
  const auto key = std::make_pair(name, from);
  const auto arrived = [&] { return arrived_.count(key) > 0; };
  while (!arrived()) {
    if (deadline.stop.stop_requested())
      throw net::Stopped(fmt::format("stopped (interrupted) while waiting for member {}", from));
    if (net::Clock::now() >= deadline.at)
      throw net::NetError(fmt::format("member {} never connected to {}", from, address_));
    auto until = deadline.at;
    if (deadline.stop.stop_possible()) until = std::min(until, net::Clock::now() + net::kStopCheck);
    arrived_cv_.wait_until(lock, until, arrived);
  }
  auto conn = std::move(arrived_.at(key));
  arrived_.erase(key);
  return conn;
}

}  // namespace krug::collectives::tcp
