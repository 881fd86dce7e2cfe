// The rendezvous server's request framing and handling (rendezvous/server_state.h) on the bytes
// an authenticated client sends, fed as the server's poll loop feeds them: in two reads, each
// followed by handling frames until none can proceed, parked requests expiring in between. Any
// bytes get replies or a net::NetError for a frame over the size limit (the server drops that
// client); every reply starts with a status byte.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "net/socket.h"
#include "rendezvous/protocol.h"
#include "rendezvous/server_state.h"

namespace {

using krug::rendezvous::Bytes;
using krug::rendezvous::ServerState;

constexpr uint64_t kClient = 1;

void check_replies(const std::vector<ServerState::Reply>& replies) {
  for (const auto& r : replies)
    if (r.client != kClient || r.payload.empty() ||
        r.payload[0] > static_cast<uint8_t>(krug::rendezvous::protocol::Status::kError))
      __builtin_trap();
}

// One round of the server loop for one client; false once the client is dropped.
bool serve(ServerState& state, Bytes& in) {
  // The clock stands still (a request's deadline is now + its timeout, up to a year: advancing
  // the clock by each would overflow it); parked requests are expired by their own deadline.
  const ServerState::Clock::time_point now{};
  std::vector<ServerState::Reply> replies;
  try {
    for (bool progress = true; progress;) {
      progress = state.handle_frames(kClient, in, now, replies);
      // Let every parked request time out, so the next frames are handled too.
      if (auto deadline = state.next_deadline()) state.expire(*deadline, replies);
      progress = progress || !replies.empty();
      check_replies(replies);
      replies.clear();
    }
  } catch (const krug::net::NetError&) {
    state.drop_client(kClient);
    return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ServerState state;
  Bytes in(data, data + size / 2);
  if (!serve(state, in)) return 0;
  in.insert(in.end(), data + size / 2, data + size);
  serve(state, in);
  return 0;
}
