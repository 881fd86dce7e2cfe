// Merging a job spec under the command line: what the user typed wins over the file.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "krug/types.h"
#include "run/cli/job_spec.h"

namespace krug::run {
namespace {

// The file's workers: workers.hosts or the hostfile, cut to workers.count; count alone means
// that many workers on this machine.
std::vector<HostSlots> file_workers(const JobSpec& spec) {
  std::vector<HostSlots> hosts = spec.hostfile ? read_hostfile(*spec.hostfile) : spec.hosts;
  if (!spec.worker_count) return hosts;
  int count = *spec.worker_count;
  if (hosts.empty()) return {{"localhost", count * spec.processes_per_worker.value_or(1)}};
  if (count > static_cast<int>(hosts.size()))
    throw Error(fmt::format("krugrun: {}: workers.count is {}, but hostfile {} lists {} hosts",
                            spec.path, count, *spec.hostfile, hosts.size()));
  hosts.resize(count);
  return hosts;
}

template <typename T, typename U>
void take(const std::set<std::string>& flags_given, const char* key, const std::optional<T>& file,
          U& option) {
  if (file && flags_given.count(key) == 0) option = *file;
}

}  // namespace

LaunchOptions apply_job_spec(const JobSpec& spec, LaunchOptions o,
                             const std::set<std::string>& flags_given) {
  auto given = [&](const char* key) { return flags_given.count(key) > 0; };

  std::map<std::string, std::string> knobs = spec.knob_env;
  for (const auto& [k, v] : o.knob_env) knobs[k] = v;
  o.knob_env = std::move(knobs);

  // rank_environment applies set_env in order, so the flags' -x VAR=value come last and win;
  // a file value for a variable the command line forwards (-x VAR) is dropped for the same reason.
  std::vector<std::pair<std::string, std::string>> env;
  for (const auto& kv : spec.env)
    if (std::find(o.forward_env.begin(), o.forward_env.end(), kv.first) == o.forward_env.end())
      env.push_back(kv);
  env.insert(env.end(), o.set_env.begin(), o.set_env.end());
  o.set_env = std::move(env);
  std::vector<std::string> forward = spec.forward_env;
  for (const auto& name : o.forward_env)
    if (std::find(forward.begin(), forward.end(), name) == forward.end()) forward.push_back(name);
  o.forward_env = std::move(forward);

  take(flags_given, "output_filename", spec.output_filename, o.output_dir);
  take(flags_given, "verbose", spec.verbose, o.verbose);
  take(flags_given, "prefix", spec.prefix, o.prefix);
  take(flags_given, "start_timeout", spec.start_timeout, o.start_timeout_s);
  take(flags_given, "ssh_port", spec.ssh_port, o.ssh_port);
  take(flags_given, "ssh_identity_file", spec.ssh_identity_file, o.ssh_identity_file);
  take(flags_given, "ssh_config_file", spec.ssh_config_file, o.ssh_config_file);
  take(flags_given, "network_interface", spec.network_interface, o.network_interface);

  // -H or --hostfile on the command line replace the file's whole worker list.
  if (!given("hosts") && !given("hostfile")) {
    o.hosts = file_workers(spec);
    if (spec.hostfile) o.hostfile = *spec.hostfile;
  }
  if (!given("np")) {
    if (spec.np)
      o.np = *spec.np;
    else if (!o.hosts.empty())
      o.np = std::accumulate(o.hosts.begin(), o.hosts.end(), 0,
                             [](int n, const HostSlots& h) { return n + h.slots; });
  }

  if (o.command.empty()) o.steps = step_commands(spec);
  return o;
}

}  // namespace krug::run
