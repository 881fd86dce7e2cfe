// Remote ranks over ssh: the ssh command line, the remote wrapper command, reachability checks.
//
// A remote rank runs as `ssh HOST 'KRUGRUN __remote-exec --cwd DIR VAR=value... -- command'`.
// The wrapper (run/launch/remote_exec.h) is krugrun itself, found at the same path on every host
// (as horovodrun needs horovod everywhere); it stops the rank when the ssh session ends, so
// killing krugrun, or ssh, or cutting the link leaves nothing behind on the remote host.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "run/launch/starter.h"

namespace krug::run {

struct SshOptions {
  int port = 0;                   // --ssh-port; 0: ssh's default (or ~/.ssh/config)
  std::string identity_file;      // --ssh-identity-file
  std::string config_file;        // --ssh-config-file (ssh -F); empty: ~/.ssh/config
  double connect_timeout_s = 30;  // --start-timeout
  std::string krugrun_path;       // the wrapper to run remotely (this krugrun's absolute path)
  std::string working_dir;        // the remote rank's working directory (krugrun's own)
};

struct LaunchOptions;
// krugrun's --ssh-* and --start-timeout flags, this krugrun's path and working directory.
SshOptions ssh_options(const LaunchOptions& options);

// Single-quotes `s` for a POSIX shell unless it is made of safe characters only.
std::string shell_quote(std::string_view s);

// argv of an ssh invocation running the shell command line `remote_command` on `host`.
std::vector<std::string> ssh_argv(const SshOptions& options, const std::string& host,
                                  const std::string& remote_command);

// The remote shell command line that starts `argv` under the wrapper, which reads its
// environment from stdin (run/launch/env_block.h).
std::string remote_rank_command(const SshOptions& options, const std::vector<std::string>& argv);

// The variables a remote rank gets from `envp` (the rank's full local environment): those
// carried_to_other_hosts() accepts, and the names forwarded with -x.
std::vector<std::pair<std::string, std::string>> remote_environment(
    const std::vector<std::string>& envp, const std::vector<std::string>& forward_names);

class SshStarter : public RankStarter {
 public:
  explicit SshStarter(SshOptions options) : options_(std::move(options)) {}
  StartedRank start(const RankLaunch& launch) override;

 private:
  SshOptions options_;
};

struct HostCheck {
  std::string host;
  bool ok = false;
  std::string problem;  // what ssh (or the remote shell) said, when !ok
};

// Connects to every host in parallel (bounded by options.connect_timeout_s) and checks that the
// krugrun wrapper exists there at options.krugrun_path. One result per host, in order.
std::vector<HostCheck> check_hosts(const std::vector<std::string>& hosts, const SshOptions& options);

}  // namespace krug::run
