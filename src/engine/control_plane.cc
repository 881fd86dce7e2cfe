#include "engine/control_plane.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>

#include "common/log.h"

namespace krug::engine {
namespace {

constexpr const char* kAddressKey = "control/address";

std::vector<uint8_t> to_bytes(std::string_view s) { return {s.begin(), s.end()}; }
std::string to_string(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace

ControlPlane::ControlPlane(int rank, int size, const std::string& advertise_host,
                           const std::string& hostname, rendezvous::Store& store,
                           const std::string& secret, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), timeout_(timeout), hosts_(size) {
  hosts_[rank] = hostname;
  if (size == 1) return;
  const auto until = deadline();
  if (is_coordinator()) {
    // Bound to the advertised address only: peers reach it there, and nothing else should.
    net::Listener listener(advertise_host, 0);
    store.set(kAddressKey, to_bytes(fmt::format("{}:{}", advertise_host, listener.port())));
    workers_.resize(size);
    int connected = 0;
    while (connected < size - 1) {
      auto conn = listener.accept(until);
      if (!conn) {
        std::vector<int> missing;
        for (int r = 1; r < size; ++r)
          if (!workers_[r].valid()) missing.push_back(r);
        throw Error(fmt::format(
            "rank 0 timed out after {} s waiting for ranks [{}] to connect to the control plane; "
            "check that they started (krugrun output) and can reach {} (raise "
            "KRUG_TIMEOUT_SECONDS for slow starts)",
            timeout.count() / 1000.0, fmt::join(missing, ", "), advertise_host));
      }
      if (auto reason = conn->authenticate_as_server(secret, until)) {
        // A stray process (or another job) found the port: refuse it and keep waiting.
        log::at(log::Level::kWarning, 0, "control plane: rejected connection from {}: {}",
                conn->peer(), *reason);
        continue;
      }
      const auto hello_frame = conn->recv_frame(until);  // Reader borrows; keep the bytes alive
      net::Reader hello(hello_frame);
      int peer = static_cast<int>(hello.i64());
      std::string peer_host = hello.str();
      if (peer <= 0 || peer >= size || workers_[peer].valid())
        throw Error(fmt::format("control plane: unexpected hello from rank {} on {}", peer,
                                peer_host));
      hosts_[peer] = peer_host;
      workers_[peer] = std::move(*conn);
      ++connected;
    }
    // Every rank learns every host name, for error messages.
    net::Writer w;
    for (const auto& h : hosts_) w.str(h);
    auto table = w.take();
    for (int r = 1; r < size; ++r) workers_[r].send_frame(table, until);
  } else {
    auto address = to_string(store.get(kAddressKey, timeout));
    auto colon = address.rfind(':');
    coordinator_ = net::Connection::connect(
        address.substr(0, colon), static_cast<uint16_t>(std::stoi(address.substr(colon + 1))),
        until);
    coordinator_.authenticate_as_client(secret, until);
    net::Writer hello;
    hello.i64(rank);
    hello.str(hostname);
    coordinator_.send_frame(hello.take(), until);
    const auto table_frame = coordinator_.recv_frame(until);
    net::Reader table(table_frame);
    for (auto& h : hosts_) h = table.str();
  }
}

std::vector<int> ControlPlane::fds() const {
  if (!is_coordinator()) return {coordinator_.valid() ? coordinator_.fd() : -1};
  std::vector<int> fds(size_, -1);
  for (int r = 1; r < size_ && r < static_cast<int>(workers_.size()); ++r)
    if (workers_[r].valid()) fds[r] = workers_[r].fd();
  return fds;
}

void ControlPlane::send_to_coordinator(const controller::RequestList& list) {
  coordinator_.send_frame(controller::encode(list), deadline());
}

controller::ResponseList ControlPlane::recv_from_coordinator() {
  return controller::decode_response_list(coordinator_.recv_frame(deadline()));
}

controller::RequestList ControlPlane::recv_from_worker(int rank) {
  return controller::decode_request_list(workers_.at(rank).recv_frame(deadline()));
}

std::vector<int> ControlPlane::broadcast(const controller::ResponseList& list) {
  std::vector<int> failed;
  if (workers_.empty()) return failed;
  auto frame = controller::encode(list);
  for (int r = 1; r < size_; ++r) {
    if (!workers_[r].valid()) continue;
    try {
      workers_[r].send_frame(frame, deadline());
    } catch (const net::NetError&) {
      workers_[r].close();
      failed.push_back(r);
    }
  }
  return failed;
}

void ControlPlane::close_worker(int rank) { workers_.at(rank).close(); }

}  // namespace krug::engine
