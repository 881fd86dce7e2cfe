#include "run/elastic/hosts.h"

#include <fmt/format.h>

#include <algorithm>

#include "krug/types.h"
#include "run/elastic/discovery.h"

namespace krug::run {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kDiscoveryTimeout = std::chrono::seconds(30);

}  // namespace

ElasticHosts::ElasticHosts(const ElasticOptions& options)
    : e_(options), blacklist_(options.cooldown_range) {}

bool ElasticHosts::discover(bool first) {
  std::vector<HostSlots> found;
  try {
    found = parse_discovery_output(run_discovery_script(e_.discovery_script, kDiscoveryTimeout),
                                   e_.discovery_script, e_.slots_per_host);
  } catch (const Error& err) {
    if (first) throw;
    // A flaky script must not end a running job: keep the hosts it printed last.
    if (err.what() != last_error_)
      fmt::print(stderr, "krugrun: elastic: {} (keeping the previous host list)\n", err.what());
    last_error_ = err.what();
    return false;
  }
  last_error_.clear();
  if (first && found.empty())
    fmt::print(stderr,
               "krugrun: elastic: the discovery script lists no host yet; waiting up to "
               "{} s (--elastic-timeout)\n",
               e_.elastic_timeout_s);
  hosts_ = std::move(found);
  return true;
}

std::optional<int> ElasticHosts::slots(const std::string& host) const {
  auto it = std::find_if(hosts_.begin(), hosts_.end(),
                         [&](const HostSlots& h) { return h.host == host; });
  if (it == hosts_.end()) return std::nullopt;
  return it->slots;
}

std::string ElasticHosts::blacklist(const std::string& host) {
  const auto cooldown = blacklist_.add(host, Clock::now());
  return cooldown ? fmt::format("for {:.1f} s", *cooldown) : "for the rest of the job";
}

bool ElasticHosts::blocked(const std::string& host) const {
  return blacklist_.blocked(host, Clock::now());
}

}  // namespace krug::run
