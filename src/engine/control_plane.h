// The control plane: a star of authenticated TCP connections between the coordinator (rank 0)
// and every other rank, carrying request lists up and response lists down.
//
// Sockets, not Gloo, because the background loop must sleep in poll() on "local work arrived"
// (an eventfd) and "a peer spoke" at the same time: no idle polling, and a dead peer shows up
// at once as a closed socket.
//
// When every rank is on one host, the lists travel through shared-memory mailboxes instead
// (engine/mailbox.h), one pair per worker; the sockets then carry doorbells (an empty frame for
// a peer asleep in poll()), lists a mailbox has no room for (too large, or the peer is busy),
// and the closing of a dead peer. Sequence numbers keep the two ways in order.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "controller/message.h"
#include "engine/mailbox.h"
#include "net/socket.h"
#include "rendezvous/store.h"
#include "transport/shm_segment.h"

namespace krug::engine {

class ControlPlane {
 public:
  // Maps the mailboxes' shared segment (a collective call on every rank).
  using SegmentFactory = std::function<std::unique_ptr<transport::Segment>(size_t bytes)>;

  // Blocks until every rank is connected or `timeout` passes (throws krug::Error naming the
  // ranks that did not show up). The coordinator decides for everyone whether lists go through
  // mailboxes: when `mailboxes` is set on rank 0 and every rank is on its host. Requesting
  // `stop` ends the wait for the others early (net::Stopped).
  ControlPlane(int rank, int size, const std::string& advertise_host, const std::string& hostname,
               rendezvous::Store& store, const std::string& secret, net::Protection protection,
               std::chrono::milliseconds timeout, bool mailboxes, const SegmentFactory& segment,
               std::stop_token stop = {});

  bool is_coordinator() const { return rank_ == 0; }
  // Coordinator: fds of connected workers, indexed by rank (-1 for self or a closed peer).
  // Worker: a single fd to the coordinator at index 0.
  std::vector<int> fds() const;
  const std::string& host_of(int rank) const { return hosts_.at(rank); }

  bool uses_mailboxes() const { return segment_ != nullptr; }

  // `hold_doorbell`: the caller keeps polling and calls ring_doorbells (below).
  void send_to_coordinator(const controller::RequestList& list, bool hold_doorbell = false);
  // Sends to every still-connected worker; a worker whose send fails is closed and reported in
  // the returned list of ranks.
  std::vector<int> broadcast(const controller::ResponseList& list);
  void close_worker(int rank);

  // Receiving. A peer is a worker's rank on the coordinator, 0 on a worker. Throws
  // net::NetError when the peer is gone.
  // Its socket is readable: reads one frame (a list, or with mailboxes a doorbell).
  void read_socket(int peer);
  // The next list that arrived from `peer`, if any; never waits.
  std::optional<controller::RequestList> next_request_list(int worker);
  std::optional<controller::ResponseList> next_response_list();
  // Whether a mailbox holds a list (a poll() on the sockets does not show it).
  bool has_mail() const;
  // Around a blocking poll(): false when a list arrived meanwhile (do not sleep); after the
  // poll, awake() (peers stop ringing the doorbell).
  bool prepare_to_sleep();
  void awake();
  // Doorbells held back. A list pushed into the mailbox of a peer that said it sleeps needs
  // one, but a sender that keeps polling holds it back for a short grace: the peer usually has
  // a thread about to look (one waiting for the same operation), and a doorbell costs a system
  // call here and a wake-up there, more than the whole exchange. `force`: ring whatever is held
  // back, before the thread does anything that can block (a collective, a sleep, leaving the
  // loop); else only once the grace has passed. None rings for a peer that looked meanwhile.
  void ring_doorbells(bool force);

 private:
  net::Deadline deadline() const { return net::Clock::now() + timeout_; }
  net::Connection& connection(int peer) {
    return is_coordinator() ? workers_.at(peer) : coordinator_;
  }
  // Rank 0: waits for every worker's hello, then sends all of them the host table. Returns
  // whether lists go through mailboxes.
  bool accept_workers(const std::string& advertise_host, rendezvous::Store& store,
                      const std::string& secret, net::Protection protection, bool mailboxes,
                      const net::Deadline& until);
  // Other ranks: connects to rank 0 and reads the host table; returns the mailbox choice.
  bool connect_to_coordinator(const std::string& hostname, rendezvous::Store& store,
                              const std::string& secret, net::Protection protection,
                              const net::Deadline& until);
  void map_mailboxes(const SegmentFactory& segment);
  void send(int peer, const std::vector<uint8_t>& frame, const net::Deadline& until,
            bool hold_doorbell = false);
  std::optional<std::vector<uint8_t>> next_frame(int peer);

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<std::string> hosts_;
  std::vector<net::Connection> workers_;  // coordinator only, by rank
  net::Connection coordinator_;           // workers only
  // With mailboxes, by peer: lists coming in, lists going out.
  std::unique_ptr<transport::Segment> segment_;
  std::vector<std::optional<Mailbox>> inbox_, outbox_;
  // By peer: frames read from its socket not yet taken (with mailboxes, lists that went over
  // the socket, each behind its sequence number, until their turn comes).
  std::vector<std::deque<std::vector<uint8_t>>> stash_;
  std::vector<uint64_t> send_seq_, recv_seq_;  // with mailboxes, by peer: lists sent, taken
  std::vector<uint8_t> doorbell_held_;         // with mailboxes, by peer
  int doorbells_held_ = 0;
  net::Clock::time_point ring_at_{};  // when the doorbells held back ring at the latest
};

}  // namespace krug::engine
