// krugrun: starts -np ranks of a command with the krug / Horovod environment, forwards their
// output and turns the first failure into a stopped job and a non-zero exit.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "krug/types.h"
#include "net/address.h"
#include "net/limits.h"
#include "rendezvous/server.h"
#include "run/cli/hosts.h"
#include "run/cli/options.h"
#include "run/elastic/driver.h"
#include "run/elastic/external_rounds.h"
#include "run/hpc/mpi_run.h"
#include "run/hpc/srun_starter.h"
#include "run/launch/rank_env.h"
#include "run/launch/remote_exec.h"
#include "run/launch/rendezvous_serve.h"
#include "run/launch/signals.h"
#include "run/launch/ssh.h"
#include "run/launch/starter.h"
#include "run/launch/supervisor.h"
#include "run/launch/thread_share.h"
#include "transport/shm_segment.h"

namespace krug::run {
namespace {

constexpr const char* kLocalBindAddr = "127.0.0.1";

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

// Remote hosts, each once, in the order given.
std::vector<std::string> remote_hosts(const std::vector<std::string>& hosts, const std::string& me,
                                      const std::vector<std::string>& my_addresses) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& h : hosts)
    if (!is_local_host(h, me, my_addresses) && seen.insert(h).second) out.push_back(h);
  return out;
}

// Checks every remote host before anything starts; prints one line per unreachable host.
bool all_reachable(const std::vector<std::string>& remote, const SshOptions& ssh, bool print_ok) {
  bool ok = true;
  for (const HostCheck& c : check_hosts(remote, ssh)) {
    if (c.ok) {
      if (print_ok) fmt::print("krugrun: host {}: ok\n", c.host);
      continue;
    }
    ok = false;
    fmt::print(stderr, "krugrun: cannot use host {}: {}\n", c.host, c.problem);
  }
  return ok;
}

int check_hosts_command(const LaunchOptions& options) {
  const std::string me = local_hostname();
  const auto addresses = net::local_addresses();
  std::vector<std::string> names;
  for (const auto& h : options.hosts) {
    names.push_back(h.host);
    if (is_local_host(h.host, me, addresses))
      fmt::print("krugrun: host {}: ok (this machine)\n", h.host);
  }
  return all_reachable(remote_hosts(names, me, addresses), ssh_options(options), true) ? 0 : 1;
}

// The address ranks on `host` dial to reach the rendezvous server: loopback for a one-machine
// job, else the address of --network-interface, else this machine's address on the route there.
std::string rendezvous_address_for(const std::string& host, bool multi_host,
                                   const LaunchOptions& options, const std::string& me,
                                   const std::vector<std::string>& my_addresses,
                                   const std::string& first_remote) {
  if (!multi_host) return kLocalBindAddr;
  if (!options.network_interface.empty()) return net::interface_address(options.network_interface);
  // Local ranks advertise the address they reach the server by, so it must be one the remote
  // hosts can reach too: the one on the route to them.
  const std::string& target = is_local_host(host, me, my_addresses) ? first_remote : host;
  try {
    return net::source_address_toward(target);
  } catch (const Error& e) {
    throw Error(
        fmt::format("krugrun: cannot find this machine's address toward host {}: {}; "
                    "name the interface with --network-interface",
                    target, e.what()));
  }
}

// What every rank of one launch_step shares.
struct StepContext {
  explicit StepContext(const LaunchOptions& o) : options(o) {}

  const LaunchOptions& options;
  std::string this_host = local_hostname();
  std::vector<std::string> my_addresses = net::local_addresses();
  std::vector<std::string> remote;  // the layout's hosts that are not this machine
  JobInfo job;
  EnvMap base_env = current_environment();
  std::vector<std::string> forward_names;  // -x names and those --env sets

  bool multi_host() const { return !remote.empty(); }
  bool via_srun() const { return !options.slurm_job_id.empty(); }
};

// Gives a rank of this host its share of the cores and OpenMP's short spin
// (run/launch/thread_share.h), unless the job chose them; says so once per host with --verbose.
void share_cores_of_this_host(EnvMap& env, const RankSlot& slot, bool verbose) {
  auto chosen = [&](const char* name) {
    auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  for (auto& [name, value] :
       shared_host_settings(chosen, std::to_string(slot.local_size), usable_cores())) {
    if (verbose && slot.local_rank == 0 && name == "OMP_NUM_THREADS")
      fmt::print(stderr,
                 "krugrun: host {}: {} ranks share {} cores, OMP_NUM_THREADS={} each (set "
                 "OMP_NUM_THREADS, e.g. -x OMP_NUM_THREADS=N, to choose)\n",
                 slot.host, slot.local_size, usable_cores(), value);
    env[name] = std::move(value);
  }
}

// Starts one rank and wraps it for the supervisor: its output pumps and whether it is remote.
SupervisedRank start_rank(const StepContext& step, const RankSlot& slot, RankStarter& starter) {
  const LaunchOptions& options = step.options;
  JobInfo rank_job = step.job;
  rank_job.rendezvous_addr =
      rendezvous_address_for(slot.host, step.multi_host(), options, step.this_host,
                             step.my_addresses, step.multi_host() ? step.remote.front() : "");
  // srun ranks are local children whatever their host; their status is the rank's.
  const bool is_remote =
      !step.via_srun() && !is_local_host(slot.host, step.this_host, step.my_addresses);
  EnvMap env = rank_environment(step.base_env, options, slot, rank_job);
  // An ssh-started rank's wrapper shares its own host's cores; srun ranks get Slurm's binding.
  if (!is_remote && !step.via_srun()) share_cores_of_this_host(env, slot, options.verbose);
  RankLaunch launch{slot, options.command, to_envp(env), step.forward_names};
  // Zero-padded to the widest rank, as horovodrun does, so the directories sort by rank.
  const int width = static_cast<int>(std::to_string(std::max(0, slot.size - 1)).size());
  auto [out_file, err_file] =
      output_files(options.output_dir, fmt::format("rank.{:0{}}", slot.rank, width));
  StartedRank started = starter.start(launch);
  if (options.verbose)
    fmt::print(stderr, "krugrun: rank {}: pid {} on host {}{}: {}\n", slot.rank,
               started.process.pid(), slot.host,
               step.via_srun() ? " (srun)"
               : is_remote     ? " (ssh)"
                               : "",
               join(options.command));
  std::string out_prefix = options.prefix ? output_prefix(slot.rank, false) : "";
  std::string err_prefix = options.prefix ? output_prefix(slot.rank, true) : "";
  return SupervisedRank{
      slot,
      std::move(started.process),
      StreamPump(std::move(started.stdout_pipe), STDOUT_FILENO, out_prefix, std::move(out_file)),
      StreamPump(std::move(started.stderr_pipe), STDERR_FILENO, err_prefix, std::move(err_file)),
      is_remote,
      std::move(started.stdin_keepalive)};
}

// One krugrun job: every rank of options.command, supervised until all are gone.
int launch_step(const LaunchOptions& options) {
  if (options.mpi) return launch_mpi(options);
  StepContext step{options};
  const SshOptions ssh = ssh_options(options);
  std::vector<RankSlot> layout = layout_ranks(options.hosts, options.np);
  net::require_open_files(
      layout.size() * 4 + 64,
      fmt::format("krugrun (a connection and output pipes per rank, {} ranks)", layout.size()));
  std::vector<std::string> used_hosts;
  for (const auto& slot : layout) used_hosts.push_back(slot.host);
  step.remote = remote_hosts(used_hosts, step.this_host, step.my_addresses);
  // Every remote host is checked before any rank starts, so a typo or a dead host costs
  // seconds and names itself, instead of a half-started job. (srun needs no ssh.)
  if (step.multi_host() && !step.via_srun() && !all_reachable(step.remote, ssh, false)) {
    fmt::print(stderr,
               "krugrun: no rank was started; check the host names, ssh access "
               "(ssh HOST true must work without a password) and --ssh-* options\n");
    return 1;
  }
  std::vector<std::unique_ptr<RankStarter>> starters;
  for (const auto& slot : layout)
    starters.push_back(step.via_srun()
                           ? std::make_unique<SrunStarter>(options.slurm_job_id)
                           : make_starter(slot.host, step.this_host, step.my_addresses, ssh));

  Fd signal_fd = open_signal_fd();
  // Remote ranks need a listener on an address they can reach; the secret keeps strangers out.
  const std::string bind_addr = step.multi_host() ? "0.0.0.0" : kLocalBindAddr;
  step.job =
      JobInfo{kLocalBindAddr, 0, rendezvous::make_job_secret(), make_job_id(), build_python_dir()};
  rendezvous::RendezvousServer server(
      bind_addr, 0, step.job.secret,
      [](const std::string& m) { std::fprintf(stderr, "krugrun: rendezvous: %s\n", m.c_str()); },
      job_protection(options));
  step.job.rendezvous_port = server.port();
  if (options.verbose)
    fmt::print(stderr, "krugrun: job {}: {} ranks on {} host(s), rendezvous server on {}:{}\n",
               step.job.job_id, options.np, count_hosts(layout), bind_addr,
               step.job.rendezvous_port);
  step.forward_names = options.forward_env;
  for (const auto& [name, value] : options.set_env) step.forward_names.push_back(name);
  std::vector<SupervisedRank> ranks;
  ranks.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i)
    ranks.push_back(start_rank(step, layout[i], *starters[i]));
  // The server outlives the supervisor: it is destroyed only after every rank is gone.
  const int code = Supervisor(std::move(ranks), std::move(signal_fd), options.verbose).run();
  // Shared-memory segments are unlinked once every rank of their set has mapped them; one is
  // left only by a rank that died in between, and this host's are removed here.
  if (const int removed = transport::remove_job_segments(step.job.job_id);
      removed > 0 && options.verbose)
    fmt::print(stderr,
               "krugrun: removed {} shared-memory segment(s) left by ranks that died "
               "during init\n",
               removed);
  return code;
}

// A job spec's `run:` steps one after another: a step starts once every rank of the previous
// one exited 0; the first failing step ends the job with its exit code.
int launch(LaunchOptions options) {
  if (options.check_hosts_only) return check_hosts_command(options);
  if (options.elastic.enabled()) return run_elastic(options);
  if (options.steps.empty()) return launch_step(options);
  const auto steps = std::move(options.steps);
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string& line = steps[i].back();  // {"/bin/sh", "-c", line}
    fmt::print(stderr, "krugrun: step {}/{}: {}\n", i + 1, steps.size(), line);
    options.command = steps[i];
    const int code = launch_step(options);
    if (code != 0) {
      fmt::print(stderr, "krugrun: step {}/{} failed (exit code {}): {}{}\n", i + 1, steps.size(),
                 code, line,
                 i + 1 < steps.size()
                     ? fmt::format("; the {} step(s) after it were not run", steps.size() - i - 1)
                     : "");
      return code;
    }
  }
  return 0;
}

}  // namespace
}  // namespace krug::run

int main(int argc, char** argv) {
  // The remote half of an ssh-started rank (run/launch/remote_exec.h): not a user-facing command.
  if (argc > 1 && std::strcmp(argv[1], "__remote-exec") == 0)
    return krug::run::remote_exec_main(argc, argv);
  // The rendezvous server alone, for krug.spark and krug.ray (run/launch/rendezvous_serve.h).
  if (argc > 1 && std::strcmp(argv[1], "__rendezvous-server") == 0)
    return krug::run::rendezvous_serve_main(argc, argv);
  // ... with elastic rounds for workers the launcher starts (run/elastic/external_rounds.h).
  if (argc > 1 && std::strcmp(argv[1], "__elastic-rendezvous") == 0)
    return krug::run::elastic_rendezvous_main(argc, argv);
  // Before any thread starts (the rendezvous server has one), so all threads inherit the mask.
  krug::run::block_supervised_signals();
  auto parsed = krug::run::parse_command_line(argc, argv);
  if (const int* code = std::get_if<int>(&parsed)) return *code;
  try {
    return krug::run::launch(std::get<krug::run::LaunchOptions>(std::move(parsed)));
  } catch (const krug::Error& e) {
    // Ranks already started were killed and reaped by their RankProcess destructors.
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "krugrun: %s\n", e.what());
    return 1;
  }
}
