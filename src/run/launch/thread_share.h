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

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace krug::run {

// OMP_NUM_THREADS for one rank: `usable_cores / local_size`, at least 1. nullopt when the user
// already chose (`omp_num_threads` present, whatever its value) or the rank is alone on its host
// (`local_size` absent, unparsable or 1: it may use every core).
std::optional<int> omp_threads_per_rank(const std::optional<std::string>& omp_num_threads,
                                        const std::optional<std::string>& local_size,
                                        int usable_cores);

// GOMP_SPINCOUNT for one rank: kSharedHostSpinCount where it shares its host with other ranks
// (`local_size` above 1) and the job chose neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY; else
// nullopt. GNU OpenMP (torch's) spins 300,000 times at each wait, and cuts that to 100 only
// where its own threads outnumber the cores, which it cannot see across processes. A script
// that runs more threads than its share (torch.set_num_threads) then had its ranks' threads
// spin on the cores the ones they waited for needed: ResNet-18 at 2 ranks x 2 threads on 2
// cores trained at 32-67 images/s, and at 173-200 with 1000 spins, near 2 ranks x 1 thread
// (docs/benchmarks.md). One process with its cores to itself trained as fast with either.
inline constexpr const char* kSharedHostSpinCount = "1000";
std::optional<std::string> gomp_spin_count(const std::optional<std::string>& omp_wait_policy,
                                           const std::optional<std::string>& gomp_spincount,
                                           const std::optional<std::string>& local_size);

// What krugrun sets for one rank, in the order to set them: OMP_NUM_THREADS
// (omp_threads_per_rank) and GOMP_SPINCOUNT (gomp_spin_count), each where the job left it to
// krugrun. `chosen(name)` is the job's value of `name`, if it set one. Both ends that start
// ranks (krugrun for its local ranks, its ssh wrapper for remote ones) apply this one answer.
using ChosenValue = std::function<std::optional<std::string>(const char* name)>;
std::vector<std::pair<std::string, std::string>> shared_host_settings(
    const ChosenValue& chosen, const std::optional<std::string>& local_size, int usable_cores);

// The cores this process may run on (its affinity mask; a Slurm or container limit shows there),
// at least 1.
int usable_cores();

}  // namespace krug::run
