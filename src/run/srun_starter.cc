#include "run/srun_starter.h"

#include "krug/types.h"
#include "run/slurm.h"

namespace krug::run {

StartedRank SrunStarter::start(const RankLaunch& launch) {
  if (launch.argv.empty()) throw Error("krugrun: empty command");
  RankLaunch via_srun = launch;
  // The rank's environment is srun's: srun --export=ALL hands it to the step unchanged, apart
  // from the SLURM_* variables Slurm sets for the step (krug reads none of them).
  via_srun.argv = slurm::srun_argv(job_id_, launch.slot.rank, launch.slot.host, launch.argv);
  try {
    return local_.start(via_srun);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + ". krugrun is inside Slurm job " + job_id_ +
                " and starts ranks with srun; make srun available on PATH, or give -H to start "
                "ranks without Slurm.");
  }
}

}  // namespace krug::run
