// The control plane: a star of authenticated TCP connections between the coordinator (rank 0)
// and every other rank, carrying request lists up and response lists down.
//
// Sockets, not Gloo, because the background loop must sleep in poll() on "local work arrived"
// (an eventfd) and "a peer spoke" at the same time: no idle polling, and a dead peer shows up
// at once as a closed socket.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "controller/message.h"
#include "net/socket.h"
#include "rendezvous/store.h"

namespace krug::engine {

class ControlPlane {
 public:
  // Blocks until every rank is connected or `timeout` passes (throws krug::Error naming the
  // ranks that did not show up).
  ControlPlane(int rank, int size, const std::string& advertise_host, const std::string& hostname,
               rendezvous::Store& store, const std::string& secret,
               std::chrono::milliseconds timeout);

  bool is_coordinator() const { return rank_ == 0; }
  // Coordinator: fds of connected workers, indexed by rank (-1 for self or a closed peer).
  // Worker: a single fd to the coordinator at index 0.
  std::vector<int> fds() const;
  const std::string& host_of(int rank) const { return hosts_.at(rank); }

  void send_to_coordinator(const controller::RequestList& list);
  controller::ResponseList recv_from_coordinator();
  controller::RequestList recv_from_worker(int rank);
  // Sends to every still-connected worker; a worker whose send fails is closed and reported in
  // the returned list of ranks.
  std::vector<int> broadcast(const controller::ResponseList& list);
  void close_worker(int rank);

 private:
  net::Deadline deadline() const { return net::Clock::now() + timeout_; }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<std::string> hosts_;
  std::vector<net::Connection> workers_;  // coordinator only, by rank
  net::Connection coordinator_;           // workers only
};

}  // namespace krug::engine
