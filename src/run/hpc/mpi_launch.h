// `krugrun --mpi`: the ranks are started by Open MPI's mpirun, which krugrun runs as its only
// child. krugrun still serves the job's rendezvous store (the control plane and any Gloo
// connections bootstrap through it) and forwards mpirun's output; mpirun places, starts and
// supervises the ranks, so it cannot be told each rank's KRUG_RANK: init() reads the ranks from
// MPI_COMM_WORLD instead. Pure functions, unit-tested without processes.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "run/cli/hosts.h"
#include "run/cli/options.h"
#include "run/launch/output.h"
#include "run/launch/rank_env.h"

namespace krug::run {

struct MpirunCommand {
  std::vector<std::string> argv;  // "mpirun", its options, then the rank command
  EnvMap env;                     // mpirun's environment; -x names what it passes on to ranks
};

// mpirun with: -np, --host from -H (host:slots, so -H localhost:4 on a 2-core machine needs no
// --oversubscribe), --bind-to none --map-by slot (as horovodrun: ranks run their own threads),
// --tag-output when krugrun prefixes output, --output-filename, --allow-run-as-root when
// `as_root`, and -x for every KRUG_* / HOROVOD_* variable and every -x VAR of the user.
// The environment is `base` without per-rank topology variables (a stray KRUG_RANK would
// override MPI's ranks), plus the knob flags, -x VAR=value, the rendezvous address and secret
// (passed by name: the secret never appears on a command line) and KRUG_CPU_OPERATIONS=mpi
// unless KRUG_CPU_OPERATIONS or HOROVOD_CPU_OPERATIONS is set.
MpirunCommand mpirun_command(const LaunchOptions& options, const EnvMap& base, const JobInfo& job,
                             bool as_root, const std::string& mpirun = "mpirun");

// mpirun's output with --tag-output, regrouped into krugrun's lines "[<rank>]<stdout>:text".
// mpirun tags every chunk a rank writes ("[<job>,<rank>]<stdout>:"), not every line: a rank's
// unterminated write runs into the next chunk's tag, which may be another rank's, so a line of
// mpirun's output can hold pieces of several ranks' lines. Each piece is held back per rank
// until that rank's line ends. Untagged lines (mpirun's own messages) pass through unchanged.
class MpirunOutput : public LineRewriter {
 public:
  void line(std::string_view line, std::string& out) override;
  void finish(std::string& out) override;

 private:
  std::map<std::string, std::string> partial_;  // krugrun prefix ("" = mpirun) -> held text
};

// Where krugrun's rendezvous server listens and what it tells ranks: loopback when every host
// is this machine, else every interface under this host's name (ranks mpirun starts elsewhere
// must reach it).
struct RendezvousPlace {
  std::string bind_host;  // "" = every interface
  std::string advertise;
};
RendezvousPlace mpi_rendezvous_place(const std::vector<HostSlots>& hosts,
                                     const std::string& this_hostname);

}  // namespace krug::run
