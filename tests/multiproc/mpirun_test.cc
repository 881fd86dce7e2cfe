// Programs started by a plain `mpirun -np N` (no krugrun): init() takes the ranks from
// MPI_COMM_WORLD, rank 0 serves the rendezvous store, and the data plane defaults to MPI. Also
// the errors of the MPI paths: the MPI data plane without mpirun, `krugrun --mpi` without mpirun.
//
// Built only with the MPI backend. mpirun gets --allow-run-as-root where the tests run as root
// (containers), as krugrun --mpi does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

#include "krugrun_process.h"

namespace {

using namespace std::chrono_literals;
using namespace krug::testing;

constexpr auto kRunTimeout = 120s;

// `mpirun -np N --host localhost:N [-x VAR=value ...] krug_test_worker <scenario>`: --host
// with N slots, so 3 or 4 ranks also start on a 2-core machine.
class MpirunJob : public KrugrunProcess {
 public:
  MpirunJob(int np, const std::string& scenario, const std::vector<std::string>& env = {})
      : KrugrunProcess(KRUG_MPIRUN_PATH, args(np, scenario, env)) {}

 private:
  static std::vector<std::string> args(int np, const std::string& scenario,
                                       const std::vector<std::string>& env) {
    std::vector<std::string> a{"-np", std::to_string(np), "--host",
                               "localhost:" + std::to_string(np)};
    if (::geteuid() == 0) a.push_back("--allow-run-as-root");
    for (const auto& e : env) a.insert(a.end(), {"-x", e});
    a.insert(a.end(), {KRUG_TEST_WORKER_PATH, scenario});
    return a;
  }
};

void expect_passes(int np, const std::string& scenario, const std::string& data_plane,
                   const std::vector<std::string>& env = {}) {
  MpirunJob job(np, scenario, env);
  const int code = job.wait(kRunTimeout);
  ASSERT_NE(code, -1) << "mpirun did not finish\n" << job.output();
  EXPECT_EQ(code, 0) << job.output();
  for (int r = 0; r < np; ++r) {
    const std::string rank = "rank " + std::to_string(r) + ": ";
    EXPECT_TRUE(contains(job.out(), rank + scenario + " OK")) << job.output();
    EXPECT_TRUE(contains(job.out(), rank + "data plane " + data_plane)) << job.output();
  }
}

class PlainMpirun : public ::testing::TestWithParam<int> {};

TEST_P(PlainMpirun, EveryOpAndDtypeOnTheMpiDataPlane) {
  expect_passes(GetParam(), "ops", "mpi");
}
TEST_P(PlainMpirun, TopologyFromMpi) {
  expect_passes(GetParam(), "topology", "mpi");
}
TEST_P(PlainMpirun, InitShutdownInitAgain) {
  expect_passes(GetParam(), "reinit", "mpi");
}
TEST_P(PlainMpirun, GlooDataPlaneWhenAskedFor) {
  expect_passes(GetParam(), "ops", "gloo", {"KRUG_CPU_OPERATIONS=gloo"});
}
TEST_P(PlainMpirun, HorovodNameOfTheKnobWorksToo) {
  expect_passes(GetParam(), "determinism", "gloo", {"HOROVOD_CPU_OPERATIONS=gloo"});
}

INSTANTIATE_TEST_SUITE_P(Np, PlainMpirun, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "np" + std::to_string(info.param);
                         });

TEST(PlainMpirun, ProcessSetsOfEvenAndOddRanks) {
  expect_passes(4, "process_sets", "mpi");
}

// Ranks that krugrun started itself cannot use MPI: a clear error, not a hang.
TEST(MpiDataPlane, WithoutMpirunIsAClearError) {
  KrugrunProcess job(KRUGRUN_PATH,
                     {"-np", "2", "-x", "KRUG_CPU_OPERATIONS=mpi", KRUG_TEST_WORKER_PATH, "ops"});
  const int code = job.wait(kRunTimeout);
  ASSERT_NE(code, -1) << job.output();
  EXPECT_NE(code, 0) << job.output();
  EXPECT_TRUE(contains(job.err(), "this process was not started by mpirun")) << job.output();
  EXPECT_TRUE(contains(job.err(), "krugrun --mpi")) << job.output();
}

TEST(KrugrunMpi, WithoutMpirunOnPathIsAClearError) {
  // The child (krugrun) inherits PATH at fork; restore ours right after.
  const std::string saved = std::getenv("PATH") ? std::getenv("PATH") : "";
  ::setenv("PATH", "/nonexistent-krug-test-dir", 1);
  KrugrunProcess job(KRUGRUN_PATH, {"--mpi", "-np", "2", KRUG_TEST_WORKER_PATH, "ops"});
  ::setenv("PATH", saved.c_str(), 1);
  const int code = job.wait(kRunTimeout);
  EXPECT_EQ(code, 1) << job.output();
  EXPECT_TRUE(contains(job.err(), "mpirun was not found on PATH")) << job.output();
}

TEST(KrugrunMpi, GlooDataPlaneWhenAskedFor) {
  KrugrunProcess job(KRUGRUN_PATH, {"--mpi", "-np", "2", "-x", "KRUG_CPU_OPERATIONS=gloo",
                                    KRUG_TEST_WORKER_PATH, "determinism"});
  ASSERT_EQ(job.wait(kRunTimeout), 0) << job.output();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(job.rank_printed(r, "determinism OK")) << job.output();
    EXPECT_TRUE(job.rank_printed(r, "data plane gloo")) << job.output();
  }
}

TEST(KrugrunMpi, ExitsWithTheRanksStatus) {
  // A usage error of the worker: every rank exits 2 and mpirun passes the status on.
  KrugrunProcess job(KRUGRUN_PATH, {"--mpi", "-np", "2", KRUG_TEST_WORKER_PATH});
  EXPECT_EQ(job.wait(kRunTimeout), 2) << job.output();
  EXPECT_TRUE(contains(job.err(), "[0]<stderr>:usage: krug_test_worker")) << job.output();
  EXPECT_EQ(lines_of(job.err()).back(), "krugrun: mpirun exited with status 2") << job.output();
}

TEST(KrugrunMpi, RanksDieWithAKilledLauncher) {
  const std::string marker = unique_marker();
  KrugrunProcess job(KRUGRUN_PATH, {"--mpi", "-np", "2", "-x", "MARK=" + marker, "sh", "-c",
                                    "echo up; exec sleep 600"});
  // Both ranks printed "up": mpirun has started them and relays their output.
  ASSERT_TRUE(wait_until([&] { return job.rank_printed(0, "up") && job.rank_printed(1, "up"); }))
      << job.output();
  ::kill(job.pid(), SIGKILL);
  EXPECT_EQ(job.wait(kRunTimeout), 128 + SIGKILL);
  // mpirun got SIGTERM from the kernel, once (a second one makes it exit at once, leaving the
  // ranks: 3 of 8 such kills under load before its keeper process), and stopped its ranks.
  EXPECT_TRUE(wait_for_no_process(marker)) << count_processes_with(marker) << " left";
}

}  // namespace
