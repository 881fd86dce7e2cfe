// TCP plumbing: every fd is non-blocking and every wait is a poll() bounded by the caller's
// deadline, so a dead or silent peer becomes a NetError instead of a hang.
#include "net/socket.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "net/frame_length.h"

namespace krug::net {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void throw_if_stopped(const Deadline& deadline, const std::string& what) {
  if (deadline.stop.stop_requested()) throw Stopped("stopped (interrupted) while " + what);
}

// Waits for `events` on fd until the deadline. `what` completes "timeout after N s <what>".
void wait_for(int fd, short events, Clock::time_point started, const Deadline& deadline,
              const std::string& what) {
  for (;;) {
    throw_if_stopped(deadline, what);
    auto now = Clock::now();
    if (now >= deadline.at)
      throw NetError(fmt::format("timeout after {:.1f} s {}", seconds_between(started, now), what));
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline.at - now);
    if (deadline.stop.stop_possible()) left = std::min(left, kStopCheck);
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (rc > 0) return;  // ready, or an error that the following read/write will report
    if (rc < 0 && errno != EINTR) throw NetError(fmt::format("poll failed {}: {}", what, errno_text(errno)));
  }
}

void set_nodelay(int fd) {
  // Frames are small request/response messages: Nagle would add up to 40 ms per exchange.
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string format_address(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getnameinfo(addr, len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "<unknown peer>";
  if (addr->sa_family == AF_INET6) return fmt::format("[{}]:{}", host, serv);
  return fmt::format("{}:{}", host, serv);
}

struct AddrInfoDeleter {
  void operator()(addrinfo* p) const { ::freeaddrinfo(p); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : AI_ADDRCONFIG;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0)
    throw NetError(fmt::format("cannot resolve {}:{}: {}", host, port, ::gai_strerror(rc)));
  return AddrInfoPtr(res);
}

// One non-blocking connect attempt. Returns the connected fd, or the errno that stopped it.
std::pair<Fd, int> try_connect(const addrinfo* ai, const Deadline& deadline,
                               const std::string& peer) {
  Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
  if (!fd.valid()) return {Fd(), errno};
  auto started = Clock::now();
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return {Fd(), errno};
    wait_for(fd.get(), POLLOUT, started, deadline, "connecting to " + peer);
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return {Fd(), err};
  }
  set_nodelay(fd.get());
  return {std::move(fd), 0};
}

}  // namespace

Fd::Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

Fd::~Fd() { reset(); }

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Connection Connection::connect(const std::string& host, uint16_t port, const Deadline& deadline) {
  const std::string peer = fmt::format("{}:{}", host, port);
  auto started = Clock::now();
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    auto addrs = resolve(host, port, /*passive=*/false);
    int last_err = 0;
    bool refused = false;
    for (const addrinfo* ai = addrs.get(); ai; ai = ai->ai_next) {
      auto [fd, err] = try_connect(ai, deadline, peer);
      if (fd.valid()) return Connection(std::move(fd), peer);
      last_err = err;
      refused |= err == ECONNREFUSED;
    }
    // Only "refused" means "not listening yet"; anything else will not fix itself by waiting.
    if (!refused)
      throw NetError(fmt::format("cannot connect to {}: {}", peer, errno_text(last_err)));
    auto now = Clock::now();
    if (now + backoff >= deadline.at)
      throw NetError(fmt::format("cannot connect to {}: connection refused (retried for {:.1f} s)",
                                 peer, seconds_between(started, now)));
    std::this_thread::sleep_for(backoff);
    throw_if_stopped(deadline, "connecting to " + peer);
    backoff = std::min(backoff * 2,
                       deadline.stop.stop_possible() ? kStopCheck : std::chrono::milliseconds(250));
  }
}

void Connection::send_frame(const void* data, size_t size, const Deadline& deadline) {
  if (!valid()) throw NetError("send to " + peer_ + ": connection is closed");
  if (size > kMaxFrameSize)
    throw NetError(fmt::format("send to {}: frame of {} bytes exceeds the {} byte limit", peer_,
                               size, kMaxFrameSize));
  if (cipher_) {
    std::vector<uint8_t> sealed;
    append_sealed_frame(cipher_->send, data, size, sealed);
    send_all(nullptr, 0, sealed.data(), sealed.size(), deadline);
    return;
  }
  uint8_t header[kFrameLengthSize];
  write_frame_length(size, header);
  send_all(header, sizeof header, data, size, deadline);
}

void Connection::send_all(const void* header, size_t header_size, const void* data, size_t size,
                          const Deadline& deadline) {
  // Header and payload leave in one sendmsg where possible: one packet for small frames.
  iovec iov[2] = {{const_cast<void*>(header), header_size}, {const_cast<void*>(data), size}};
  size_t total = header_size + size, sent = 0;
  auto started = Clock::now();
  while (sent < total) {
    iovec cur[2];
    int n = 0;
    size_t skip = sent;
    for (auto& v : iov) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      cur[n++] = {static_cast<uint8_t*>(v.iov_base) + skip, v.iov_len - skip};
      skip = 0;
    }
    msghdr msg{};
    msg.msg_iov = cur;
    msg.msg_iovlen = n;
    ssize_t rc = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);  // EPIPE instead of SIGPIPE
    if (rc >= 0) {
      sent += static_cast<size_t>(rc);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_for(fd_.get(), POLLOUT, started, deadline, "sending to " + peer_);
    } else if (errno == EPIPE || errno == ECONNRESET) {
      throw NetError("send to " + peer_ + ": peer closed the connection");
    } else if (errno != EINTR) {
      throw NetError("send to " + peer_ + ": " + errno_text(errno));
    }
  }
}

void Connection::recv_exact(void* out, size_t size, Clock::time_point started,
                            const Deadline& deadline) {
  auto* p = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < size) {
    ssize_t rc = ::recv(fd_.get(), p + got, size - got, 0);
    if (rc > 0) {
      got += static_cast<size_t>(rc);
    } else if (rc == 0 || errno == ECONNRESET) {
      throw PeerClosed("receive from " + peer_ + ": peer closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_for(fd_.get(), POLLIN, started, deadline, "waiting for data from " + peer_);
    } else if (errno != EINTR) {
      throw NetError("receive from " + peer_ + ": " + errno_text(errno));
    }
  }
}

std::vector<uint8_t> Connection::recv_frame(const Deadline& deadline) {
  return recv_frame(deadline, kMaxFrameSize);
}

std::vector<uint8_t> Connection::recv_frame(const Deadline& deadline, size_t max_size) {
  if (!valid()) throw NetError("receive from " + peer_ + ": connection is closed");
  auto started = Clock::now();
  uint8_t header[kFrameLengthSize];
  recv_exact(header, kFrameLengthSize, started, deadline);
  const size_t size = read_frame_length(header);
  // Bound the allocation before trusting a length from the wire.
  const size_t overhead = cipher_ ? kTagSize : 0;
  if (size < overhead || size - overhead > max_size)
    throw NetError(fmt::format("receive from {}: frame of {} bytes exceeds the {} byte limit",
                               peer_, size, max_size));
  std::vector<uint8_t> frame(size);
  recv_exact(frame.data(), size, started, deadline);
  if (cipher_) {
    const size_t n = size - kTagSize;
    if (!cipher_->recv.open(header, frame.data(), n, frame.data() + n))
      throw NetError(fmt::format(
          "receive from {}: a frame failed authentication (altered on the way, or the peer is "
          "not this job's)",
          peer_));
    frame.resize(n);
  }
  return frame;
}

Listener::Listener(const std::string& bind_host, uint16_t port) {
  auto addrs = resolve(bind_host, port, /*passive=*/true);
  int last_err = 0;
  for (const addrinfo* ai = addrs.get(); ai; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd.valid()) {
      last_err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) {
      int zero = 0;  // "::" should accept IPv4 clients too
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 128) != 0) {
      last_err = errno;
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    fd_ = std::move(fd);
    return;
  }
  throw NetError(fmt::format("cannot listen on {}:{}: {}", bind_host, port, errno_text(last_err)));
}

std::optional<Connection> Listener::accept(const Deadline& deadline) {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int fd = ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      set_nodelay(fd);
      return Connection(Fd(fd), format_address(reinterpret_cast<sockaddr*>(&addr), len));
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw NetError("accept failed: " + errno_text(errno));
    try {
      wait_for(fd_.get(), POLLIN, Clock::now(), deadline, "accepting");
    } catch (const NetError&) {
      if (Clock::now() >= deadline.at) return std::nullopt;
      throw;
    }
  }
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "<unknown host>";
  return buf;
}

}  // namespace krug::net
