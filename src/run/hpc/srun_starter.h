// Starts ranks inside a Slurm allocation as job steps: `srun ... command` run on this machine
// (the batch script's node), one step per rank, on the host krugrun's layout gave it.
#pragma once

#include <string>

#include "run/launch/starter.h"

namespace krug::run {

// srun is a local child of krugrun in its own process group, so the supervisor treats it like
// any rank: its stdout/stderr pipes carry the rank's output, its exit status is the rank's
// (srun reports a task killed by signal N as status 128 + N), and SIGTERM to its group makes
// srun cancel the step, which kills the rank's processes on their node. If krugrun dies, srun
// gets SIGTERM (PR_SET_PDEATHSIG) and cancels its step the same way. Not SIGKILL: srun forks
// the watchdog that cancels its step when srun vanishes only after it created the step, and an
// srun SIGKILLed in between left a step without tasks that not even scancel removes (it holds
// its CPUs until the job ends). srun blocks SIGTERM from its start and acts on it once ready.
class SrunStarter : public RankStarter {
 public:
  explicit SrunStarter(std::string job_id) : job_id_(std::move(job_id)) {}
  StartedRank start(const RankLaunch& launch) override;

 private:
  std::string job_id_;
};

}  // namespace krug::run
