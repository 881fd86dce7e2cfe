// The rendezvous server's key-value state and its parked get/wait requests, without any I/O:
// the server loop feeds it request frames and sends back the replies it produces.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace krug::rendezvous {

class ServerState {
 public:
  using Clock = std::chrono::steady_clock;
  struct Reply {
    uint64_t client;
    Bytes payload;  // one reply frame's payload (status byte first)
  };

  // Handles one request frame from `client`. Appends its reply, and the replies of any parked
  // requests it satisfied, to `out`. A get/wait on missing keys is parked instead of answered.
  void handle(uint64_t client, const Bytes& request, Clock::time_point now, std::vector<Reply>& out);
  // Splits `in`, the bytes received from `client` so far, into request frames (a u32
  // little-endian length, then that many bytes) and handles each in order until the client is
  // parked; removes what it handled and leaves a partial frame for later. Returns whether it
  // handled any. Throws net::NetError for a frame longer than net::kMaxFrameSize: the caller
  // drops the client.
  bool handle_frames(uint64_t client, Bytes& in, Clock::time_point now, std::vector<Reply>& out);
  // Answers parked requests whose timeout has passed with a timeout reply.
  void expire(Clock::time_point now, std::vector<Reply>& out);
  // When the next parked request times out, if any (the server's poll timeout).
  std::optional<Clock::time_point> next_deadline() const;
  // A client with a parked request must not have its next request handled yet (order).
  bool parked(uint64_t client) const;
  void drop_client(uint64_t client);

 private:
  struct Waiter {
    uint64_t client;
    bool is_get;  // get replies with the value; wait replies with just kOk
    std::vector<std::string> keys;
    std::chrono::milliseconds timeout;
    Clock::time_point deadline;
  };

  Bytes dispatch(uint64_t client, const Bytes& request, Clock::time_point now, bool& changed);
  std::optional<Bytes> answer_or_park(Waiter w);
  bool present(const std::vector<std::string>& keys) const;
  Bytes answer(const Waiter& w) const;
  Bytes timeout_reply(const Waiter& w) const;
  void release_satisfied(std::vector<Reply>& out);

  std::map<std::string, Bytes> data_;
  std::list<Waiter> waiters_;
};

}  // namespace krug::rendezvous
