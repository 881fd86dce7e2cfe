// The hosts an elastic job may use (docs/elastic.md): the host discovery script's latest list,
// less the hosts blacklisted for a failed or straggling worker.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "run/cli/hosts.h"
#include "run/cli/options.h"
#include "run/elastic/plan.h"

namespace krug::run {

class ElasticHosts {
 public:
  explicit ElasticHosts(const ElasticOptions& options);

  // Runs the discovery script and takes its list. The first time a failing script throws
  // krug::Error; later it must not end a running job: the previous list stays (the error is
  // printed once). Returns whether the list was taken.
  bool discover(bool first);
  const std::vector<HostSlots>& list() const { return hosts_; }
  // The slots `host` has in the list; nullopt once it left.
  std::optional<int> slots(const std::string& host) const;

  // Blacklists `host` from now; returns for how long, in words ("for 3.5 s").
  std::string blacklist(const std::string& host);
  bool blocked(const std::string& host) const;

 private:
  const ElasticOptions& e_;
  HostBlacklist blacklist_;
  std::vector<HostSlots> hosts_;
  std::string last_error_;
};

}  // namespace krug::run
