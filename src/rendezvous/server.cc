// RendezvousServer: one thread running a poll() loop over the listener, the authenticated
// clients and an eventfd that wakes it for shutdown or a finished handshake. It sleeps until a
// socket is ready or a parked get/wait times out: no idle polling.
//
// Handshakes run on short-lived threads (bounded by kHandshakeTimeout) so that a slow or
// hostile peer cannot stall the clients already being served.
#include "rendezvous/server.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "common/log.h"
#include "net/frame_length.h"
#include "net/limits.h"
#include "net/socket.h"
#include "rendezvous/server_state.h"

namespace krug::rendezvous {
namespace {

constexpr std::chrono::seconds kHandshakeTimeout(5);
// More simultaneous unauthenticated peers than this is an attack or a misconfiguration.
constexpr size_t kMaxPendingHandshakes = 64;
constexpr size_t kReadChunk = 64 * 1024;

}  // namespace

struct RendezvousServer::Impl {
  struct Client {
    net::Connection conn;
    Bytes in;        // received bytes not yet parsed into frames
    Bytes sealed;    // bytes of an encrypted client's frames not yet opened
    Bytes out;       // reply frames not yet sent
    size_t out_pos = 0;
  };
  struct Handshake {
    std::thread thread;
    net::Fd dup;  // a second fd on the socket, so shutdown can interrupt the handshake safely
  };
  struct Finished {
    uint64_t id;
    net::Connection conn;
    std::string peer;
    std::optional<std::string> reason;
  };

  Impl(const std::string& bind_host, uint16_t port, std::string secret_,
       std::function<void(const std::string&)> log_, net::Protection protection_)
      : listener(bind_host, port),
        secret(std::move(secret_)),
        protection(protection_),
        log(std::move(log_)),
        wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!wake.valid()) throw Error("rendezvous server: eventfd failed");
    if (!log)
      log = [](const std::string& m) { log::at(log::Level::kWarning, -1, "{}", m); };
    thread = std::thread([this] { run(); });
  }

  ~Impl() {
    stopping = true;
    notify();
    thread.join();
    std::map<uint64_t, Handshake> left;
    {
      std::lock_guard lock(hs_mu);
      for (auto& [id, hs] : handshakes) ::shutdown(hs.dup.get(), SHUT_RDWR);
      left.swap(handshakes);
    }
    for (auto& [id, hs] : left) hs.thread.join();
  }

  void notify() {
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake.get(), &one, sizeof(one));
  }

  void run();
  void accept_new();
  void start_handshake(net::Connection conn);
  void collect_handshakes();
  bool read_client(uint64_t id, Client& c);
  bool open_frames(uint64_t id, Client& c);
  bool flush_client(Client& c);
  bool process_frames(uint64_t id, Client& c, std::vector<ServerState::Reply>& replies);
  void deliver(std::vector<ServerState::Reply>& replies);
  void drop(uint64_t id, const std::string& why);

  net::Listener listener;
  std::string secret;
  net::Protection protection;
  std::function<void(const std::string&)> log;
  net::Fd wake;
  std::atomic<bool> stopping{false};
  std::atomic<int> rejected{0};
  std::thread thread;

  std::mutex hs_mu;  // guards handshakes and finished: shared with the handshake threads
  std::map<uint64_t, Handshake> handshakes;
  std::vector<Finished> finished;

  // Owned by the loop thread only.
  std::map<uint64_t, Client> clients;
  ServerState state;
  uint64_t next_id = 1;
};

void RendezvousServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;  // ids[i] is the client behind fds[i + 2]
  while (!stopping) {
    fds.assign({{wake.get(), POLLIN, 0}, {listener.fd(), POLLIN, 0}});
    ids.clear();
    for (auto& [id, c] : clients) {
      short events = POLLIN;
      if (c.out_pos < c.out.size()) events |= POLLOUT;
      fds.push_back({c.conn.fd(), events, 0});
      ids.push_back(id);
    }
    int timeout_ms = -1;
    if (auto next = state.next_deadline()) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - net::Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      log(fmt::format("rendezvous server: poll failed: {}", std::strerror(errno)));
      return;
    }
    if (fds[0].revents) {
      uint64_t count;
      [[maybe_unused]] auto n = ::read(wake.get(), &count, sizeof(count));
      collect_handshakes();
    }
    if (fds[1].revents) accept_new();

    std::vector<ServerState::Reply> replies;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = clients.find(ids[i]);
      if (it == clients.end() || !fds[i + 2].revents) continue;
      if (fds[i + 2].revents & POLLOUT && !flush_client(it->second)) continue;
      if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR) && !read_client(ids[i], it->second))
        continue;
    }
    // A set may release a parked client whose next request is already buffered: keep going
    // until no client can make progress.
    for (bool progress = true; progress;) {
      progress = false;
      for (auto& [id, c] : clients) progress |= process_frames(id, c, replies);
      state.expire(net::Clock::now(), replies);
      deliver(replies);
    }
  }
}

void RendezvousServer::Impl::accept_new() {
  // Drain the backlog: a deadline of "now" makes accept() return nullopt when it is empty.
  try {
    while (auto conn = listener.accept(net::Clock::now())) start_handshake(std::move(*conn));
  } catch (const Error& e) {  // e.g. out of fds: keep serving the clients we have
    log(fmt::format("rendezvous server: {}", e.what()));
  }
}

void RendezvousServer::Impl::start_handshake(net::Connection conn) {
  std::lock_guard lock(hs_mu);
  if (handshakes.size() >= kMaxPendingHandshakes) {
    log(fmt::format("rendezvous server: rejected client {}: too many pending handshakes",
                    conn.peer()));
    ++rejected;  // after the line: whoever sees the count can read the line
    return;
  }
  uint64_t id = next_id++;
  Handshake& hs = handshakes[id];
  hs.dup = net::Fd(::dup(conn.fd()));
  hs.thread = std::thread([this, id, conn = std::move(conn)]() mutable {
    std::string peer = conn.peer();
    auto reason =
        conn.authenticate_as_server(secret, net::Clock::now() + kHandshakeTimeout, protection);
    {
      std::lock_guard lock(hs_mu);
      finished.push_back({id, std::move(conn), std::move(peer), std::move(reason)});
    }
    notify();
  });
}

void RendezvousServer::Impl::collect_handshakes() {
  std::vector<Finished> done;
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(hs_mu);
    done.swap(finished);
    for (auto& f : done) {
      threads.push_back(std::move(handshakes.at(f.id).thread));
      handshakes.erase(f.id);
    }
  }
  for (auto& t : threads) t.join();  // each has already published its result: joins at once
  for (auto& f : done) {
    if (f.reason) {
      log(fmt::format("rendezvous server: rejected client {}: {}", f.peer, *f.reason));
      ++rejected;  // after the line, as above
    } else {
      clients[f.id].conn = std::move(f.conn);
    }
  }
}

bool RendezvousServer::Impl::read_client(uint64_t id, Client& c) {
  // An encrypted client's bytes land in `sealed`; its frames reach `in` once opened.
  net::Cipher* cipher = c.conn.cipher();
  Bytes& raw = cipher ? c.sealed : c.in;
  for (;;) {
    size_t old = raw.size();
    raw.resize(old + kReadChunk);
    ssize_t n = ::recv(c.conn.fd(), raw.data() + old, kReadChunk, MSG_DONTWAIT);
    raw.resize(old + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) {
      if (cipher && !open_frames(id, c)) return false;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    // EOF is how a client says goodbye; anything else is worth a line in the log.
    if (n < 0) drop(id, std::strerror(errno));
    else drop(id, "");
    return false;
  }
}

bool RendezvousServer::Impl::open_frames(uint64_t id, Client& c) {
  try {
    net::open_sealed_frames(c.conn.cipher()->recv, c.sealed, c.in, net::kMaxFrameSize);
    return true;
  } catch (const net::NetError& e) {
    log(fmt::format("rendezvous server: dropping {}: {}", c.conn.peer(), e.what()));
    drop(id, "");
    return false;
  }
}

bool RendezvousServer::Impl::process_frames(uint64_t id, Client& c,
                                            std::vector<ServerState::Reply>& replies) {
  try {
    return state.handle_frames(id, c.in, net::Clock::now(), replies);
  } catch (const net::NetError& e) {
    c.in.clear();
    c.conn.close();  // dropped by deliver() below, where iterating clients is safe
    log(fmt::format("rendezvous server: dropping {}: {}", c.conn.peer(), e.what()));
    return false;
  }
}

void RendezvousServer::Impl::deliver(std::vector<ServerState::Reply>& replies) {
  for (auto& r : replies) {
    auto it = clients.find(r.client);
    if (it == clients.end()) continue;  // the client left while its request was parked
    Bytes& out = it->second.out;
    if (net::Cipher* cipher = it->second.conn.cipher()) {
      net::append_sealed_frame(cipher->send, r.payload.data(), r.payload.size(), out);
      continue;
    }
    net::append_frame_length(r.payload.size(), out);
    out.insert(out.end(), r.payload.begin(), r.payload.end());
  }
  replies.clear();
  for (auto it = clients.begin(); it != clients.end();) {
    auto next = std::next(it);
    if (!it->second.conn.valid()) {
      state.drop_client(it->first);
      clients.erase(it);
    } else if (it->second.out_pos < it->second.out.size()) {
      flush_client(it->second);  // on failure it closes the connection; erased next round
    }
    it = next;
  }
}

bool RendezvousServer::Impl::flush_client(Client& c) {
  while (c.out_pos < c.out.size()) {
    ssize_t n = ::send(c.conn.fd(), c.out.data() + c.out_pos, c.out.size() - c.out_pos,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_pos += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return true;  // poll() will tell us when there is room
    } else if (n < 0 && errno != EINTR) {
      c.conn.close();
      return false;
    }
  }
  c.out.clear();
  c.out_pos = 0;
  return true;
}

void RendezvousServer::Impl::drop(uint64_t id, const std::string& why) {
  auto it = clients.find(id);
  if (it == clients.end()) return;
  if (!why.empty())
    log(fmt::format("rendezvous server: lost client {}: {}", it->second.conn.peer(), why));
  it->second.conn.close();
  state.drop_client(id);
  clients.erase(it);
}

RendezvousServer::RendezvousServer(const std::string& bind_host, uint16_t port, std::string secret,
                                   std::function<void(const std::string&)> log,
                                   net::Protection protection)
    : impl_(
          std::make_unique<Impl>(bind_host, port, std::move(secret), std::move(log), protection)) {
  // One connection per rank (and per Spark or Ray task): a default soft limit of 1024 would stop
  // a large job that the hard limit allows.
  net::raise_open_file_limit();
}

RendezvousServer::~RendezvousServer() = default;

uint16_t RendezvousServer::port() const { return impl_->listener.port(); }

int RendezvousServer::rejected_clients() const { return impl_->rejected.load(); }

}  // namespace krug::rendezvous
