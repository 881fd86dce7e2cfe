// Slurm allocations: which hosts and how many ranks per host a job was given, read from the
// environment Slurm sets for a batch script or an salloc shell. Pure functions, unit-tested
// without Slurm.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "run/cli/hosts.h"

namespace krug::run::slurm {

// Expands a Slurm hostlist expression into host names, in order:
//   "node[01-03,07],gpu-a[1-2]x,login" -> node01 node02 node03 node07 gpu-a1x gpu-a2x login
// A range keeps the zero padding of its lower bound ("[08-10]" -> 08 09 10); several bracket
// groups in one name multiply out, the leftmost varying slowest ("r[1-2]n[1-2]" -> r1n1 r1n2
// r2n1 r2n2). Throws krug::Error naming the expression on unbalanced or nested brackets, empty
// names or ranges, reversed ranges and non-numeric bounds.
std::vector<std::string> expand_hostlist(std::string_view expression);

// Expands Slurm's per-node count syntax (SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE):
// "2(x3),1" -> 2 2 2 1. Counts must be positive. Throws krug::Error naming the value.
std::vector<int> expand_counts(std::string_view spec);

// The job's hosts with one slot per task Slurm allocated on each.
struct Allocation {
  std::string job_id;
  std::vector<HostSlots> hosts;
  int total_slots() const;
};

// The allocation krugrun runs in, or nullopt outside Slurm (no SLURM_JOB_ID). Hosts come from
// SLURM_JOB_NODELIST (or SLURM_NODELIST); slots from SLURM_TASKS_PER_NODE, or, when that is
// missing or krugrun itself runs inside a job step (SLURM_STEP_ID set: there that variable
// describes the step, not the job), from SLURM_JOB_CPUS_PER_NODE divided by
// SLURM_CPUS_PER_TASK. Throws krug::Error naming the variable when one is malformed, missing or
// when the lists disagree in length.
std::optional<Allocation> detect_allocation(const std::map<std::string, std::string>& env);

// The number of ranks to start in `allocation`: `requested_np` (-np) when given, else every
// slot. Throws krug::Error when -np is below 1 or exceeds the allocation's slots, saying how to
// fix the request.
int ranks_to_start(const Allocation& allocation, std::optional<int> requested_np);

// The srun command line that starts rank `rank`'s `command` as one job step (named
// krug-rank<rank> in squeue -s) of a single task on `host`:
// each rank is its own step, so it has its own output pipes and exit status. --overlap lets the
// steps share the job's CPUs and memory (without it a step that takes every CPU of a node
// blocks the next one); --export=ALL overrides an inherited SLURM_EXPORT_ENV=NONE so the rank
// gets the environment srun was started with, krugrun's variables included.
std::vector<std::string> srun_argv(const std::string& job_id, int rank, const std::string& host,
                                   const std::vector<std::string>& command);

}  // namespace krug::run::slurm
