// A TCP communicator's connections to the other members, and the messages the algorithms
// (tcp_algorithms.h, and the rank-ordered ones of ordered_reduce.h) move over them.
//
// A connection to a member is made the first time a message involves it: the lower-indexed
// member dials (its peer's address comes from the store), the higher one takes the connection
// its device accepted. Dials never wait on a peer's progress, only on its listener, and a member
// waits only for lower-indexed members to dial, which never wait for it: members that need
// connections in different orders cannot deadlock. An algorithm that talks to O(log n) peers
// therefore holds O(log n) sockets, whatever the job's size.
//
// Messages to a peer go out in the order they were posted, and messages from it land in the
// order their receives were posted: the two ends of a pair post in the same order, so a stream
// needs no framing. All I/O happens inside the calls that wait (round, wait_recvs, wait_sends):
// one poll loop over nonblocking sockets, every pending message in flight together.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
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
  // device's address. `timeout`: how long a wait may go without progress.
  Links(std::string name, int rank, int size, std::shared_ptr<rendezvous::Store> store,
        std::shared_ptr<Device> device, std::chrono::milliseconds timeout);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Runs every send and receive at once and returns when all are done. Empty messages are
  // skipped (both ends compute the same sizes). Throws net::NetError naming the peer that
  // closed or stalled.
  void round(std::span<const Send> sends, std::span<const Recv> recvs);

  // Queued messages, for the ordered collectives' Exchange (tcp_exchange.h). `tag` groups
  // receives (a pipeline step) for wait_recvs.
  void post_send(int peer, const void* data, size_t bytes);
  void post_recv(int peer, void* data, size_t bytes, size_t tag);
  // Moves bytes until no receive tagged `tag` or lower is pending.
  void wait_recvs(size_t tag);
  // Moves bytes until every posted send is done.
  void wait_sends();

  // Sockets this member holds now.
  size_t connections() const;

 private:
  struct Message {
    uint8_t* data;
    size_t left;
    size_t tag;
  };
  // An encrypted connection (KRUG_ENCRYPT=1) carries each message as records of at most
  // kRecordBytes (ciphertext, then its tag). Both ends cut a message the same way, as they post
  // the same sizes, so records need no length. A record to send is sealed into `sealed` first; a
  // record received lands in the message's own buffer and is opened there once its tag is in.
  struct Records {
    std::vector<uint8_t> sealed;
    size_t sealed_sent = 0;
    size_t recv_size = 0;  // of the record being received; 0 between records
    size_t recv_left = 0;  // its ciphertext bytes still to come
    uint8_t tag[net::kTagSize] = {};
    size_t tag_got = 0;
  };
  struct Peer {
    net::Connection conn;
    std::deque<Message> sends, recvs;
    bool active = false;  // listed in active_
    Records records;
  };

  Peer& peer(int index) { return peers_.at(static_cast<size_t>(index)); }
  // Connects to every listed peer not yet connected: dials first, then takes.
  void connect(std::vector<int> peers);
  void enqueue(int index, bool is_send, const void* data, size_t bytes, size_t tag);
  // Moves what the socket takes or has now; returns whether anything moved.
  bool pump(int index);
  bool pump_sends(int index);
  bool pump_recvs(int index);
  bool pump_sealed_sends(int index);  // tcp_records.cc
  bool pump_sealed_recvs(int index);
  // Bytes moved by one send or recv: 0 when the socket would block; throws on failure.
  size_t moved_bytes(int index, ssize_t n, bool sending);
  void finish_recv(Peer& p);
  void progress_until(const std::function<bool()>& done);
  std::string describe(int index);

  std::string name_;
  int rank_;
  int size_;
  std::shared_ptr<rendezvous::Store> store_;
  std::shared_ptr<Device> device_;
  std::chrono::milliseconds timeout_;
  std::vector<Peer> peers_;  // indexed by member; the connection is made on first use
  std::vector<int> active_;  // peers with pending messages
  size_t pending_sends_ = 0;
  std::map<size_t, size_t> pending_recvs_;  // tag -> receives pending
};

}  // namespace krug::collectives::tcp
