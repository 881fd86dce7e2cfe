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

// Tag of a round's receives: rounds wait for all of theirs, so one tag serves every round.
constexpr size_t kRoundTag = 0;

std::string address_key(int member) {
  return "addr/" + std::to_string(member);
}

void tune(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
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
      std::count_if(peers_.begin(), peers_.end(), [](const Peer& p) { return p.conn.valid(); }));
}

std::string Links::describe(int index) {
  return fmt::format("rank {} ({})", index, peer(index).conn.peer());
}

void Links::connect(std::vector<int> peers) {
  std::erase_if(peers, [&](int p) { return peer(p).conn.valid(); });
  if (peers.empty()) return;
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  const auto deadline = net::Clock::now() + timeout_;
  // Dials first: they never wait for a peer's progress, so a member waiting in take() below
  // cannot hold up a peer that waits for its dial.
  for (int p : peers) {
    if (p < rank_) continue;
    const auto bytes = store_->get(address_key(p), timeout_);
    // The device dials again while the peer's listener is busy with strangers that stall.
    peer(p).conn = device_->dial({bytes.begin(), bytes.end()}, name_, rank_, deadline);
    tune(peer(p).conn.fd());
  }
  for (int p : peers) {
    if (p > rank_) continue;
    peer(p).conn = device_->take(name_, p, deadline);
    tune(peer(p).conn.fd());
  }
}

void Links::enqueue(int index, bool is_send, const void* data, size_t bytes, size_t tag) {
  if (bytes == 0) return;
  connect({index});
  Peer& p = peer(index);
  // The queues never write through `data` of a send; one type keeps them alike.
  Message m{static_cast<uint8_t*>(const_cast<void*>(data)), bytes, tag};
  if (is_send) {
    p.sends.push_back(m);
    ++pending_sends_;
  } else {
    p.recvs.push_back(m);
    ++pending_recvs_[tag];
  }
  if (!p.active) {
    p.active = true;
    active_.push_back(index);
  }
}

void Links::post_send(int index, const void* data, size_t bytes) {
  enqueue(index, true, data, bytes, 0);
}

void Links::post_recv(int index, void* data, size_t bytes, size_t tag) {
  enqueue(index, false, data, bytes, tag);
}

bool Links::pump(int index) {
  const bool sealed = peer(index).conn.cipher() != nullptr;
  const bool sent = sealed ? pump_sealed_sends(index) : pump_sends(index);
  const bool received = sealed ? pump_sealed_recvs(index) : pump_recvs(index);
  return sent || received;
}

size_t Links::moved_bytes(int index, ssize_t n, bool sending) {
  if (n > 0) return static_cast<size_t>(n);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
  if (n == 0 && !sending)
    throw net::NetError(describe(index) + " closed the connection (did it exit?)");
  throw net::NetError(fmt::format("{} {} failed: {}", sending ? "send to" : "receive from",
                                  describe(index), std::strerror(errno)));
}

void Links::finish_recv(Peer& p) {
  auto tag = pending_recvs_.find(p.recvs.front().tag);
  if (--tag->second == 0) pending_recvs_.erase(tag);
  p.recvs.pop_front();
}

bool Links::pump_sends(int index) {
  Peer& p = peer(index);
  bool moved = false;
  while (!p.sends.empty()) {
    Message& m = p.sends.front();
    const size_t n = moved_bytes(index, ::send(p.conn.fd(), m.data, m.left, MSG_NOSIGNAL), true);
    if (n == 0) break;
    moved = true;
    m.data += n;
    m.left -= n;
    if (m.left > 0) continue;
    p.sends.pop_front();
    --pending_sends_;
  }
  return moved;
}

bool Links::pump_recvs(int index) {
  Peer& p = peer(index);
  bool moved = false;
  while (!p.recvs.empty()) {
    Message& m = p.recvs.front();
    const size_t n = moved_bytes(index, ::recv(p.conn.fd(), m.data, m.left, 0), false);
    if (n == 0) break;
    moved = true;
    m.data += n;
    m.left -= n;
    if (m.left == 0) finish_recv(p);
  }
  return moved;
}

void Links::progress_until(const std::function<bool()>& done) {
  std::vector<pollfd> fds;
  auto last_progress = net::Clock::now();
  for (;;) {
    bool moved = false;
    fds.clear();
    for (size_t i = 0; i < active_.size();) {
      const int index = active_[i];
      moved |= pump(index);
      Peer& p = peer(index);
      if (p.sends.empty() && p.recvs.empty()) {
        p.active = false;
        active_[i] = active_.back();
        active_.pop_back();
        continue;
      }
      const short events =
          static_cast<short>((p.sends.empty() ? 0 : POLLOUT) | (p.recvs.empty() ? 0 : POLLIN));
      fds.push_back({p.conn.fd(), events, 0});
      ++i;
    }
    if (done()) return;
    if (fds.empty()) throw net::NetError("waiting for a message that was never posted");
    const auto now = net::Clock::now();
    if (moved) last_progress = now;
    const auto left = last_progress + timeout_ - now;
    if (left <= decltype(left)::zero()) {
      std::string waiting;
      for (int index : active_) waiting += (waiting.empty() ? "" : ", ") + describe(index);
      throw net::NetError(
          fmt::format("no progress for {} s with {}", timeout_.count() / 1000, waiting));
    }
    if (moved) continue;  // the sockets may take or have more already
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(ms, 1000))) < 0 &&
        errno != EINTR)
      throw net::NetError(fmt::format("poll failed: {}", std::strerror(errno)));
  }
}

void Links::round(std::span<const Send> sends, std::span<const Recv> recvs) {
  std::vector<int> involved;
  for (const auto& s : sends)
    if (s.bytes) involved.push_back(s.peer);
  for (const auto& r : recvs)
    if (r.bytes) involved.push_back(r.peer);
  connect(std::move(involved));
  for (const auto& r : recvs) post_recv(r.peer, r.data, r.bytes, kRoundTag);
  for (const auto& s : sends) post_send(s.peer, s.data, s.bytes);
  progress_until([&] { return pending_sends_ == 0 && pending_recvs_.empty(); });
}

void Links::wait_recvs(size_t tag) {
  progress_until([&] { return pending_recvs_.empty() || pending_recvs_.begin()->first > tag; });
}

void Links::wait_sends() {
  progress_until([&] { return pending_sends_ == 0; });
}

}  // namespace krug::collectives::tcp
