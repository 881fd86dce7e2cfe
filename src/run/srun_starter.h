// Starts ranks inside a Slurm allocation as job steps: `srun ... command` run on this machine
// (the batch script's node), one step per rank, on the host krugrun's layout gave it.
#pragma once

#include <string>

#include "run/starter.h"

namespace krug::run {

// srun is a local child of krugrun in its own process group, so the supervisor treats it like
// any rank: its stdout/stderr pipes carry the rank's output, its exit status is the rank's
// (srun reports a task killed by signal N as status 128 + N), and SIGTERM to its group makes
// srun cancel the step, which kills the rank's processes on their node. If krugrun dies, srun
// dies with it (PR_SET_PDEATHSIG) and srun's own watchdog process cancels the step.
class SrunStarter : public RankStarter {
 public:
  explicit SrunStarter(std::string job_id) : job_id_(std::move(job_id)) {}
  StartedRank start(const RankLaunch& launch) override;

 private:
  std::string job_id_;
  LocalStarter local_;
};

}  // namespace krug::run
