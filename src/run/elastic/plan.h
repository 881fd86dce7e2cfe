// The elastic driver's decisions, as pure functions unit-tested without processes: who gets
// which rank in a new round, which hosts are blacklisted until when, and which rank is a
// straggler (docs/elastic.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/elastic_protocol.h"

namespace krug::run {

struct RoundMember {
  std::string worker;  // worker id (w0, w1, ...)
  std::string host;
  int slot = 0;                      // index among this host's workers
  std::optional<int> previous_rank;  // rank in the previous round; none for a new worker
};

// Survivors keep their relative order (the lowest surviving rank becomes rank 0, so rank 0
// always holds committed state), new workers follow in `host_order` and slot order. Local and
// cross ranks as krugrun lays out ranks (run/cli/hosts.h). Keyed by worker id.
std::map<std::string, rendezvous::elastic::Assignment> plan_round(
    std::vector<RoundMember> members, const std::vector<std::string>& host_order, int64_t round,
    int64_t hosts_version);

// Hosts whose workers failed (or straggled) are not used again for a cooldown drawn uniformly
// from the range, doubled for each earlier failure of the same host and capped at the range's
// upper end times 8; without a range, never again in this job.
class HostBlacklist {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HostBlacklist(std::optional<std::pair<double, double>> cooldown_range,
                         uint64_t seed = std::random_device{}());
  // Blacklists `host`; returns its cooldown in seconds, nullopt when permanent.
  std::optional<double> add(const std::string& host, Clock::time_point now);
  bool blocked(const std::string& host, Clock::time_point now) const;

 private:
  std::optional<std::pair<double, double>> range_;
  std::mt19937_64 rng_;
  std::map<std::string, int> failures_;
  std::map<std::string, std::optional<Clock::time_point>> until_;  // nullopt: forever
};

// A rank the others keep waiting for: over the steps between two health reports of a round,
// the others waited `lateness_s` per step for it, in steps of `period_s` (the window's wall
// time over its steps), so without it a step would take period - lateness: it is
// `slowdown` = period / (period - lateness) times slower (capped at 1000).
struct Straggler {
  int rank = 0;
  double slowdown = 0;
  double lateness_s = 0;
  double period_s = 0;
  int64_t steps = 0;
};
// The slowest rank when it is at least `factor` times slower than the others over at least
// `window_steps` steps between `from` and `to`; nullopt otherwise (or when fewer steps passed).
std::optional<Straggler> find_straggler(const rendezvous::elastic::Health& from,
                                        const rendezvous::elastic::Health& to, double factor,
                                        int64_t window_steps);

}  // namespace krug::run
