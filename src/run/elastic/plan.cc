#include "run/elastic/plan.h"

#include <algorithm>
#include <cmath>

namespace krug::run {

std::map<std::string, rendezvous::elastic::Assignment> plan_round(
    std::vector<RoundMember> members, const std::vector<std::string>& host_order, int64_t round,
    int64_t hosts_version) {
  auto host_index = [&](const std::string& h) {
    auto it = std::find(host_order.begin(), host_order.end(), h);
    return static_cast<size_t>(it - host_order.begin());
  };
  std::stable_sort(members.begin(), members.end(), [&](const RoundMember& a, const RoundMember& b) {
    if (a.previous_rank.has_value() != b.previous_rank.has_value())
      return a.previous_rank.has_value();
    if (a.previous_rank) return *a.previous_rank < *b.previous_rank;
    if (host_index(a.host) != host_index(b.host)) return host_index(a.host) < host_index(b.host);
    return a.slot < b.slot;
  });
  const bool has_new = std::any_of(members.begin(), members.end(),
                                   [](const RoundMember& m) { return !m.previous_rank; });
  std::map<std::string, int> per_host;  // ranks placed on each host so far
  std::vector<int> local_rank(members.size());
  for (size_t i = 0; i < members.size(); ++i) local_rank[i] = per_host[members[i].host]++;
  std::map<int, int> per_local;  // ranks with each local rank (cross_size)
  for (int l : local_rank) ++per_local[l];
  std::map<int, int> cross_next;
  std::map<std::string, rendezvous::elastic::Assignment> out;
  for (size_t i = 0; i < members.size(); ++i) {
    rendezvous::elastic::Assignment a;
    a.round = round;
    a.rank = static_cast<int>(i);
    a.size = static_cast<int>(members.size());
    a.local_rank = local_rank[i];
    a.local_size = per_host[members[i].host];
    a.cross_rank = cross_next[local_rank[i]]++;
    a.cross_size = per_local[local_rank[i]];
    a.hostname = members[i].host;
    a.has_new_workers = has_new;
    a.hosts_version = hosts_version;
    out[members[i].worker] = a;
  }
  return out;
}

HostBlacklist::HostBlacklist(std::optional<std::pair<double, double>> cooldown_range, uint64_t seed)
    : range_(cooldown_range), rng_(seed) {}

std::optional<double> HostBlacklist::add(const std::string& host, Clock::time_point now) {
  const int earlier = failures_[host]++;
  if (!range_) {
    until_[host] = std::nullopt;
    return std::nullopt;
  }
  std::uniform_real_distribution<double> draw(range_->first, range_->second);
  const double seconds =
      std::min(draw(rng_) * std::pow(2.0, std::min(earlier, 3)), range_->second * 8);
  until_[host] =
      now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  return seconds;
}

bool HostBlacklist::blocked(const std::string& host, Clock::time_point now) const {
  auto it = until_.find(host);
  if (it == until_.end()) return false;
  return !it->second || now < *it->second;
}

std::optional<Straggler> find_straggler(const rendezvous::elastic::Health& from,
                                        const rendezvous::elastic::Health& to, double factor,
                                        int64_t window_steps) {
  const int64_t steps = to.steps - from.steps;
  const int64_t elapsed_us = to.elapsed_us - from.elapsed_us;
  if (factor <= 1 || steps < std::max<int64_t>(window_steps, 1) || elapsed_us <= 0 ||
      to.lateness_us.size() < 2 || from.lateness_us.size() != to.lateness_us.size())
    return std::nullopt;
  Straggler worst;
  int64_t worst_us = 0;
  for (size_t r = 0; r < to.lateness_us.size(); ++r) {
    const int64_t late = to.lateness_us[r] - from.lateness_us[r];
    if (late > worst_us) {
      worst.rank = static_cast<int>(r);
      worst_us = late;
    }
  }
  if (worst_us <= 0) return std::nullopt;
  worst.steps = steps;
  worst.period_s = elapsed_us / 1e6 / steps;
  worst.lateness_s = worst_us / 1e6 / steps;
  // The share of the window's wall time the others spent waiting for this rank; without it the
  // job would step 1 / (1 - share) times faster. Capped at 1000x.
  const double share = std::min(static_cast<double>(worst_us) / elapsed_us, 0.999);
  worst.slowdown = 1 / (1 - share);
  if (worst.slowdown < factor) return std::nullopt;
  return worst;
}

}  // namespace krug::run
