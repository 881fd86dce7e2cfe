// The job spec file of `krugrun --config job.yaml`: the same settings as krugrun's flags, plus
// a list of steps to run one after another. Schema and example: docs/krugrun.md.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "run/cli/hosts.h"
#include "run/cli/options.h"

namespace krug::run {

struct JobSpec {
  std::string path;       // the file, for messages
  std::optional<int> np;  // np:
  // workers: {hosts: [...], count: N, processes_per_worker: P}. Entries written without
  // ":slots" get P slots (1 without P). `count` keeps the first N workers; with no hosts it
  // means N workers on this machine (localhost with N*P slots).
  std::vector<HostSlots> hosts;
  std::optional<int> worker_count;
  std::optional<int> processes_per_worker;
  std::optional<std::string> hostfile;  // hostfile: (read when the spec is applied)
  std::vector<std::pair<std::string, std::string>> env;  // env: {NAME: value}, in file order
  std::vector<std::string> forward_env;                  // forward_env: [NAME, ...]
  std::map<std::string, std::string> knob_env;  // knob keys (fusion_threshold_mb: 32 ...) as KRUG_*
  std::optional<std::string> output_filename;
  std::optional<bool> verbose;
  std::optional<bool> prefix;  // prefix: false is --no-prefix
  std::optional<double> start_timeout;
  std::optional<int> ssh_port;
  std::optional<std::string> ssh_identity_file, ssh_config_file, network_interface;
  std::vector<std::string> run;  // run: steps, each a shell command line
};

// Reads and checks a job spec file. Throws krug::Error naming the file, line and column and
// the key for: an unreadable file, malformed YAML, an empty file, unknown or repeated keys,
// values of the wrong type or out of range, hosts and hostfile both given, and a missing or
// empty `run:`.
JobSpec load_job_spec(const std::string& path);

// The same, from text (`path` is used in messages only).
JobSpec parse_job_spec(const std::string& text, const std::string& path);

// Each step as the command a rank runs: {"/bin/sh", "-c", step}, so steps are written as on a
// shell command line (quotes, variables, pipes, `cd dir && ...`).
std::vector<std::vector<std::string>> step_commands(const JobSpec& spec);

// Merges a job spec under the options parsed from the command line: a flag given on the
// command line wins over the file. `flags_given` names the flags given, by their job spec key
// ("np", "hosts" for -H, "hostfile", "output_filename", "verbose", "prefix", "start_timeout",
// "ssh_port", "ssh_identity_file", "ssh_config_file", "network_interface"). Knob variables and
// `-x VAR=value` merge per variable (the flag's value wins); `forward_env` lists are joined.
// A command on the command line replaces the file's `run:`; otherwise `steps` gets the file's
// steps. Without np anywhere, np is the slots of the hosts used. Reads the file's hostfile.
// Throws krug::Error naming the file for settings that only conflict once merged.
LaunchOptions apply_job_spec(const JobSpec& spec, LaunchOptions from_flags,
                             const std::set<std::string>& flags_given);

}  // namespace krug::run
