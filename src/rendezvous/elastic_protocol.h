// The keys and values krugrun's elastic driver and its workers exchange through the job's
// rendezvous store (docs/elastic.md). Pure text codecs, unit-tested; both sides use them.
//
//   elastic/join/<worker>/<seq>      worker: "I am ready for a rank" (seq = its init() count)
//   elastic/assign/<worker>/<seq>    driver: the worker's place in the next round, or removal
//   elastic/hosts                    driver: host-set version (bumped on every change)
//   elastic/health/<round>           coordinator (rank 0): cumulative readiness statistics
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace krug::rendezvous::elastic {

std::string join_key(std::string_view worker, int64_t seq);
std::string assign_key(std::string_view worker, int64_t seq);
inline constexpr const char* kHostsKey = "elastic/hosts";
std::string health_key(int64_t round);
// Every key of a round's engine lives under this PrefixStore prefix (a fresh namespace per round).
std::string round_prefix(int64_t round);

// A worker's place in a round. `removed` set: the driver took the worker out of the job (its
// host left the discovery output or was blacklisted); the reason is for the worker's message.
struct Assignment {
  int64_t round = 0;
  int rank = 0, size = 0, local_rank = 0, local_size = 0, cross_rank = 0, cross_size = 0;
  std::string hostname;
  bool has_new_workers = false;  // someone in this round has no state yet: every rank syncs
  int64_t hosts_version = 0;     // elastic/hosts version the round was formed at
  std::optional<std::string> removed;
};
std::string encode(const Assignment& a);
// Throws krug::Error naming the text when it is not an encoded Assignment.
Assignment decode_assignment(std::string_view text);

// The host set as the driver last changed it. `last_addition` is the version of the newest
// change that added slots: changes after a round's version that were all removals let the
// survivors skip re-synchronizing their state.
struct HostsVersion {
  int64_t version = 0;
  int64_t last_addition = 0;
};
std::string encode(const HostsVersion& h);
HostsVersion decode_hosts_version(std::string_view text);

// Readiness statistics of one round, cumulative since it began, published by its coordinator
// (controller/readiness_stats.h): `tensors` observed; `steps` = intervals between consecutive
// readiness of the most frequent tensor; `elapsed_us` = time the window of these totals spans;
// `lateness_us[r]` = wall time the others spent waiting for rank r (from the median rank's
// submission of a tensor to r's; overlapping waits counted once).
struct Health {
  int64_t elapsed_us = 0;  // since the first tensor was observed, when the report was made
  int64_t tensors = 0;
  int64_t steps = 0;
  std::vector<int64_t> lateness_us;
};
std::string encode(const Health& h);
Health decode_health(std::string_view text);

}  // namespace krug::rendezvous::elastic
