#include "run/launch/ssh.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "krug/types.h"
#include "run/cli/options.h"
#include "run/launch/env_block.h"
#include "run/launch/rank_env.h"

namespace krug::run {
namespace {

bool is_shell_safe(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("@%+=:,./-_").find(c) != std::string_view::npos;
}

// What a remote host printed when the wrapper is missing there: the shell's 127.
constexpr int kCommandNotFound = 127;

}  // namespace

std::string shell_quote(std::string_view s) {
  if (!s.empty() && std::all_of(s.begin(), s.end(), is_shell_safe)) return std::string(s);
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::vector<std::string> ssh_argv(const SshOptions& o, const std::string& host,
                                  const std::string& remote_command) {
  std::vector<std::string> argv{"ssh"};
  if (!o.config_file.empty()) argv.insert(argv.end(), {"-F", o.config_file});
  if (o.port > 0) argv.insert(argv.end(), {"-p", std::to_string(o.port)});
  if (!o.identity_file.empty()) argv.insert(argv.end(), {"-i", o.identity_file});
  const int connect = std::max(1, static_cast<int>(std::ceil(o.connect_timeout_s)));
  // Never prompt (there is no terminal), accept a first-seen host key but refuse a changed one,
  // and notice a dead link within ~20 s so the job ends instead of hanging.
  for (const std::string& opt :
       {std::string("BatchMode=yes"), std::string("StrictHostKeyChecking=accept-new"),
        fmt::format("ConnectTimeout={}", connect), std::string("ServerAliveInterval=5"),
        std::string("ServerAliveCountMax=3")})
    argv.insert(argv.end(), {"-o", opt});
  argv.insert(argv.end(), {"-T", "--", host, remote_command});
  return argv;
}

std::string remote_rank_command(const SshOptions& o, const std::vector<std::string>& argv) {
  std::string cmd = "exec " + shell_quote(o.krugrun_path) + " __remote-exec";
  if (!o.working_dir.empty()) cmd += " --cwd " + shell_quote(o.working_dir);
  cmd += " --";
  for (const auto& a : argv) cmd += " " + shell_quote(a);
  return cmd;
}

std::vector<std::pair<std::string, std::string>> remote_environment(
    const std::vector<std::string>& envp, const std::vector<std::string>& forward_names) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& kv : envp) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string name = kv.substr(0, eq);
    bool wanted =
        carried_to_other_hosts(name) ||
        std::find(forward_names.begin(), forward_names.end(), name) != forward_names.end();
    if (wanted) out.emplace_back(std::move(name), kv.substr(eq + 1));
  }
  return out;
}

StartedRank SshStarter::start(const RankLaunch& launch) {
  const std::string what =
      fmt::format("rank {} on host {} (ssh)", launch.slot.rank, launch.slot.host);
  const std::string block =
      encode_env_block(remote_environment(launch.envp, launch.forward_env_names));
  if (block.size() > kMaxEnvBlockBytes)
    throw Error(
        fmt::format("krugrun: cannot start {}: the environment to carry over is {} bytes, "
                    "more than the {} a remote rank accepts; unset large variables",
                    what, block.size(), kMaxEnvBlockBytes));
  auto argv = ssh_argv(options_, launch.slot.host, remote_rank_command(options_, launch.argv));
  // The secret travels in the block on ssh's stdin only: in ssh's own environment it would sit
  // in /proc/<ssh pid>/environ on this host for as long as the rank runs.
  std::vector<std::string> ssh_env = launch.envp;
  std::erase_if(ssh_env, [](const std::string& kv) { return kv.starts_with("KRUG_SECRET="); });
  StartedRank started = spawn_process(argv, ssh_env, /*stdin_pipe=*/true, what);
  // A pipe that holds the whole block lets the write return at once, whatever ssh is doing;
  // the remote wrapper reads it as soon as its session starts.
  const int fd = started.stdin_keepalive.get();
  if (::fcntl(fd, F_GETPIPE_SZ) < static_cast<int>(block.size()))
    ::fcntl(fd, F_SETPIPE_SZ, static_cast<int>(block.size()));
  // A failed write means ssh already exited: the supervisor reports why from its output.
  write_all(fd, block);
  return started;
}

std::vector<HostCheck> check_hosts(const std::vector<std::string>& hosts, const SshOptions& o) {
  struct Probe {
    StartedRank started;
    std::string output;
  };
  const std::string probe_cmd = "test -x " + shell_quote(o.krugrun_path) + " || exit " +
                                std::to_string(kCommandNotFound);
  std::vector<Probe> probes;
  probes.reserve(hosts.size());
  for (const auto& h : hosts)
    probes.push_back(Probe{spawn_process(ssh_argv(o, h, probe_cmd), to_envp(current_environment()),
                                         false, "the ssh check of host " + h),
                           {}});

  // ssh's ConnectTimeout bounds the connection; this bounds everything else (a hung sshd).
  std::vector<PipeReader> readers;
  for (auto& p : probes) readers.push_back({&p.started.stderr_pipe, &p.output});
  drain_pipes(readers, std::chrono::steady_clock::now() +
                           std::chrono::milliseconds(
                               static_cast<int64_t>(o.connect_timeout_s * 1000) + 5000));

  std::vector<HostCheck> results;
  for (size_t i = 0; i < hosts.size(); ++i) {
    Probe& p = probes[i];
    HostCheck r{hosts[i], false, {}};
    // stderr closed: the process is exiting; wait for it briefly, then give up on it.
    for (int tries = 0; tries < 100 && !p.started.process.try_reap(); ++tries)
      ::usleep(10000);
    std::string said = p.output;
    while (!said.empty() && (said.back() == '\n' || said.back() == '\r')) said.pop_back();
    if (!p.started.process.reaped()) {
      r.problem = fmt::format("no answer within {} s", o.connect_timeout_s);
    } else {
      int st = *p.started.process.status();
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (code == 0)
        r.ok = true;
      else if (code == kCommandNotFound)
        r.problem = fmt::format("{} does not exist there; install krug at the same path on every "
                                "host",
                                o.krugrun_path);
      else
        r.problem = said.empty() ? fmt::format("ssh exited with status {}", code) : said;
    }
    results.push_back(std::move(r));
  }
  return results;  // unreaped probes are killed and reaped by their RankProcess destructors
}

SshOptions ssh_options(const LaunchOptions& o) {
  SshOptions ssh;
  ssh.port = o.ssh_port;
  ssh.identity_file = o.ssh_identity_file;
  ssh.config_file = o.ssh_config_file;
  ssh.connect_timeout_s = o.start_timeout_s;
  std::error_code ec;
  ssh.krugrun_path = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  ssh.working_dir = std::filesystem::current_path(ec).string();
  return ssh;
}

}  // namespace krug::run
