#include "run/hpc/srun_starter.h"

#include <csignal>

#include "krug/types.h"
#include "run/hpc/slurm.h"

namespace krug::run {

StartedRank SrunStarter::start(const RankLaunch& launch) {
  if (launch.argv.empty()) throw Error("krugrun: empty command");
  // The rank's environment is srun's: srun --export=ALL hands it to the step unchanged, apart
  // from the SLURM_* variables Slurm sets for the step (krug reads none of them).
  auto argv = slurm::srun_argv(job_id_, launch.slot.rank, launch.slot.host, launch.argv);
  try {
    return spawn_process(argv, launch.envp, false, describe_rank(launch.slot), SIGTERM);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + ". krugrun is inside Slurm job " + job_id_ +
                " and starts ranks with srun; make srun available on PATH, or give -H to start "
                "ranks without Slurm.");
  }
}

}  // namespace krug::run
