// Real ranks through the real launcher: `krugrun -np N krug_test_worker <scenario>`.
//
// The worker (krug_test_worker.cc) checks every value itself and prints "rank R: <scenario> OK"
// as its last line; these tests assert krugrun's exit code, those lines, the error messages the
// failure scenarios must produce, and that no rank outlives its job.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "krugrun_process.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// Every run gets this long before it is killed and failed.
constexpr auto kRunTimeout = 120s;

using namespace krug::testing;

// --launch=mpi on the command line (the ctest entries named mpi.*) runs every job as
// `krugrun --mpi`: mpirun starts the ranks and the data plane is MPI. Same scenarios, same
// expectations, except where noted (mpirun, not krugrun, supervises the ranks). Set once, in
// main(), before any test runs.
bool g_mpi_launch = false;
// --data-plane=tcp (the ctest entries named tcp.*) or =gloo: every job runs with that
// KRUG_CPU_OPERATIONS, so the TCP data plane stays covered now that one-host jobs default to
// shared memory.
std::string g_forced_plane;

bool mpi_launch() { return g_mpi_launch; }

// Jobs with -H spread the ranks over (simulated) hosts: the global set is on TCP there.
std::string expected_data_plane(const std::vector<std::string>& launcher_flags) {
  if (mpi_launch()) return "mpi";
  if (!g_forced_plane.empty()) return g_forced_plane;
  const bool several_hosts =
      std::find(launcher_flags.begin(), launcher_flags.end(), "-H") != launcher_flags.end();
  return several_hosts ? "tcp" : "shm";
}

std::vector<std::string> job_args(const std::string& marker, int np, const std::string& scenario,
                                  const std::vector<std::string>& env,
                                  const std::vector<std::string>& launcher_flags) {
  std::vector<std::string> args{"-np", std::to_string(np), "-x", "KRUG_TEST_MARK=" + marker};
  if (mpi_launch()) args.insert(args.begin(), "--mpi");
  if (!g_forced_plane.empty())
    args.insert(args.end(), {"-x", "KRUG_CPU_OPERATIONS=" + g_forced_plane});
  args.insert(args.end(), launcher_flags.begin(), launcher_flags.end());
  for (const auto& e : env) {
    args.push_back("-x");
    args.push_back(e);
  }
  args.push_back(KRUG_TEST_WORKER_PATH);
  args.push_back(scenario);
  return args;
}

// One krugrun job running krug_test_worker <scenario>, its ranks marked for the /proc scan.
class Job : public KrugrunProcess {
 public:
  // `launcher_flags` go to krugrun itself (-H ..., --hierarchical-allreduce).
  Job(int np, const std::string& scenario, const std::vector<std::string>& env = {},
      const std::vector<std::string>& launcher_flags = {})
      : Job(unique_marker("krugmp"), np, scenario, env, launcher_flags) {}
  int wait() { return KrugrunProcess::wait(kRunTimeout); }
  const std::string& marker() const { return marker_; }

 private:
  Job(std::string marker, int np, const std::string& scenario, const std::vector<std::string>& env,
      const std::vector<std::string>& launcher_flags)
      : KrugrunProcess(KRUGRUN_PATH, job_args(marker, np, scenario, env, launcher_flags)),
        marker_(std::move(marker)) {}
  std::string marker_;
};

// Runs a scenario that must pass on every rank; `err`, if given, receives krugrun's stderr.
void expect_passes(int np, const std::string& scenario, const std::vector<std::string>& env = {},
                   const std::vector<std::string>& launcher_flags = {},
                   std::string* err = nullptr) {
  Job job(np, scenario, env, launcher_flags);
  const int code = job.wait();
  if (err) *err = job.err();
  ASSERT_NE(code, -1) << scenario << " -np " << np << " did not finish in "
                      << kRunTimeout.count() << " s\n" << job.output();
  EXPECT_EQ(code, 0) << scenario << " -np " << np << "\n" << job.output();
  for (int r = 0; r < np; ++r) {
    EXPECT_TRUE(job.rank_printed(r, "rank " + std::to_string(r) + ": " + scenario + " OK"))
        << "rank " << r << " did not report success\n" << job.output();
    EXPECT_TRUE(job.rank_printed(r, "data plane " + expected_data_plane(launcher_flags)))
        << job.output();
  }
  EXPECT_EQ(count_processes_with(job.marker()), 0) << "ranks outlived krugrun";
}

std::string np_name(const ::testing::TestParamInfo<int>& info) {
  return "np" + std::to_string(info.param);
}

// ---- Scenarios that pass for every rank count.

class AllSizes : public ::testing::TestWithParam<int> {};

TEST_P(AllSizes, EveryOpAndDtype) { expect_passes(GetParam(), "ops"); }
TEST_P(AllSizes, ThousandAllreducesInFlight) { expect_passes(GetParam(), "inflight"); }
TEST_P(AllSizes, JoinWithUnevenBatches) { expect_passes(GetParam(), "join"); }
TEST_P(AllSizes, InitShutdownInitAgain) { expect_passes(GetParam(), "reinit"); }
TEST_P(AllSizes, TopologyOfOneHost) { expect_passes(GetParam(), "topology"); }
TEST_P(AllSizes, SumsAreBitwiseRankOrderedWhateverTheFusion) {
  expect_passes(GetParam(), "determinism");
}

INSTANTIATE_TEST_SUITE_P(Np, AllSizes, ::testing::Values(1, 2, 3, 4), np_name);

// ---- Scenarios that need at least two ranks.

class MultiRank : public ::testing::TestWithParam<int> {};

TEST_P(MultiRank, ProcessSetsOfEvenAndOddRanks) { expect_passes(GetParam(), "process_sets"); }
TEST_P(MultiRank, DuplicateNameInFlightFails) { expect_passes(GetParam(), "duplicate_name"); }

INSTANTIATE_TEST_SUITE_P(Np, MultiRank, ::testing::Values(2, 3, 4), np_name);

// Every rank gets the mismatch error (the worker checks it names the tensor and the odd rank)
// and the job goes on.
struct MismatchCase {
  std::string scenario;
  int np;
};

class Mismatch : public ::testing::TestWithParam<MismatchCase> {};

TEST_P(Mismatch, EveryRankGetsTheErrorAndTheJobGoesOn) {
  const auto& c = GetParam();
  Job job(c.np, c.scenario);
  const int code = job.wait();
  ASSERT_NE(code, -1) << job.output();
  EXPECT_EQ(code, 0) << job.output();
  for (int r = 0; r < c.np; ++r) {
    EXPECT_TRUE(job.rank_printed(r, "rank " + std::to_string(r) + ": " + c.scenario + " OK"))
        << job.output();
    // The worker prints each error it got; the odd rank is named in every one of them.
    EXPECT_TRUE(job.rank_printed(r, "rank " + std::to_string(c.np - 1) + ":")) << job.output();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, Mismatch,
    ::testing::Values(MismatchCase{"mismatch_dtype", 2}, MismatchCase{"mismatch_dtype", 3},
                      MismatchCase{"mismatch_shape", 2}, MismatchCase{"mismatch_shape", 4},
                      MismatchCase{"mismatch_op", 2}, MismatchCase{"mismatch_op", 3},
                      MismatchCase{"mismatch_root", 2}, MismatchCase{"mismatch_root", 3}),
    [](const ::testing::TestParamInfo<MismatchCase>& info) {
      return info.param.scenario + "_np" + std::to_string(info.param.np);
    });

// ---- Failures: a killed rank and a stall.

class Failures : public ::testing::TestWithParam<int> {};

// Under `krugrun --mpi`, mpirun supervises the ranks: when one is killed it aborts the job
// (the MPI model), so the survivors may be stopped before they report; krugrun passes on
// mpirun's status and mpirun names the rank.
void expect_killed_rank_reported_by_mpirun(Job& job, int victim) {
  EXPECT_EQ(job.wait(), 128 + 9) << job.output();
  const auto err_lines = lines_of(job.err());
  ASSERT_FALSE(err_lines.empty()) << job.output();
  EXPECT_EQ(err_lines.back(), "krugrun: mpirun exited with status 137") << job.output();
  EXPECT_TRUE(contains(job.err(), "process rank " + std::to_string(victim))) << job.output();
  EXPECT_EQ(count_processes_with(job.marker()), 0) << "ranks outlived krugrun";
}

// `victim` SIGKILLs itself after a first allreduce while the others wait on a second one.
void expect_killed_rank_reported(int np, const std::string& scenario, int victim) {
  Job job(np, scenario);
  if (mpi_launch()) return expect_killed_rank_reported_by_mpirun(job, victim);
  const int code = job.wait();
  ASSERT_NE(code, -1) << job.output();
  EXPECT_EQ(code, 128 + 9) << job.output();
  const auto err_lines = lines_of(job.err());
  ASSERT_FALSE(err_lines.empty()) << job.output();
  EXPECT_EQ(err_lines.back(), "krugrun: rank " + std::to_string(victim) +
                                  " on host localhost was killed by signal 9 (SIGKILL)")
      << job.output();
  for (int r = 0; r < np; ++r) {
    if (r == victim) continue;
    // "rank R: error after S s: <message>", then "rank R: <scenario> OK".
    EXPECT_TRUE(job.rank_printed(r, "rank " + std::to_string(r) + ": " + scenario + " OK"))
        << job.output();
    int reports = 0;
    for (const auto& line : job.rank_lines(r)) {
      const std::string tag = "error after ";
      auto at = line.find(tag);
      if (at == std::string::npos) continue;
      ++reports;
      const double seconds = std::stod(line.substr(at + tag.size()));
      EXPECT_LT(seconds, 30.0) << line;
      EXPECT_TRUE(contains(line, "rank " + std::to_string(victim))) << line;
      std::cout << "[rank " << r << " of " << np << "] " << line << std::endl;
    }
    EXPECT_EQ(reports, 1) << "rank " << r << " did not report its error\n" << job.output();
  }
  EXPECT_EQ(count_processes_with(job.marker()), 0) << "ranks outlived krugrun";
}

TEST_P(Failures, KilledRankFailsTheOthersInBoundedTime) {
  expect_killed_rank_reported(GetParam(), "killed_rank", GetParam() - 1);
}

TEST_P(Failures, KilledCoordinatorFailsTheOthersInBoundedTime) {
  expect_killed_rank_reported(GetParam(), "killed_coordinator", 0);
}

TEST_P(Failures, StalledOperationFailsOnEveryRank) {
  const int np = GetParam();
  Job job(np, "stall",
          {"KRUG_STALL_CHECK_TIME_SECONDS=1", "KRUG_STALL_SHUTDOWN_TIME_SECONDS=3"});
  const int code = job.wait();
  ASSERT_NE(code, -1) << job.output();
  EXPECT_EQ(code, 0) << job.output();
  for (int r = 0; r < np; ++r) {
    EXPECT_TRUE(job.rank_printed(r, "rank " + std::to_string(r) + ": stall OK")) << job.output();
    EXPECT_TRUE(job.rank_printed(r, "stall.only_rank0")) << job.output();
  }
  // The stall inspector warned before it gave up.
  EXPECT_TRUE(contains(job.err(), "stall")) << job.output();
  EXPECT_EQ(count_processes_with(job.marker()), 0);
}

INSTANTIATE_TEST_SUITE_P(Np, Failures, ::testing::Values(2, 3), np_name);

// ---- The job secret stays out of every command line (checked by the ranks while the job
// runs), krugrun's and the ranks' output at the most verbose log level, and the timeline.

void expect_secret_hidden(const std::vector<std::string>& launcher_flags) {
  const fs::path dir = fs::temp_directory_path() / unique_marker("krugsecret");
  fs::create_directories(dir);
  const fs::path timeline = dir / "timeline.json";
  Job job(2, "secret",
          {"KRUG_LOG_LEVEL=trace", "KRUG_TIMELINE=" + timeline.string(),
           "KRUG_TEST_SECRET_FILE=" + (dir / "secret").string()},
          launcher_flags);
  ASSERT_EQ(job.wait(), 0) << job.output();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(job.rank_printed(r, "secret OK")) << job.output();
  const std::string secret = read_file(dir / "secret.0");
  ASSERT_GE(secret.size(), 16u);
  EXPECT_EQ(read_file(dir / "secret.1"), secret) << "the ranks were given different secrets";
  EXPECT_FALSE(contains(job.out() + job.err(), secret)) << "the secret is in the job's output";
  const std::string trace = read_file(timeline);
  EXPECT_TRUE(contains(trace, "timeline.t0")) << "no timeline written\n" << job.output();
  EXPECT_FALSE(contains(trace, secret)) << "the secret is in the timeline";
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(Secret, StaysOutOfCommandLinesOutputAndTimeline) {
  expect_secret_hidden({});
}

TEST(Secret, StaysOutOfCommandLinesOutputAndTimelineOverSsh) {
  if (mpi_launch()) GTEST_SKIP() << "mpirun starts its own daemons on other hosts";
  FakeSsh ssh;
  expect_secret_hidden({"--network-interface", "lo", "-H", "hostA:1,hostB:1"});
  const auto calls = ssh.calls();
  EXPECT_EQ(calls.size(), 4u) << "a probe and a rank per host went through ssh";
}

// ---- Timeline: rank 0 writes a Chrome trace with negotiation and execution phases.

TEST(Timeline, HasNegotiateAndAllreducePhasesPerTensor) {
  const fs::path path = fs::temp_directory_path() / (unique_marker() + "-timeline.json");
  expect_passes(2, "timeline", {"KRUG_TIMELINE=" + path.string()});
  ASSERT_TRUE(fs::exists(path));
  const std::string text = read_file(path);
  nlohmann::json trace;
  ASSERT_NO_THROW(trace = nlohmann::json::parse(text)) << text.substr(0, 2000);
  // Either a bare array of events or {"traceEvents": [...]}.
  const nlohmann::json& events = trace.is_array() ? trace : trace.at("traceEvents");
  std::map<int64_t, std::string> row_name;           // pid -> tensor
  std::map<std::string, std::set<std::string>> phases;  // tensor -> phases begun
  for (const auto& e : events)
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name")
      row_name[e.at("pid").get<int64_t>()] = e.at("args").at("name").get<std::string>();
  for (const auto& e : events)
    if (e.value("ph", "") == "B" && e.contains("pid"))
      phases[row_name[e.at("pid").get<int64_t>()]].insert(e.at("name").get<std::string>());
  for (int k = 0; k < 3; ++k) {
    const std::string tensor = "timeline.t" + std::to_string(k);
    ASSERT_TRUE(phases.count(tensor)) << "no row for " << tensor << " in\n" << text.substr(0, 4000);
    EXPECT_TRUE(phases[tensor].count("NEGOTIATE_ALLREDUCE")) << tensor;
    EXPECT_TRUE(phases[tensor].count("ALLREDUCE")) << tensor;
  }
  fs::remove(path);
}

// ---- Hierarchical allreduce across two host names that both mean this machine: krugrun
// starts every rank here, and the engine groups them by the host krugrun gave each.

struct HierarchicalCase {
  std::string scenario;
  std::string hosts;  // -H
  int np;
  std::string layout;  // members by host, as the engine logs it
};

void PrintTo(const HierarchicalCase& c, std::ostream* os) {
  *os << c.scenario << " -H " << c.hosts << " -np " << c.np;
}

class Hierarchical : public ::testing::TestWithParam<HierarchicalCase> {};

TEST_P(Hierarchical, ScenarioPassesWithKnobOn) {
  if (mpi_launch())
    GTEST_SKIP() << "the hierarchical allreduce is built from Gloo groups; on the MPI data plane "
                    "allreduce stays flat (docs/architecture.md)";
  const auto& c = GetParam();
  std::string err;
  expect_passes(c.np, c.scenario, {"KRUG_HIERARCHICAL_ALLREDUCE=1", "KRUG_LOG_LEVEL=info"},
                {"-H", c.hosts}, &err);
  EXPECT_TRUE(contains(err, "process set 0: hierarchical allreduce (KRUG_HIERARCHICAL_ALLREDUCE=1"
                            "), members by host: " + c.layout))
      << err;
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, Hierarchical,
    ::testing::Values(HierarchicalCase{"ops", "localhost:2,127.0.0.1:2", 4, "[0 1] [2 3]"},
                      HierarchicalCase{"ops", "localhost:1,127.0.0.1:2", 3, "[0] [1 2]"},
                      HierarchicalCase{"inflight", "localhost:2,127.0.0.1:2", 4, "[0 1] [2 3]"},
                      HierarchicalCase{"join", "localhost:2,127.0.0.1:2", 4, "[0 1] [2 3]"},
                      HierarchicalCase{"process_sets", "localhost:2,127.0.0.1:2", 4,
                                       "[0 1] [2 3]"}),
    [](const ::testing::TestParamInfo<HierarchicalCase>& info) {
      return info.param.scenario + "_np" + std::to_string(info.param.np);
    });

// Default (auto): hierarchical as soon as ranks sit on several hosts with two on one;
// krugrun's --no-hierarchical-allreduce turns it off.
TEST(HierarchicalChoice, AutoUsesItAndTheLauncherFlagTurnsItOff) {
  if (mpi_launch())
    GTEST_SKIP() << "the hierarchical allreduce is built from Gloo groups; on the MPI data plane "
                    "allreduce stays flat (docs/architecture.md)";
  const std::vector<std::string> env{"KRUG_LOG_LEVEL=info"};
  std::string err;
  expect_passes(4, "ops", env, {"-H", "localhost:2,127.0.0.1:2"}, &err);
  EXPECT_TRUE(contains(err, "process set 0: hierarchical allreduce (auto)")) << err;
  expect_passes(4, "ops", env, {"-H", "localhost:2,127.0.0.1:2", "--no-hierarchical-allreduce"},
                &err);
  EXPECT_FALSE(contains(err, "hierarchical allreduce")) << err;
  // One host: nothing to gain, flat even when asked for.
  expect_passes(4, "ops", env, {"--hierarchical-allreduce"}, &err);
  EXPECT_FALSE(contains(err, "process set 0: hierarchical allreduce")) << err;
}

// krugrun --encrypt: the rendezvous store, the control plane and the TCP plane between the two
// "hosts" all encrypted, and every collective still exact.
TEST(Encryption, KrugrunEncryptRunsEveryCollectiveAcrossHosts) {
  if (mpi_launch()) GTEST_SKIP() << "MPI's transport does not encrypt: KRUG_ENCRYPT refuses it";
  const std::vector<std::string> env{"KRUG_LOG_LEVEL=info"};
  std::string err;
  expect_passes(4, "ops", env, {"-H", "localhost:2,127.0.0.1:2", "--encrypt"}, &err);
  EXPECT_TRUE(contains(err, "connections are encrypted")) << err;
  expect_passes(2, "ops", env, {"-H", "localhost:1,127.0.0.1:1"}, &err);
  EXPECT_FALSE(contains(err, "connections are encrypted")) << err;
}

// ---- Autotune through the launcher: krugrun --autotune and its flags reach the engine, and
// rank 0 writes every sample and the settled choice.

TEST(Autotune, KrugrunFlagsTuneAndLogEverySample) {
  const fs::path log = fs::temp_directory_path() / (unique_marker() + "-autotune.csv");
  expect_passes(3, "ops", {},
                {"--autotune", "--autotune-log-file", log.string(), "--autotune-warmup-samples",
                 "1", "--autotune-steps-per-sample", "2", "--autotune-bayes-opt-max-samples",
                 "4"});
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  fs::remove(log);
  ASSERT_GE(lines.size(), 7u) << "header, 1 warmup, 4 samples, settled";
  EXPECT_EQ(lines[0], "sample,fusion_threshold_bytes,cycle_time_ms,hierarchical,bytes_per_second,best_so_far");
  EXPECT_EQ(lines[1].rfind("warmup,", 0), 0u) << lines[1];
  for (int i = 2; i < 6; ++i) EXPECT_EQ(lines[i].rfind(std::to_string(i - 1) + ",", 0), 0u) << lines[i];
  EXPECT_EQ(lines[6].rfind("settled,", 0), 0u) << lines[6];
}

// ---- Shared memory (one host): nothing is left in /dev/shm however the job ends.

bool shm_under_test() {
  return !mpi_launch() && g_forced_plane.empty();
}

// /dev/shm entries of the job whose ranks printed "job id" (krugrun names every segment of a
// job "krug-<job id>-...").
std::vector<std::string> job_segments(const std::string& job_id) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("krug-" + job_id + "-", 0) == 0) found.push_back(name);
  }
  return found;
}

// Waits (bounded) until every rank printed "leftover ready"; returns each rank's pid.
std::vector<pid_t> wait_until_ready(Job& job, int np) {
  std::vector<pid_t> pids(np, -1);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    int ready = 0;
    for (int r = 0; r < np; ++r)
      for (const auto& line : job.rank_lines(r))
        if (auto at = line.find(": pid "); at != std::string::npos && contains(line, "leftover")) {
          pids[r] = std::stoi(line.substr(at + 6));
          ++ready;
          break;
        }
    if (ready == np) return pids;
    std::this_thread::sleep_for(20ms);
  }
  ADD_FAILURE() << "ranks did not get ready\n" << job.output();
  return pids;
}

// The job id krugrun gave the ranks (--verbose prints "krugrun: job <id>: ...").
std::string job_id_of(const Job& job) {
  const std::string err = job.err(), tag = "krugrun: job ";
  const auto at = err.find(tag);
  if (at == std::string::npos) return "";
  return err.substr(at + tag.size(), err.find(':', at + tag.size()) - at - tag.size());
}

TEST(SharedMemory, NothingLeftAfterANormalExit) {
  if (!shm_under_test()) GTEST_SKIP() << "jobs of this run use another data plane";
  std::string err;
  expect_passes(3, "shm_leftover_finish", {}, {"--verbose"}, &err);
  const auto at = err.find("krugrun: job ");
  ASSERT_NE(at, std::string::npos) << err;
  const std::string id = err.substr(at + 13, err.find(':', at + 13) - at - 13);
  EXPECT_EQ(job_segments(id), std::vector<std::string>{}) << "job " << id;
  EXPECT_TRUE(contains(err, "removed 1 shared-memory segment")) << err;
}

TEST(SharedMemory, NothingLeftAfterASigkilledRank) {
  if (!shm_under_test()) GTEST_SKIP() << "jobs of this run use another data plane";
  Job job(3, "shm_leftover_loop", {}, {"--verbose"});
  const auto pids = wait_until_ready(job, 3);
  const std::string id = job_id_of(job);
  ASSERT_FALSE(id.empty()) << job.output();
  EXPECT_EQ(job_segments(id).size(), 1u) << "the test's own leftover should be there";
  ASSERT_GT(pids[1], 0);
  ::kill(pids[1], SIGKILL);
  EXPECT_EQ(job.wait(), 128 + 9) << job.output();
  EXPECT_EQ(job_segments(id), std::vector<std::string>{}) << job.output();
  EXPECT_EQ(count_processes_with(job.marker()), 0) << "ranks outlived krugrun";
}

TEST(SharedMemory, NothingLeftAfterCtrlCToKrugrun) {
  if (!shm_under_test()) GTEST_SKIP() << "jobs of this run use another data plane";
  Job job(2, "shm_leftover_loop", {}, {"--verbose"});
  wait_until_ready(job, 2);
  const std::string id = job_id_of(job);
  ASSERT_FALSE(id.empty()) << job.output();
  ::kill(job.pid(), SIGINT);
  const int code = job.wait();
  EXPECT_NE(code, 0) << job.output();
  EXPECT_NE(code, -1) << job.output();
  EXPECT_EQ(job_segments(id), std::vector<std::string>{}) << job.output();
  EXPECT_EQ(count_processes_with(job.marker()), 0) << "ranks outlived krugrun";
}

TEST(SharedMemory, AskedForAcrossHostsFailsNamingTheHosts) {
  if (!shm_under_test()) GTEST_SKIP() << "jobs of this run use another data plane";
  Job job(2, "ops", {"KRUG_CPU_OPERATIONS=shm"}, {"-H", "localhost:1,127.0.0.1:1"});
  const int code = job.wait();
  EXPECT_NE(code, 0) << job.output();
  EXPECT_NE(code, -1) << job.output();
  EXPECT_TRUE(contains(job.output(), "KRUG_CPU_OPERATIONS=shm: process set 0 has ranks on several "
                                     "hosts (localhost: [0], 127.0.0.1: [1])"))
      << job.output();
  EXPECT_EQ(count_processes_with(job.marker()), 0) << "ranks outlived krugrun";
}

// A worker without krugrun is a job of one (no rendezvous needed).
TEST(Worker, RunsWithoutKrugrunAsAJobOfOne) {
  const std::string cmd = "timeout 120 " + std::string(KRUG_TEST_WORKER_PATH) + " ops > /dev/null 2>&1";
  pid_t pid = ::fork();
  if (pid == 0) {
    // The test's environment may carry KRUG_* variables of an enclosing job; drop them.
    for (const char* v : {"KRUG_RANK", "KRUG_SIZE", "KRUG_RENDEZVOUS_ADDR", "KRUG_RENDEZVOUS_PORT",
                          "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                          "HOROVOD_GLOO_RENDEZVOUS_PORT"})
      ::unsetenv(v);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(126);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // takes out gtest's own flags
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--launch=mpi") {
      g_mpi_launch = true;
    } else if (arg == "--data-plane=tcp" || arg == "--data-plane=gloo") {
      g_forced_plane = arg.substr(arg.find('=') + 1);
    } else {
      std::fprintf(stderr,
                   "krug_multiproc_tests: unknown argument '%s' (--launch=mpi, "
                   "--data-plane=tcp or --data-plane=gloo)\n",
                   argv[i]);
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}
