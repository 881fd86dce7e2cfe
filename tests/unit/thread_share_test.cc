// krugrun's share of a host's cores per rank when the job leaves OMP_NUM_THREADS unset.
#include "run/launch/thread_share.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace krug::run {
namespace {

TEST(ThreadShare, TheHostsCoresAreSharedEvenlyAmongItsRanks) {
  EXPECT_EQ(omp_threads_per_rank(std::nullopt, "2", 16), 8);
  EXPECT_EQ(omp_threads_per_rank(std::nullopt, "4", 16), 4);
  EXPECT_EQ(omp_threads_per_rank(std::nullopt, "3", 16), 5) << "rounded down: never more threads "
                                                               "than cores";
  EXPECT_EQ(omp_threads_per_rank(std::nullopt, "2", 2), 1);
}

TEST(ThreadShare, EveryRankGetsAThreadWhenRanksOutnumberCores) {
  EXPECT_EQ(omp_threads_per_rank(std::nullopt, "4", 2), 1);
  EXPECT_EQ(omp_threads_per_rank(std::nullopt, "64", 1), 1);
}

TEST(ThreadShare, TheUsersChoiceStands) {
  EXPECT_EQ(omp_threads_per_rank("16", "2", 16), std::nullopt);
  EXPECT_EQ(omp_threads_per_rank("", "2", 16), std::nullopt) << "set, even empty, is a choice";
}

TEST(ThreadShare, ARankAloneOnItsHostKeepsEveryCore) {
  EXPECT_EQ(omp_threads_per_rank(std::nullopt, "1", 16), std::nullopt);
  EXPECT_EQ(omp_threads_per_rank(std::nullopt, std::nullopt, 16), std::nullopt)
      << "no topology: an elastic worker, or not started by krugrun";
  EXPECT_EQ(omp_threads_per_rank(std::nullopt, "two", 16), std::nullopt);
  EXPECT_EQ(omp_threads_per_rank(std::nullopt, "2x", 16), std::nullopt);
}

TEST(ThreadShare, RanksThatShareAHostSpinBriefly) {
  EXPECT_EQ(gomp_spin_count(std::nullopt, std::nullopt, "2"), kSharedHostSpinCount);
  EXPECT_EQ(gomp_spin_count(std::nullopt, std::nullopt, "64"), kSharedHostSpinCount);
  EXPECT_EQ(gomp_spin_count(std::nullopt, std::nullopt, "1"), std::nullopt)
      << "alone on its host: OpenMP's own spin";
  EXPECT_EQ(gomp_spin_count(std::nullopt, std::nullopt, std::nullopt), std::nullopt);
  EXPECT_EQ(gomp_spin_count(std::nullopt, std::nullopt, "2x"), std::nullopt);
}

TEST(ThreadShare, AJobThatChoseHowOpenMpWaitsKeepsIt) {
  EXPECT_EQ(gomp_spin_count("ACTIVE", std::nullopt, "2"), std::nullopt);
  EXPECT_EQ(gomp_spin_count("PASSIVE", std::nullopt, "2"), std::nullopt);
  EXPECT_EQ(gomp_spin_count(std::nullopt, "300000", "2"), std::nullopt);
  EXPECT_EQ(gomp_spin_count(std::nullopt, "", "2"), std::nullopt) << "set, even empty";
}

TEST(ThreadShare, BothEndsThatStartRanksGetOneListOfSettings) {
  using Settings = std::vector<std::pair<std::string, std::string>>;
  std::map<std::string, std::string> job;
  auto chosen = [&](const char* name) {
    auto it = job.find(name);
    return it == job.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  EXPECT_EQ(shared_host_settings(chosen, "2", 16),
            (Settings{{"OMP_NUM_THREADS", "8"}, {"GOMP_SPINCOUNT", kSharedHostSpinCount}}));
  EXPECT_EQ(shared_host_settings(chosen, "1", 16), Settings{}) << "alone on its host";
  job["OMP_NUM_THREADS"] = "4";
  EXPECT_EQ(shared_host_settings(chosen, "2", 16),
            (Settings{{"GOMP_SPINCOUNT", kSharedHostSpinCount}}));
  job["OMP_WAIT_POLICY"] = "PASSIVE";
  EXPECT_EQ(shared_host_settings(chosen, "2", 16), Settings{}) << "the job chose both";
}

TEST(ThreadShare, UsableCoresFollowTheAffinityMask) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(usable_cores(), CPU_COUNT(&all));
  // As under taskset or a Slurm cgroup: one core left, so one thread per rank.
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
  const int restricted = usable_cores();
  ASSERT_EQ(::sched_setaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(restricted, 1);
}

}  // namespace
}  // namespace krug::run
