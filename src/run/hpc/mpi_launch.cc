#include "run/hpc/mpi_launch.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "run/launch/env_block.h"

namespace krug::run {
namespace {

// Per-rank variables krugrun sets without --mpi; under mpirun they would be the same (wrong)
// value on every rank, so they are dropped and init() takes the topology from MPI.
constexpr const char* kTopologyVariables[] = {
    "KRUG_RANK",          "KRUG_SIZE",          "KRUG_LOCAL_RANK",    "KRUG_LOCAL_SIZE",
    "KRUG_CROSS_RANK",    "KRUG_CROSS_SIZE",    "KRUG_HOSTNAME",      "HOROVOD_RANK",
    "HOROVOD_SIZE",       "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME"};

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::string host_list(const std::vector<HostSlots>& hosts) {
  std::string list;
  for (const auto& h : hosts)
    list += (list.empty() ? "" : ",") + h.host + ":" + std::to_string(h.slots);
  return list;
}

// Length of an Open MPI output tag "[digits,digits]<stdout>:" at the start of `s`, with the
// rank and stream; 0 if there is none.
size_t tag_at(std::string_view s, std::string_view& rank, std::string_view& stream) {
  if (s.empty() || s[0] != '[') return 0;
  size_t i = 1;
  auto digits = [&] {
    const size_t begin = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i > begin;
  };
  if (!digits() || i >= s.size() || s[i] != ',') return 0;
  const size_t rank_begin = ++i;
  if (!digits() || i >= s.size() || s[i] != ']') return 0;
  rank = s.substr(rank_begin, i - rank_begin);
  ++i;
  for (std::string_view name : {"<stdout>:", "<stderr>:"})
    if (s.substr(i).rfind(name, 0) == 0) {
      stream = name;
      return i + name.size();
    }
  return 0;
}

}  // namespace

MpirunCommand mpirun_command(const LaunchOptions& options, const EnvMap& base, const JobInfo& job,
                             bool as_root, const std::string& mpirun) {
  MpirunCommand cmd;
  EnvMap& env = cmd.env;
  env = base;
  for (const char* name : kTopologyVariables) env.erase(name);
  for (const auto& [k, v] : options.knob_env) env[k] = v;
  for (const auto& [k, v] : options.set_env) env[k] = v;
  env["KRUG_RENDEZVOUS_ADDR"] = env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = job.rendezvous_addr;
  env["KRUG_RENDEZVOUS_PORT"] = env["HOROVOD_GLOO_RENDEZVOUS_PORT"] =
      std::to_string(job.rendezvous_port);
  env["KRUG_SECRET"] = job.secret;
  env["KRUG_JOB_ID"] = job.job_id;
  if (!env.count("KRUG_CPU_OPERATIONS") && !env.count("HOROVOD_CPU_OPERATIONS"))
    env["KRUG_CPU_OPERATIONS"] = "mpi";
  if (!job.python_dir.empty()) {
    auto it = env.find("PYTHONPATH");
    env["PYTHONPATH"] = (it == env.end() || it->second.empty()) ? job.python_dir
                                                                : job.python_dir + ":" + it->second;
  }

  auto& argv = cmd.argv;
  argv = {mpirun};
  if (as_root) argv.push_back("--allow-run-as-root");
  argv.insert(argv.end(), {"-np", std::to_string(options.np), "--host", host_list(options.hosts),
                           "--bind-to", "none", "--map-by", "slot"});
  if (options.prefix) argv.push_back("--tag-output");
  if (!options.output_dir.empty())
    argv.insert(argv.end(), {"--output-filename", options.output_dir});
  // krugrun's ssh settings become mpirun's (horovodrun passes them the same way), so that
  // mpirun reaches the hosts krugrun's own host check reached.
  std::string rsh_args;
  if (options.ssh_port > 0) rsh_args += " -p " + std::to_string(options.ssh_port);
  if (!options.ssh_identity_file.empty()) rsh_args += " -i " + options.ssh_identity_file;
  if (!options.ssh_config_file.empty()) rsh_args += " -F " + options.ssh_config_file;
  if (!rsh_args.empty()) argv.insert(argv.end(), {"--mca", "plm_rsh_args", rsh_args.substr(1)});
  if (!options.network_interface.empty())
    argv.insert(argv.end(), {"--mca", "btl_tcp_if_include", options.network_interface,
                             "--mca", "oob_tcp_if_include", options.network_interface});
  // mpirun hands its own environment to ranks on this host only; -x carries a variable to
  // every host: what krugrun's ssh start carries, less mpirun's own (OMPI_*, PMIX_*, PMI_*),
  // which mpirun reads itself and sets per rank.
  std::set<std::string> passed;
  for (const auto& [k, v] : env)
    if (carried_to_other_hosts(k) && !starts_with(k, "OMPI_") && !starts_with(k, "PMIX_") &&
        !starts_with(k, "PMI_"))
      passed.insert(k);
  for (const auto& name : options.forward_env)
    if (env.count(name)) passed.insert(name);
  for (const auto& [k, v] : options.set_env) passed.insert(k);
  if (!job.python_dir.empty()) passed.insert("PYTHONPATH");
  for (const auto& name : passed) argv.insert(argv.end(), {"-x", name});
  argv.insert(argv.end(), options.command.begin(), options.command.end());
  return cmd;
}

void MpirunOutput::line(std::string_view line, std::string& out) {
  // Split at tags into (prefix, text) pieces; text before the first tag is mpirun's own.
  std::string prefix;
  size_t begin = 0;
  auto flush_piece = [&](size_t end, bool ends_line) {
    std::string& held = partial_[prefix];
    held.append(line.substr(begin, end - begin));
    if (!ends_line) return;
    out.append(prefix).append(held).push_back('\n');
    partial_.erase(prefix);
  };
  for (size_t at = line.find('['); at != std::string_view::npos; at = line.find('[', at + 1)) {
    std::string_view rank, stream;
    const size_t length = tag_at(line.substr(at), rank, stream);
    if (length == 0) continue;
    if (at > 0) flush_piece(at, false);
    prefix = "[" + std::string(rank) + "]" + std::string(stream);
    begin = at + length;
    at = begin - 1;
  }
  flush_piece(line.size(), true);
}

void MpirunOutput::finish(std::string& out) {
  for (const auto& [prefix, held] : partial_)
    if (!held.empty()) out.append(prefix).append(held).push_back('\n');
  partial_.clear();
}

RendezvousPlace mpi_rendezvous_place(const std::vector<HostSlots>& hosts,
                                     const std::string& this_hostname) {
  const bool all_local = std::all_of(hosts.begin(), hosts.end(), [&](const HostSlots& h) {
    return is_local_host(h.host, this_hostname);
  });
  if (all_local) return {"127.0.0.1", "127.0.0.1"};
  return {"", this_hostname};
}

}  // namespace krug::run
