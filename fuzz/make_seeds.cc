// Writes the binary seed corpora of fuzz/corpus (control_message, rendezvous_frames) from the
// real encoders, so the seeds follow the wire format. Not run by the tests; after a format
// change: cmake --build build-fuzz --target fuzz_make_seeds && build-fuzz/fuzz/fuzz_make_seeds
// fuzz/corpus, then commit what changed.
#include <cstdint>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "controller/message.h"
#include "net/socket.h"
#include "rendezvous/protocol.h"

namespace {

using namespace krug::controller;
using krug::net::Writer;
using Op = krug::rendezvous::protocol::Op;

void save(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

void control_messages(const std::string& dir) {
  save(dir + "/empty_requests", encode(RequestList{}));
  RequestList requests;
  requests.rank = 3;
  Request grad{.name = "grad.w", .shape = {4, 5}};
  Request gather{
      .name = "gather", .op = OpType::kAllgather, .dtype = krug::DataType::kFloat16, .shape = {2}};
  Request swap{.name = "a2a", .op = OpType::kAlltoall, .shape = {3, 2}, .splits = {1, 2}};
  Request set{.name = "set", .op = OpType::kAddProcessSet, .set_ranks = {0, 2}};
  Request grouped{.name = "g.0",
                  .prescale = 0.5,
                  .postscale = 2.0,
                  .group = "g",
                  .group_size = 2,
                  .device = kCudaMemory};
  requests.requests = {grad, gather, swap, set, grouped};
  requests.cache_hits = {0, 7};
  save(dir + "/requests", encode(requests));
  save(dir + "/fatal_request",
       encode(RequestList{.rank = 1, .shutdown = true, .fatal_error = "rank 1: peer closed"}));

  save(dir + "/empty_responses", encode(ResponseList{}));
  ResponseList responses;
  Response fused = response_for(grad);
  fused.names.push_back("grad.b");
  fused.shapes.push_back({5});
  Response cached{.cache_ids = {1, 2}, .from_cache = true};
  Response gathered = response_for(gather);
  gathered.rank_dims = {2, 3};
  Response failed{.type = ResponseType::kError, .names = {"x"}, .error = "mismatch"};
  Response join{.op = OpType::kJoin, .last_joined_rank = 2};
  responses.responses = {fused, cached, gathered, failed, join};
  responses.tuned_fusion_threshold = 1 << 20;
  responses.tuned_cycle_time_ms = 2.5;
  responses.stalls = {
      {.name = "w", .ready_ranks = {0}, .missing_ranks = {1}, .waited_seconds = 61}};
  save(dir + "/responses", encode(responses));
  save(dir + "/shutdown",
       encode(ResponseList{.shutdown = true, .shutdown_reason = "rank 2 died", .fatal = true}));
}

// A request frame as RendezvousClient sends it: u32 length, then the request.
void frame(std::vector<uint8_t>& out, const std::vector<uint8_t>& request) {
  Writer w;
  w.u32(static_cast<uint32_t>(request.size()));
  std::vector<uint8_t> length = w.take();
  out.insert(out.end(), length.begin(), length.end());
  out.insert(out.end(), request.begin(), request.end());
}

std::vector<uint8_t> set(const std::string& key, const std::string& value) {
  Writer w;
  w.u8(uint8_t(Op::kSet));
  w.str(key);
  w.bytes(reinterpret_cast<const uint8_t*>(value.data()), value.size());
  return w.take();
}

std::vector<uint8_t> keyed(Op op, const std::string& key) {
  Writer w;
  w.u8(uint8_t(op));
  w.str(key);
  return w.take();
}

// A request of one key and a 64-bit field: get's timeout (ms), add's delta.
std::vector<uint8_t> keyed(Op op, const std::string& key, uint64_t field) {
  std::vector<uint8_t> request = keyed(op, key);
  Writer w;
  w.u64(field);
  const std::vector<uint8_t> tail = w.take();
  request.insert(request.end(), tail.begin(), tail.end());
  return request;
}

std::vector<uint8_t> get(const std::string& key, uint64_t timeout_ms) {
  return keyed(Op::kGet, key, timeout_ms);
}

std::vector<uint8_t> add(const std::string& key, int64_t delta) {
  return keyed(Op::kAdd, key, static_cast<uint64_t>(delta));
}

std::vector<uint8_t> keys(Op op, const std::vector<std::string>& names, bool timeout) {
  Writer w;
  w.u8(uint8_t(op));
  w.u32(static_cast<uint32_t>(names.size()));
  for (const auto& k : names) w.str(k);
  if (timeout) w.u64(1000);
  return w.take();
}

void rendezvous_frames(const std::string& dir) {
  std::vector<uint8_t> session;
  frame(session, set("rank/0/addr", "10.0.0.1:4000"));
  frame(session, get("rank/0/addr", 1000));
  frame(session, add("counter", 1));
  frame(session, add("counter", -1));
  frame(session, keys(Op::kCheck, {"rank/0/addr", "absent"}, false));
  frame(session, keys(Op::kWait, {"rank/0/addr"}, true));
  frame(session, keyed(Op::kErase, "rank/0/addr"));
  save(dir + "/session", session);

  std::vector<uint8_t> parked;
  frame(parked, get("later", 5000));  // parks, then times out
  frame(parked, set("later", "v"));
  frame(parked, keys(Op::kWait, {"a", "b"}, true));
  save(dir + "/parked", parked);

  std::vector<uint8_t> odd;
  frame(odd, set("n", "x"));
  frame(odd, add("n", 1));  // not a counter: an error reply
  frame(odd, get("forever", std::numeric_limits<uint64_t>::max()));
  frame(odd, {9});  // unknown op
  frame(odd, {});   // empty request
  save(dir + "/errors", odd);

  std::vector<uint8_t> partial;
  frame(partial, set("k", "v"));
  partial.insert(partial.end(), {0x20, 0, 0, 0, uint8_t(Op::kGet)});  // a frame cut short
  save(dir + "/partial", partial);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds CORPUS_DIR (fuzz/corpus)\n";
    return 2;
  }
  const std::string root = argv[1];
  control_messages(root + "/control_message");
  rendezvous_frames(root + "/rendezvous_frames");
  return 0;
}
