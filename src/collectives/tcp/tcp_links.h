// A TCP communicator's connections to the other members, and the rounds of messages the
// algorithms (tcp_algorithms.h) run over them.
//
// A connection to a member is made the first time a round involves it: the lower-indexed member
// dials (its peer's address comes from the store), the higher one takes the connection its
// device accepted. Dials never wait on a peer's progress, only on its listener, so members that
// need connections in different orders cannot deadlock. An algorithm that talks to O(log n)
// peers therefore holds O(log n) sockets, whatever the job's size.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/tcp/tcp_device.h"
#include "rendezvous/store.h"

namespace krug::collectives::tcp {

struct Send {
  int peer;
  const void* data;
  size_t bytes;
};
struct Recv {
  int peer;
  void* data;
  size_t bytes;
};

class Links {
 public:
  // Member `rank` of `size` members of the communicator `name` (unique among the communicators
  // of the job); `store` is the communicator's own namespace, where this member publishes its
  // device's address. `timeout`: how long a round may go without progress.
  Links(std::string name, int rank, int size, std::shared_ptr<rendezvous::Store> store,
        std::shared_ptr<Device> device, std::chrono::milliseconds timeout);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Runs every send and receive at once and returns when all are done. At most one send and
  // one receive per peer; a peer's receive and send on both ends must be in the same round.
  // Throws net::NetError naming the peer that closed or stalled.
  void round(std::span<const Send> sends, std::span<const Recv> recvs);
  // Sockets this member holds now.
  size_t connections() const;

 private:
  net::Connection& connection(int peer);
  void connect(std::span<const Send> sends, std::span<const Recv> recvs);

  std::string name_;
  int rank_;
  int size_;
  std::shared_ptr<rendezvous::Store> store_;
  std::shared_ptr<Device> device_;
  std::chrono::milliseconds timeout_;
  std::vector<net::Connection> peers_;  // indexed by member; invalid until first used
};

}  // namespace krug::collectives::tcp
