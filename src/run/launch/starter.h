// How a rank is started on a host: fork/exec on this machine, ssh (run/launch/ssh.h) on others;
// make_starter() picks one per host.
#pragma once

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "run/cli/hosts.h"
#include "run/launch/fd.h"
#include "run/launch/process.h"

namespace krug::run {

struct RankLaunch {
  RankSlot slot;
  std::vector<std::string> argv;
  std::vector<std::string> envp;               // complete environment, NAME=value
  std::vector<std::string> forward_env_names;  // -x VAR: what a remote starter must carry over
};

struct StartedRank {
  RankProcess process;
  Fd stdout_pipe;  // read ends
  Fd stderr_pipe;
  // Write end of the rank's stdin when it is a pipe (ssh): holding it open keeps the remote rank
  // alive; closing it (or krugrun dying) tells the remote side to stop the rank.
  Fd stdin_keepalive;
};

// fork/execvp `argv` with `envp` in its own process group. stdin is /dev/null, or a pipe whose
// write end is returned when `stdin_pipe`. `what` names the rank and host in the error thrown
// when the program cannot be started. When krugrun dies, even by SIGKILL, the process gets
// `death_signal`: SIGKILL for ranks; SIGTERM, exactly once, for programs that must clean up
// after themselves (they run under a keeper process: the returned process is the keeper, which
// ends as the program ends).
StartedRank spawn_process(const std::vector<std::string>& argv,
                          const std::vector<std::string>& envp, bool stdin_pipe,
                          const std::string& what, int death_signal = SIGKILL);

// "rank R on host H", as errors name a rank.
std::string describe_rank(const RankSlot& slot);

class RankStarter {
 public:
  virtual ~RankStarter() = default;
  // Starts the rank in its own process group with stdin from /dev/null. Throws krug::Error
  // naming the rank, host and command when it cannot be started.
  virtual StartedRank start(const RankLaunch& launch) = 0;
};

// fork/exec on this machine.
class LocalStarter : public RankStarter {
 public:
  StartedRank start(const RankLaunch& launch) override;
};

struct SshOptions;

// The starter for `host`: local for names of this machine (is_local_host with this network
// namespace's addresses), ssh otherwise.
std::unique_ptr<RankStarter> make_starter(const std::string& host, const std::string& this_hostname,
                                          const std::vector<std::string>& local_addresses,
                                          const SshOptions& ssh);

}  // namespace krug::run
