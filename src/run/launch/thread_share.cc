#include "run/launch/thread_share.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <thread>

namespace krug::run {

namespace {

// The ranks on this rank's host, where krugrun said and there are several.
std::optional<int> ranks_sharing_the_host(const std::optional<std::string>& local_size) {
  if (!local_size) return std::nullopt;
  int ranks = 0;
  const char* end = local_size->data() + local_size->size();
  auto [ptr, ec] = std::from_chars(local_size->data(), end, ranks);
  if (ec != std::errc{} || ptr != end || ranks <= 1) return std::nullopt;
  return ranks;
}

}  // namespace

std::optional<int> omp_threads_per_rank(const std::optional<std::string>& omp_num_threads,
                                        const std::optional<std::string>& local_size,
                                        int usable_cores) {
  if (omp_num_threads) return std::nullopt;
  const std::optional<int> ranks = ranks_sharing_the_host(local_size);
  if (!ranks) return std::nullopt;
  return std::max(1, usable_cores / *ranks);
}

std::optional<std::string> gomp_spin_count(const std::optional<std::string>& omp_wait_policy,
                                           const std::optional<std::string>& gomp_spincount,
                                           const std::optional<std::string>& local_size) {
  if (omp_wait_policy || gomp_spincount || !ranks_sharing_the_host(local_size)) return std::nullopt;
  return kSharedHostSpinCount;
}

std::vector<std::pair<std::string, std::string>> shared_host_settings(
    const ChosenValue& chosen, const std::optional<std::string>& local_size, int usable_cores) {
  std::vector<std::pair<std::string, std::string>> settings;
  if (auto threads = omp_threads_per_rank(chosen("OMP_NUM_THREADS"), local_size, usable_cores))
    settings.emplace_back("OMP_NUM_THREADS", std::to_string(*threads));
  if (auto spins = gomp_spin_count(chosen("OMP_WAIT_POLICY"), chosen("GOMP_SPINCOUNT"), local_size))
    settings.emplace_back("GOMP_SPINCOUNT", *spins);
  return settings;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace krug::run
