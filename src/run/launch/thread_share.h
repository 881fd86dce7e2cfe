// How many OpenMP threads each rank of a host gets when the job does not say.
//
// torch (and any OpenMP runtime) gives every process one thread per core, and its threads spin
// while they wait for each other. Several ranks on one host then run ranks x cores threads and
// take each other's cores: ResNet-18 with 2 ranks x 2 threads on 2 cores trained 4x slower than
// with 1 thread each (docs/benchmarks.md). So krugrun shares a host's cores among its ranks, as
// torchrun does, unless the user set OMP_NUM_THREADS (in the environment, -x or the job spec).
// It decides on the rank's own host (krugrun for its local ranks, `krugrun __remote-exec` for
// ssh-started ones), where the cores it may use are known.
#pragma once

#include <optional>
#include <string>

namespace krug::run {

// OMP_NUM_THREADS for one rank: `usable_cores / local_size`, at least 1. nullopt when the user
// already chose (`omp_num_threads` present, whatever its value) or the rank is alone on its host
// (`local_size` absent, unparsable or 1: it may use every core).
std::optional<int> omp_threads_per_rank(const std::optional<std::string>& omp_num_threads,
                                        const std::optional<std::string>& local_size,
                                        int usable_cores);

// The cores this process may run on (its affinity mask; a Slurm or container limit shows there),
// at least 1.
int usable_cores();

}  // namespace krug::run
