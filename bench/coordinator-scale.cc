// coordinator-scale: the coordinator's work per negotiation cycle at thousands of ranks, without
// thousands of processes. Internal API (src/controller): rank 0's real codec and Negotiator.
//
//   build/bench/coordinator-scale [--ranks "1024 4096"] [--tensors 100] [--cycles 50]
//
// Every rank's steady-state request list (its cache hits for --tensors cached 1 KiB allreduces)
// is encoded once, as each rank would send it. A timed cycle is what rank 0 does with them:
// decode each list, add it to the Negotiator, compute the fused response list and encode it
// for the broadcast. Prints per rank count: the median cycle, the bytes a rank sends and
// receives per cycle, and how those grow with --tensors (run twice to see).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "controller/message.h"
#include "controller/negotiator.h"
#include "controller/response_cache.h"

namespace {

using krug::controller::Clock;
using krug::controller::Negotiator;
using krug::controller::Request;
using krug::controller::RequestList;
using krug::controller::ResponseCache;
using krug::controller::ResponseList;

struct Result {
  double median_us;
  size_t request_bytes;
  size_t response_bytes;
};

Result measure(int ranks, int tensors, int cycles) {
  ResponseCache cache(1024);
  Negotiator negotiator(ranks, 64 << 20, cache);
  std::vector<Request> requests(static_cast<size_t>(tensors));
  for (int t = 0; t < tensors; ++t) {
    requests[static_cast<size_t>(t)].name = "grad/" + std::to_string(t);
    requests[static_cast<size_t>(t)].shape = {256};
  }
  // First cycle: full requests from everyone; the responses put every tensor in the cache.
  for (int r = 0; r < ranks; ++r) {
    RequestList list;
    list.rank = r;
    list.requests = requests;
    negotiator.add(list, Clock::now());
  }
  ResponseList first;
  first.responses = negotiator.compute();
  std::vector<uint32_t> ids;
  for (const auto& response : first.responses)
    ids.insert(ids.end(), response.cache_ids.begin(), response.cache_ids.end());
  std::vector<std::vector<uint8_t>> wire(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    RequestList list;
    list.rank = r;
    list.cache_hits = ids;
    wire[static_cast<size_t>(r)] = krug::controller::encode(list);
  }
  std::vector<double> us;
  size_t response_bytes = 0;
  for (int c = 0; c < cycles; ++c) {
    const auto start = std::chrono::steady_clock::now();
    const auto now = Clock::now();
    for (const auto& bytes : wire)
      negotiator.add(krug::controller::decode_request_list(bytes), now);
    ResponseList out;
    out.responses = negotiator.compute();
    response_bytes = krug::controller::encode(out).size();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                     .count());
    if (out.responses.empty()) {
      std::fprintf(stderr, "coordinator-scale: cycle %d made no response\n", c);
      std::exit(1);
    }
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], wire.front().size(), response_bytes};
}

}  // namespace

int main(int argc, char** argv) {
  std::string ranks_list = "1024 4096";
  int tensors = 100, cycles = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks")
      ranks_list = argv[i + 1];
    else if (flag == "--tensors")
      tensors = std::atoi(argv[i + 1]);
    else if (flag == "--cycles")
      cycles = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "usage: coordinator-scale [--ranks \"1024 4096\"] [--tensors N] "
                   "[--cycles N]\n");
      return 2;
    }
  }
  std::printf("# coordinator-scale: %d cached tensors, median of %d cycles\n", tensors, cycles);
  std::printf("%8s %14s %18s %19s\n", "ranks", "cycle (us)", "request (B/rank)",
              "response (B/rank)");
  std::istringstream in(ranks_list);
  for (int ranks; in >> ranks;) {
    const Result r = measure(ranks, tensors, cycles);
    std::printf("%8d %14.1f %18zu %19zu\n", ranks, r.median_us, r.request_bytes, r.response_bytes);
  }
  return 0;
}
