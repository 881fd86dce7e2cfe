#include "engine/control_plane.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "collectives/tcp/tcp_device.h"
#include "common/log.h"
#include "net/address.h"
#include "net/limits.h"

namespace krug::engine {
namespace {

constexpr const char* kAddressKey = "control/address";
// What the control plane's connections name themselves on rank 0's device (tcp_device.h).
constexpr const char* kControlPlane = "control";
// A rank's host name, its first frame after the handshake.
constexpr size_t kMaxHostFrame = 4096;
// Ring bytes per mailbox: a step's lists of a few hundred tensors (about 100 bytes each, a few
// bytes once cached) fit; larger lists, and lists a busy peer has no room for yet, go over the
// socket.
constexpr size_t kMailboxBytes = size_t{256} << 10;
// How long a polling sender holds a doorbell back (ring_doorbells). With 10 us, 2 ranks
// exchanging 4-byte allreduces on this project's 2-core VM rang 55-680 doorbells per 100,000
// operations instead of about 3,500.
constexpr std::chrono::microseconds kDoorbellGrace(10);

std::vector<uint8_t> to_bytes(std::string_view s) {
  return {s.begin(), s.end()};
}
std::string to_string(const std::vector<uint8_t>& b) {
  return {b.begin(), b.end()};
}

}  // namespace

ControlPlane::ControlPlane(int rank, int size, const std::string& advertise_host,
                           const std::string& hostname, rendezvous::Store& store,
                           const std::string& secret, net::Protection protection,
                           std::chrono::milliseconds timeout, bool mailboxes,
                           const SegmentFactory& segment, std::stop_token stop)
    : rank_(rank), size_(size), timeout_(timeout), hosts_(size) {
  hosts_[rank] = hostname;
  stash_.resize(is_coordinator() ? size : 1);
  if (size == 1) return;
  const net::Deadline until(net::Clock::now() + timeout_, std::move(stop));
  mailboxes = is_coordinator()
                  ? accept_workers(advertise_host, store, secret, protection, mailboxes, until)
                  : connect_to_coordinator(hostname, store, secret, protection, until);
  if (mailboxes) map_mailboxes(segment);
}

bool ControlPlane::accept_workers(const std::string& advertise_host, rendezvous::Store& store,
                                  const std::string& secret, net::Protection protection,
                                  bool mailboxes, const net::Deadline& until) {
  net::require_open_files(
      static_cast<size_t>(size_) + 128,
      fmt::format("rank 0's control plane (a connection per rank, {} ranks)", size_));
  // Bound to the advertised address only: peers reach it there, and nothing else should. The
  // device authenticates connections on threads of their own, at most 64 at a time and each
  // within its deadline: a stranger that connects and stalls cannot hold up the ranks.
  collectives::tcp::Device listener(advertise_host, secret, 0, collectives::tcp::kHandshakeTimeout,
                                    protection);
  store.set(kAddressKey, to_bytes(listener.address()));
  workers_.resize(size_);
  for (int r = 1; r < size_; ++r) {
    try {
      workers_[r] = listener.take(kControlPlane, r, until);
    } catch (const net::Stopped&) {
      throw;
    } catch (const net::NetError&) {
      std::vector<int> missing;
      for (int q = r; q < size_; ++q) {
        try {
          workers_[q] = listener.take(kControlPlane, q, net::Clock::now());
        } catch (const net::NetError&) {
          missing.push_back(q);
        }
      }
      throw Error(fmt::format(
          "rank 0 timed out after {} s waiting for ranks [{}] to connect to the control plane; "
          "check that they started (krugrun output) and can reach {} (raise "
          "KRUG_TIMEOUT_SECONDS for slow starts)",
          timeout_.count() / 1000.0, fmt::join(missing, ", "), advertise_host));
    }
    hosts_[r] = to_string(workers_[r].recv_frame(until, kMaxHostFrame));
  }
  // Every rank learns every host name, for error messages, and whether lists go through
  // mailboxes (only when all ranks share one host).
  mailboxes = mailboxes && std::all_of(hosts_.begin(), hosts_.end(),
                                       [&](const std::string& h) { return h == hosts_[0]; });
  net::Writer w;
  for (const auto& h : hosts_) w.str(h);
  w.u8(mailboxes ? 1 : 0);
  auto table = w.take();
  for (int r = 1; r < size_; ++r) workers_[r].send_frame(table, until);
  return mailboxes;
}

bool ControlPlane::connect_to_coordinator(const std::string& hostname, rendezvous::Store& store,
                                          const std::string& secret, net::Protection protection,
                                          const net::Deadline& until) {
  std::string address;
  try {
    address = to_string(store.get(kAddressKey, timeout_));
  } catch (const rendezvous::StoreTimeout& e) {
    // The usual cause: this rank called init() again (after shutdown()) and rank 0 did not.
    throw rendezvous::StoreTimeout(fmt::format(
        "rank {} timed out after {} s waiting for rank 0 to start krug ({}): every rank must "
        "call init(), and after shutdown() every rank must call init() again; see rank 0's "
        "output for why it did not (raise KRUG_TIMEOUT_SECONDS for slow starts)",
        rank_, timeout_.count() / 1000.0, e.what()));
  }
  try {
    coordinator_ =
        collectives::tcp::Device::dial(address, secret, protection, kControlPlane, rank_, until);
  } catch (const net::Stopped&) {
    throw;
  } catch (const net::NetError& e) {
    throw Error(fmt::format("rank {} cannot join rank 0's control plane at {}: {}", rank_,
                            address, e.what()));
  }
  coordinator_.send_frame(to_bytes(hostname), until);
  const auto table_frame = coordinator_.recv_frame(until);
  net::Reader table(table_frame);
  for (auto& h : hosts_) h = table.str();
  return table.u8() != 0;
}

void ControlPlane::map_mailboxes(const SegmentFactory& segment) {
  const size_t box = Mailbox::bytes_for(kMailboxBytes);
  // Worker r's pair: its lists up at 2(r-1), the coordinator's down at 2(r-1)+1.
  segment_ = segment(2 * static_cast<size_t>(size_ - 1) * box);
  auto at = [&](int worker, int direction) {
    return segment_->data() + (2 * static_cast<size_t>(worker - 1) + direction) * box;
  };
  inbox_.resize(stash_.size());
  outbox_.resize(stash_.size());
  send_seq_.assign(stash_.size(), 0);
  recv_seq_.assign(stash_.size(), 0);
  doorbell_held_.assign(stash_.size(), 0);
  if (is_coordinator()) {
    for (int r = 1; r < size_; ++r) {
      inbox_[r].emplace(at(r, 0), kMailboxBytes);
      outbox_[r].emplace(at(r, 1), kMailboxBytes);
    }
  } else {
    outbox_[0].emplace(at(rank_, 0), kMailboxBytes);
    inbox_[0].emplace(at(rank_, 1), kMailboxBytes);
  }
}

std::vector<int> ControlPlane::fds() const {
  if (!is_coordinator()) return {coordinator_.valid() ? coordinator_.fd() : -1};
  std::vector<int> fds(size_, -1);
  for (int r = 1; r < size_ && r < static_cast<int>(workers_.size()); ++r)
    if (workers_[r].valid()) fds[r] = workers_[r].fd();
  return fds;
}

void ControlPlane::send(int peer, const std::vector<uint8_t>& frame, const net::Deadline& until,
                        bool hold_doorbell) {
  net::Connection& conn = connection(peer);
  if (!uses_mailboxes()) {
    conn.send_frame(frame, until);
    return;
  }
  Mailbox& box = *outbox_[peer];
  const uint64_t seq = send_seq_[peer]++;
  if (box.try_push(seq, frame.data(), frame.size())) {
    if (!box.consumer_sleeping()) return;
    if (!hold_doorbell) {
      conn.send_frame(nullptr, 0, until);
    } else if (!doorbell_held_[peer]) {
      doorbell_held_[peer] = 1;
      if (doorbells_held_++ == 0) ring_at_ = net::Clock::now() + kDoorbellGrace;
    }
    return;
  }
  // Too large, or the peer has not caught up (it may be in a collective waiting for this rank):
  // the socket, whose kernel buffer takes it without waiting for the peer. The sequence number
  // puts it back in order.
  std::vector<uint8_t> spilled(sizeof seq + frame.size());
  std::memcpy(spilled.data(), &seq, sizeof seq);
  if (!frame.empty()) std::memcpy(spilled.data() + sizeof seq, frame.data(), frame.size());
  conn.send_frame(spilled, until);
}

void ControlPlane::send_to_coordinator(const controller::RequestList& list, bool hold_doorbell) {
  send(0, controller::encode(list), deadline(), hold_doorbell);
}

std::vector<int> ControlPlane::broadcast(const controller::ResponseList& list) {
  std::vector<int> failed;
  if (workers_.empty()) return failed;
  auto frame = controller::encode(list);
  for (int r = 1; r < size_; ++r) {
    if (!workers_[r].valid()) continue;
    try {
      send(r, frame, deadline());
    } catch (const net::NetError&) {
      workers_[r].close();
      failed.push_back(r);
    }
  }
  return failed;
}

void ControlPlane::read_socket(int peer) {
  auto frame = connection(peer).recv_frame(deadline());
  if (uses_mailboxes() && frame.empty()) return;  // a doorbell: the list is in the mailbox
  stash_.at(peer).push_back(std::move(frame));
}

std::optional<std::vector<uint8_t>> ControlPlane::next_frame(int peer) {
  auto& stash = stash_.at(peer);
  std::vector<uint8_t> frame;
  if (!uses_mailboxes()) {
    if (stash.empty()) return std::nullopt;
    frame = std::move(stash.front());
    stash.pop_front();
    return frame;
  }
  // Each way delivers in order; the next list is at the front of one of them, once it arrived.
  uint64_t& next = recv_seq_.at(peer);
  Mailbox& box = *inbox_.at(peer);
  if (box.has_frame() && box.front_seq() == next) {
    box.pop(frame);
    ++next;
    return frame;
  }
  uint64_t seq = 0;
  if (stash.empty() || stash.front().size() < sizeof seq) return std::nullopt;
  std::memcpy(&seq, stash.front().data(), sizeof seq);
  if (seq != next) return std::nullopt;
  frame.assign(stash.front().begin() + sizeof seq, stash.front().end());
  stash.pop_front();
  ++next;
  return frame;
}

std::optional<controller::RequestList> ControlPlane::next_request_list(int worker) {
  auto frame = next_frame(worker);
  if (!frame) return std::nullopt;
  return controller::decode_request_list(*frame);
}

std::optional<controller::ResponseList> ControlPlane::next_response_list() {
  auto frame = next_frame(0);
  if (!frame) return std::nullopt;
  return controller::decode_response_list(*frame);
}

bool ControlPlane::has_mail() const {
  return std::any_of(inbox_.begin(), inbox_.end(),
                     [](const std::optional<Mailbox>& box) { return box && box->has_frame(); });
}

bool ControlPlane::prepare_to_sleep() {
  for (auto& box : inbox_)
    if (box && !box->prepare_to_sleep()) {
      awake();
      return false;
    }
  return true;
}

void ControlPlane::awake() {
  for (auto& box : inbox_)
    if (box) box->awake();
}

void ControlPlane::ring_doorbells(bool force) {
  if (doorbells_held_ == 0 || (!force && net::Clock::now() < ring_at_)) return;
  for (size_t peer = 0; peer < doorbell_held_.size(); ++peer) {
    if (!doorbell_held_[peer]) continue;
    doorbell_held_[peer] = 0;
    const Mailbox& box = *outbox_[peer];
    if (!box.has_frame() || !box.consumer_sleeping()) continue;  // it looked meanwhile
    try {
      connection(static_cast<int>(peer)).send_frame(nullptr, 0, deadline());
    } catch (const net::NetError&) {
      // The peer is gone: its closed socket says so where this rank reads from it.
    }
  }
  doorbells_held_ = 0;
}

void ControlPlane::close_worker(int rank) {
  workers_.at(rank).close();
}

}  // namespace krug::engine
