// krugrun's reading of a Slurm allocation: hostlist expressions, per-node counts, the
// environment of a batch script, -np against the allocation, and the srun command line.
#include "run/hpc/slurm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "krug/types.h"

namespace krug::run::slurm {
namespace {

using Names = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

// The message of the krug::Error `f` throws; fails the test when it throws nothing.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no krug::Error thrown";
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(SlurmHostlist, PlainNamesAndSingleNumbers) {
  EXPECT_EQ(expand_hostlist("login"), Names{"login"});
  EXPECT_EQ(expand_hostlist("a,b.example.com,c-1"), (Names{"a", "b.example.com", "c-1"}));
  EXPECT_EQ(expand_hostlist("node[7]"), Names{"node7"});
  EXPECT_EQ(expand_hostlist("node[007]"), Names{"node007"});
}

TEST(SlurmHostlist, RangesListsAndSuffixes) {
  EXPECT_EQ(expand_hostlist("node[01-03,07],gpu-a[1-2]x,login"),
            (Names{"node01", "node02", "node03", "node07", "gpu-a1x", "gpu-a2x", "login"}));
  EXPECT_EQ(expand_hostlist("n[3,1,2]"), (Names{"n3", "n1", "n2"}));  // order is kept
  EXPECT_EQ(expand_hostlist("[1-2]"), (Names{"1", "2"}));
}

TEST(SlurmHostlist, PaddingFollowsTheLowerBound) {
  EXPECT_EQ(expand_hostlist("n[8-11]"), (Names{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[08-11]"), (Names{"n08", "n09", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[098-101]"), (Names{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_hostlist("n[0-1,009-010]"), (Names{"n0", "n1", "n009", "n010"}));
}

TEST(SlurmHostlist, SeveralBracketGroupsMultiplyOut) {
  EXPECT_EQ(expand_hostlist("r[1-2]n[01-02]"), (Names{"r1n01", "r1n02", "r2n01", "r2n02"}));
  EXPECT_EQ(expand_hostlist("r[1-2]-n[5,7]-ib,x"),
            (Names{"r1-n5-ib", "r1-n7-ib", "r2-n5-ib", "r2-n7-ib", "x"}));
}

TEST(SlurmHostlist, LargeRangesHaveEveryName) {
  Names names = expand_hostlist("c[0000-1999],d");
  ASSERT_EQ(names.size(), 2001u);
  EXPECT_EQ(names[0], "c0000");
  EXPECT_EQ(names[1234], "c1234");
  EXPECT_EQ(names[1999], "c1999");
  EXPECT_EQ(names[2000], "d");
}

TEST(SlurmHostlist, RejectsMalformedExpressionsNamingThem) {
  for (const char* bad :
       {"", "a,,b", ",a", "a,", "n[", "n[1-2", "n]", "n[1-2]]", "n[[1]]", "n[]", "n[-2]", "n[1-]",
        "n[2-1]", "n[a-b]", "n[1-2-3]", "n[1,,2]", "n[0-99999999999]", "n[1 - 2]"}) {
    std::string what = error_of([&] { expand_hostlist(bad); });
    EXPECT_TRUE(contains(what, "hostlist")) << bad << ": " << what;
    if (*bad) {
      EXPECT_TRUE(contains(what, bad)) << bad << ": " << what;
    }
  }
}

TEST(SlurmCounts, ExpandsRepeats) {
  EXPECT_EQ(expand_counts("2"), std::vector<int>{2});
  EXPECT_EQ(expand_counts("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_counts("4,1(x2),16(x1)"), (std::vector<int>{4, 1, 1, 16}));
  EXPECT_EQ(expand_counts("72(x100)").size(), 100u);
}

TEST(SlurmCounts, RejectsMalformedListsWithTheExpectedForm) {
  for (const char* bad : {"", "0", "2,0", "-1", "x", "2(x0)", "2(3)", "2(x)", "2(x3", "(x3)",
                          "2(x3)4", "2,,1", "2,", "2(x-1)", "99999999999"}) {
    std::string what = error_of([&] { expand_counts(bad); });
    EXPECT_TRUE(contains(what, "N(xM)")) << bad << ": " << what;
  }
}

Env batch_env() {
  return {{"SLURM_JOB_ID", "42"},
          {"SLURM_JOB_NODELIST", "node[01-03]"},
          {"SLURM_NODELIST", "node[01-03]"},
          {"SLURM_TASKS_PER_NODE", "2(x2),1"},
          {"SLURM_JOB_CPUS_PER_NODE", "8(x3)"},
          {"PATH", "/usr/bin"}};
}

TEST(SlurmAllocation, AbsentOutsideSlurm) {
  EXPECT_FALSE(detect_allocation({}).has_value());
  EXPECT_FALSE(detect_allocation({{"SLURM_JOB_NODELIST", "n1"}, {"PATH", "/bin"}}).has_value());
}

TEST(SlurmAllocation, HostsAndTaskSlotsOfABatchScript) {
  auto a = detect_allocation(batch_env());
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->job_id, "42");
  ASSERT_EQ(a->hosts.size(), 3u);
  const char* names[] = {"node01", "node02", "node03"};
  const int slots[] = {2, 2, 1};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a->hosts[i].host, names[i]);
    EXPECT_EQ(a->hosts[i].slots, slots[i]);
  }
  EXPECT_EQ(a->total_slots(), 5);
}

TEST(SlurmAllocation, OlderVariableNames) {
  auto a = detect_allocation(
      {{"SLURM_JOBID", "7"}, {"SLURM_NODELIST", "a,b"}, {"SLURM_TASKS_PER_NODE", "1(x2)"}});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->job_id, "7");
  ASSERT_EQ(a->hosts.size(), 2u);
  EXPECT_EQ(a->hosts[1].host, "b");
  EXPECT_EQ(a->hosts[1].slots, 1);
}

TEST(SlurmAllocation, CpusPerNodeWhenTasksAreUnknown) {
  Env env = batch_env();
  env.erase("SLURM_TASKS_PER_NODE");
  env["SLURM_JOB_CPUS_PER_NODE"] = "8(x2),4";
  env["SLURM_CPUS_PER_TASK"] = "4";
  auto a = detect_allocation(env);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->hosts[0].slots, 2);
  EXPECT_EQ(a->hosts[2].slots, 1);
  env.erase("SLURM_CPUS_PER_TASK");
  EXPECT_EQ(detect_allocation(env)->total_slots(), 20);
}

TEST(SlurmAllocation, InsideAStepTheStepsTaskCountIsIgnored) {
  // srun overwrites SLURM_TASKS_PER_NODE with the step's layout; the job's CPUs remain.
  Env env = batch_env();
  env["SLURM_STEP_ID"] = "0";
  env["SLURM_TASKS_PER_NODE"] = "1";
  env["SLURM_NODELIST"] = "node01";
  env["SLURM_JOB_CPUS_PER_NODE"] = "2(x3)";
  auto a = detect_allocation(env);
  ASSERT_TRUE(a.has_value());
  ASSERT_EQ(a->hosts.size(), 3u);
  EXPECT_EQ(a->total_slots(), 6);
}

TEST(SlurmAllocation, InconsistentOrMissingVariablesAreNamed) {
  Env env = batch_env();
  env["SLURM_TASKS_PER_NODE"] = "2(x2)";
  std::string what = error_of([&] { detect_allocation(env); });
  EXPECT_TRUE(contains(what, "3 node(s)")) << what;
  EXPECT_TRUE(contains(what, "SLURM_TASKS_PER_NODE")) << what;

  env = batch_env();
  env["SLURM_JOB_NODELIST"] = "node[01-03";
  what = error_of([&] { detect_allocation(env); });
  EXPECT_EQ(what.rfind("krugrun: SLURM_JOB_NODELIST: bad Slurm hostlist 'node[01-03'", 0), 0u)
      << what;

  env = batch_env();
  env["SLURM_TASKS_PER_NODE"] = "2(x2),zero";
  EXPECT_TRUE(contains(error_of([&] { detect_allocation(env); }), "SLURM_TASKS_PER_NODE"));

  env = {{"SLURM_JOB_ID", "9"}, {"SLURM_TASKS_PER_NODE", "1"}};
  EXPECT_TRUE(contains(error_of([&] { detect_allocation(env); }), "-H"));

  env = {{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NODELIST", "a"}};
  EXPECT_TRUE(contains(error_of([&] { detect_allocation(env); }), "SLURM_TASKS_PER_NODE"));

  env = {{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NODELIST", "a,a"}, {"SLURM_TASKS_PER_NODE", "1(x2)"}};
  EXPECT_TRUE(contains(error_of([&] { detect_allocation(env); }), "twice"));

  env = {{"SLURM_JOB_ID", "9"},
         {"SLURM_JOB_NODELIST", "a"},
         {"SLURM_JOB_CPUS_PER_NODE", "2"},
         {"SLURM_CPUS_PER_TASK", "4"}};
  EXPECT_TRUE(contains(error_of([&] { detect_allocation(env); }), "SLURM_CPUS_PER_TASK"));
  env["SLURM_CPUS_PER_TASK"] = "0";
  EXPECT_TRUE(contains(error_of([&] { detect_allocation(env); }), "SLURM_CPUS_PER_TASK"));
}

TEST(SlurmRanks, DefaultIsEverySlotAndNpMustFit) {
  Allocation a = *detect_allocation(batch_env());
  EXPECT_EQ(ranks_to_start(a, std::nullopt), 5);
  EXPECT_EQ(ranks_to_start(a, 5), 5);
  EXPECT_EQ(ranks_to_start(a, 1), 1);
  std::string what = error_of([&] { ranks_to_start(a, 6); });
  for (const char* part :
       {"-np 6", "job 42", "5 task slot(s)", "node01:2,node02:2,node03:1", "--ntasks=6"})
    EXPECT_TRUE(contains(what, part)) << part << " not in: " << what;
  EXPECT_THROW(ranks_to_start(a, 0), Error);
  EXPECT_THROW(ranks_to_start(a, -2), Error);
}

TEST(SlurmSrun, OneStepOfOneTaskOnTheRanksHost) {
  Names argv = srun_argv("42", 3, "node02", {"python3", "train.py", "--lr", "0.1"});
  ASSERT_GE(argv.size(), 5u);
  EXPECT_EQ(argv.front(), "srun");
  auto dash = std::find(argv.begin(), argv.end(), "--");
  ASSERT_NE(dash, argv.end());
  Names options(argv.begin() + 1, dash), command(dash + 1, argv.end());
  EXPECT_EQ(command, (Names{"python3", "train.py", "--lr", "0.1"}));
  for (const char* o : {"--jobid=42", "--nodes=1", "--ntasks=1", "--nodelist=node02",
                        "--job-name=krug-rank3", "--overlap", "--export=ALL"})
    EXPECT_NE(std::find(options.begin(), options.end(), o), options.end()) << o;
}

}  // namespace
}  // namespace krug::run::slurm
