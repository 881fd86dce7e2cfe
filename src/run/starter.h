// How a rank is started on a host. Only local hosts exist today (fork/exec); an ssh starter for
// remote hosts plugs in behind the same interface later, picked by make_starter().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "run/fd.h"
#include "run/hosts.h"
#include "run/process.h"

namespace krug::run {

struct RankLaunch {
  RankSlot slot;
  std::vector<std::string> argv;
  std::vector<std::string> envp;              // complete environment, NAME=value
  std::vector<std::string> forward_env_names;  // -x VAR: what a remote starter must carry over
};

struct StartedRank {
  RankProcess process;
  Fd stdout_pipe;  // read ends
  Fd stderr_pipe;
};

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

// The starter for `host`; throws krug::Error for hosts that are not this machine, since remote
// starts need ssh support, which is not built yet.
std::unique_ptr<RankStarter> make_starter(const std::string& host, const std::string& this_hostname);

}  // namespace krug::run
