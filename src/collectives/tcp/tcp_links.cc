#include "collectives/tcp/tcp_links.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace krug::collectives::tcp {
namespace {

std::string address_key(int member) {
  return "addr/" + std::to_string(member);
}

void tune(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// One peer's part of a round: what is left to send to it and to receive from it.
struct Transfer {
  int peer;
  int fd;
  const uint8_t* out = nullptr;
  size_t out_left = 0;
  uint8_t* in = nullptr;
  size_t in_left = 0;
  bool done() const { return out_left == 0 && in_left == 0; }
};

// Moves what the socket takes or has now; returns whether anything moved. Throws on a closed or
// broken connection.
bool progress(Transfer& t, const std::string& peer_name) {
  bool moved = false;
  while (t.out_left > 0) {
    const ssize_t n = ::send(t.fd, t.out, t.out_left, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw net::NetError(fmt::format("send to {} failed: {}", peer_name, std::strerror(errno)));
    t.out += n;
    t.out_left -= static_cast<size_t>(n);
    moved = true;
  }
  while (t.in_left > 0) {
    const ssize_t n = ::recv(t.fd, t.in, t.in_left, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) throw net::NetError(peer_name + " closed the connection (did it exit?)");
    if (n < 0)
      throw net::NetError(
          fmt::format("receive from {} failed: {}", peer_name, std::strerror(errno)));
    t.in += n;
    t.in_left -= static_cast<size_t>(n);
    moved = true;
  }
  return moved;
}

}  // namespace

Links::Links(std::string name, int rank, int size, std::shared_ptr<rendezvous::Store> store,
             std::shared_ptr<Device> device, std::chrono::milliseconds timeout)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      store_(std::move(store)),
      device_(std::move(device)),
      timeout_(timeout),
      peers_(static_cast<size_t>(size)) {
  const std::string& address = device_->address();
  if (size_ > 1) store_->set(address_key(rank_), {address.begin(), address.end()});
}

size_t Links::connections() const {
  return static_cast<size_t>(
      std::count_if(peers_.begin(), peers_.end(), [](const auto& c) { return c.valid(); }));
}

net::Connection& Links::connection(int peer) {
  return peers_.at(static_cast<size_t>(peer));
}

void Links::connect(std::span<const Send> sends, std::span<const Recv> recvs) {
  std::vector<int> missing;
  for (const auto& s : sends)
    if (s.bytes && !connection(s.peer).valid()) missing.push_back(s.peer);
  for (const auto& r : recvs)
    if (r.bytes && !connection(r.peer).valid()) missing.push_back(r.peer);
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  const auto deadline = net::Clock::now() + timeout_;
  // Dials first: they never wait for a peer's progress, so a member waiting in take() below
  // cannot hold up a peer that waits for its dial.
  for (int peer : missing) {
    if (peer < rank_) continue;
    const auto bytes = store_->get(address_key(peer), timeout_);
    connection(peer) = device_->dial({bytes.begin(), bytes.end()}, name_, rank_, deadline);
    tune(connection(peer).fd());
  }
  for (int peer : missing) {
    if (peer > rank_) continue;
    connection(peer) = device_->take(name_, peer, deadline);
    tune(connection(peer).fd());
  }
}

void Links::round(std::span<const Send> sends, std::span<const Recv> recvs) {
  connect(sends, recvs);
  std::vector<Transfer> transfers;
  auto of = [&](int peer) -> Transfer& {
    for (auto& t : transfers)
      if (t.peer == peer) return t;
    return transfers.emplace_back(Transfer{peer, connection(peer).fd()});
  };
  // An empty message is no message: both ends compute the same sizes and skip it alike.
  for (const auto& s : sends) {
    if (!s.bytes) continue;
    auto& t = of(s.peer);
    t.out = static_cast<const uint8_t*>(s.data);
    t.out_left = s.bytes;
  }
  for (const auto& r : recvs) {
    if (!r.bytes) continue;
    auto& t = of(r.peer);
    t.in = static_cast<uint8_t*>(r.data);
    t.in_left = r.bytes;
  }
  auto name = [&](int peer) { return fmt::format("rank {} ({})", peer, connection(peer).peer()); };
  std::vector<pollfd> fds;
  auto last_progress = net::Clock::now();
  for (;;) {
    fds.clear();
    for (auto& t : transfers) {
      if (t.done()) continue;
      if (progress(t, name(t.peer))) last_progress = net::Clock::now();
      if (t.done()) continue;
      const short events =
          static_cast<short>((t.out_left ? POLLOUT : 0) | (t.in_left ? POLLIN : 0));
      fds.push_back({t.fd, events, 0});
    }
    if (fds.empty()) return;
    const auto left = last_progress + timeout_ - net::Clock::now();
    if (left <= decltype(left)::zero()) {
      std::string waiting;
      for (const auto& t : transfers)
        if (!t.done()) waiting += (waiting.empty() ? "" : ", ") + name(t.peer);
      throw net::NetError(
          fmt::format("no progress for {} s with {}", timeout_.count() / 1000, waiting));
    }
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(ms, 1000))) < 0 &&
        errno != EINTR)
      throw net::NetError(fmt::format("poll failed: {}", std::strerror(errno)));
  }
}

}  // namespace krug::collectives::tcp
