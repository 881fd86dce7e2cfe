// The environment each rank starts with: the launcher's own, the knob flags, -x VAR=value, then
// the topology and rendezvous variables (KRUG_* and Horovod's names for the same values).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "run/cli/hosts.h"
#include "run/cli/options.h"

namespace krug::run {

using EnvMap = std::map<std::string, std::string>;

// What every rank of one job shares.
struct JobInfo {
  std::string rendezvous_addr;
  uint16_t rendezvous_port = 0;
  std::string secret;
  std::string job_id;
  // Prepended to every rank's PYTHONPATH when set: the build tree's Python package
  // (build/python, next to krugrun), so `krugrun python3 train.py` imports krug with no set-up.
  std::string python_dir;
};

EnvMap current_environment();

// Later layers win: base < knob flags < -x VAR=value < launcher-owned topology variables, so a
// stray KRUG_RANK in the parent environment can never confuse a rank about who it is.
EnvMap rank_environment(const EnvMap& base, const LaunchOptions& options, const RankSlot& slot,
                        const JobInfo& job);

// An elastic worker's environment: rank_environment's without the topology (the driver assigns
// ranks at each init(), see rendezvous/elastic_protocol.h), plus KRUG_ELASTIC=1, the worker's
// id and host, and how long its init() waits for the driver.
EnvMap elastic_worker_environment(const EnvMap& base, const LaunchOptions& options,
                                  const std::string& host, const std::string& worker_id,
                                  const JobInfo& job);

// `<directory of this executable>/python` when it exists (krugrun in a build tree), else "".
std::string build_python_dir();

// "NAME=value" strings for execve.
std::vector<std::string> to_envp(const EnvMap& env);

// A short random job id (8 hex digits); it only has to tell concurrent jobs apart in logs.
std::string make_job_id();

}  // namespace krug::run
