// Runs the real krugrun with `sh -c` ranks: environment, output forwarding, failure propagation
// and signal handling. Each krugrun is a child of the test with its output in temp files.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "krugrun_process.h"

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

using namespace krug::testing;

// krugrun with `args`; wait() gives it 60 s by default.
class Krugrun : public KrugrunProcess {
 public:
  explicit Krugrun(const std::vector<std::string>& args, bool stdin_pipe = false)
      : KrugrunProcess(KRUGRUN_PATH, args, stdin_pipe) {}
  int wait(std::chrono::seconds timeout = 60s) { return KrugrunProcess::wait(timeout); }
};

// Each rank prints "KEY=value" lines for every variable the launcher sets.
const char* kPrintEnv =
    "for v in KRUG_RANK KRUG_SIZE KRUG_LOCAL_RANK KRUG_LOCAL_SIZE KRUG_CROSS_RANK KRUG_CROSS_SIZE "
    "KRUG_HOSTNAME KRUG_RENDEZVOUS_ADDR KRUG_RENDEZVOUS_PORT KRUG_SECRET KRUG_JOB_ID "
    "HOROVOD_RANK HOROVOD_SIZE HOROVOD_LOCAL_RANK HOROVOD_LOCAL_SIZE HOROVOD_CROSS_RANK "
    "HOROVOD_CROSS_SIZE HOROVOD_HOSTNAME HOROVOD_GLOO_RENDEZVOUS_ADDR HOROVOD_GLOO_RENDEZVOUS_PORT "
    "HOROVOD_CONTROLLER HOROVOD_CPU_OPERATIONS; do eval \"echo $v=\\$$v\"; done";

// rank -> (variable -> value), from prefixed output lines "[r]<stdout>:K=V".
std::map<int, std::map<std::string, std::string>> env_by_rank(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> env;
  for (const auto& line : lines_of(out)) {
    size_t close = line.find("]<stdout>:");
    if (line.empty() || line[0] != '[' || close == std::string::npos) continue;
    int rank = std::stoi(line.substr(1, close - 1));
    std::string kv = line.substr(close + 10);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[rank][kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

class LauncherEnv : public ::testing::TestWithParam<int> {};

TEST_P(LauncherEnv, EveryRankSeesItsTopology) {
  const int np = GetParam();
  Krugrun run({"-np", std::to_string(np), "sh", "-c", kPrintEnv});
  ASSERT_EQ(run.wait(), 0) << run.err();
  auto env = env_by_rank(run.out());
  ASSERT_EQ(env.size(), static_cast<size_t>(np)) << run.out();
  for (int r = 0; r < np; ++r) {
    auto& e = env[r];
    for (const char* prefix : {"KRUG_", "HOROVOD_"}) {
      std::string p = prefix;
      EXPECT_EQ(e[p + "RANK"], std::to_string(r));
      EXPECT_EQ(e[p + "SIZE"], std::to_string(np));
      EXPECT_EQ(e[p + "LOCAL_RANK"], std::to_string(r));
      EXPECT_EQ(e[p + "LOCAL_SIZE"], std::to_string(np));
      EXPECT_EQ(e[p + "CROSS_RANK"], "0");
      EXPECT_EQ(e[p + "CROSS_SIZE"], "1");
      EXPECT_EQ(e[p + "HOSTNAME"], "localhost");
    }
    EXPECT_EQ(e["KRUG_RENDEZVOUS_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["HOROVOD_GLOO_RENDEZVOUS_ADDR"], "127.0.0.1");
    EXPECT_GT(std::stoi(e["KRUG_RENDEZVOUS_PORT"]), 0);
    EXPECT_EQ(e["HOROVOD_GLOO_RENDEZVOUS_PORT"], e["KRUG_RENDEZVOUS_PORT"]);
    EXPECT_GE(e["KRUG_SECRET"].size(), 32u);
    EXPECT_FALSE(e["KRUG_JOB_ID"].empty());
    EXPECT_EQ(e["HOROVOD_CONTROLLER"], "gloo");
    EXPECT_EQ(e["HOROVOD_CPU_OPERATIONS"], "") << "would force the data plane";
    // One job: every rank shares the rendezvous, the secret and the job id.
    for (const char* k : {"KRUG_RENDEZVOUS_PORT", "KRUG_SECRET", "KRUG_JOB_ID"})
      EXPECT_EQ(e[k], env[0][k]) << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Np, LauncherEnv, ::testing::Values(1, 2, 3, 4));

TEST(Launcher, RanksAreLaidOutHostByHost) {
  Krugrun run({"-np", "3", "-H", "localhost:2,127.0.0.1:2", "sh", "-c", kPrintEnv});
  ASSERT_EQ(run.wait(), 0) << run.err();
  auto env = env_by_rank(run.out());
  ASSERT_EQ(env.size(), 3u);
  EXPECT_EQ(env[1]["KRUG_HOSTNAME"], "localhost");
  EXPECT_EQ(env[1]["KRUG_LOCAL_RANK"], "1");
  EXPECT_EQ(env[1]["KRUG_LOCAL_SIZE"], "2");
  EXPECT_EQ(env[2]["KRUG_HOSTNAME"], "127.0.0.1");
  EXPECT_EQ(env[2]["KRUG_LOCAL_RANK"], "0");
  EXPECT_EQ(env[2]["KRUG_LOCAL_SIZE"], "1");
  EXPECT_EQ(env[2]["HOROVOD_CROSS_RANK"], "1");
  EXPECT_EQ(env[0]["HOROVOD_CROSS_SIZE"], "2");
}

// Ranks that each ran a thread per core would take each other's cores (run/launch/thread_share.h).
TEST(Launcher, RanksShareTheirHostsCoresUnlessTheJobChoseThreads) {
  ::unsetenv("OMP_NUM_THREADS");
  ::unsetenv("OMP_WAIT_POLICY");
  ::unsetenv("GOMP_SPINCOUNT");
  cpu_set_t affinity;
  CPU_ZERO(&affinity);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(affinity), &affinity), 0);
  const std::string share = std::to_string(std::max(1, CPU_COUNT(&affinity) / 2));
  const char* print =
      "echo OMP_NUM_THREADS=${OMP_NUM_THREADS-unset}; echo GOMP_SPINCOUNT=${GOMP_SPINCOUNT-unset}";

  Krugrun shared({"-np", "3", "-H", "localhost:2,127.0.0.1:1", "--verbose", "sh", "-c", print});
  ASSERT_EQ(shared.wait(), 0) << shared.err();
  auto env = env_by_rank(shared.out());
  ASSERT_EQ(env.size(), 3u) << shared.out();
  EXPECT_EQ(env[0]["OMP_NUM_THREADS"], share);
  EXPECT_EQ(env[1]["OMP_NUM_THREADS"], share);
  EXPECT_EQ(env[0]["GOMP_SPINCOUNT"], "1000");
  EXPECT_EQ(env[1]["GOMP_SPINCOUNT"], "1000");
  EXPECT_EQ(env[2]["OMP_NUM_THREADS"], "unset") << "alone on its host: every core";
  EXPECT_EQ(env[2]["GOMP_SPINCOUNT"], "unset") << "alone on its host: OpenMP's own spin";
  EXPECT_TRUE(contains(shared.err(), "host localhost: 2 ranks share")) << shared.err();

  Krugrun chosen(
      {"-np", "2", "-x", "OMP_NUM_THREADS=7", "-x", "OMP_WAIT_POLICY=ACTIVE", "sh", "-c", print});
  ASSERT_EQ(chosen.wait(), 0) << chosen.err();
  env = env_by_rank(chosen.out());
  EXPECT_EQ(env[0]["OMP_NUM_THREADS"], "7");
  EXPECT_EQ(env[1]["OMP_NUM_THREADS"], "7");
  EXPECT_EQ(env[0]["GOMP_SPINCOUNT"], "unset") << "the job chose how OpenMP waits";
  EXPECT_EQ(env[1]["GOMP_SPINCOUNT"], "unset");
}

TEST(Launcher, PrefixesWholeLinesPerStream) {
  Krugrun run({"-np", "2", "sh", "-c",
               "echo out $KRUG_RANK; echo err $KRUG_RANK >&2; printf 'tail %s' $KRUG_RANK"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  for (int r = 0; r < 2; ++r) {
    std::string p = "[" + std::to_string(r) + "]";
    EXPECT_TRUE(contains(run.out(), p + "<stdout>:out " + std::to_string(r) + "\n")) << run.out();
    EXPECT_TRUE(contains(run.out(), p + "<stdout>:tail " + std::to_string(r) + "\n")) << run.out();
    EXPECT_TRUE(contains(run.err(), p + "<stderr>:err " + std::to_string(r) + "\n")) << run.err();
  }
  EXPECT_FALSE(contains(run.out(), "<stderr>"));
}

TEST(Launcher, NoPrefix) {
  Krugrun run({"-np", "2", "--no-prefix", "sh", "-c", "echo hello; echo oops >&2"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  EXPECT_EQ(run.out(), "hello\nhello\n");
  EXPECT_EQ(run.err(), "oops\noops\n");
}

TEST(Launcher, OutputFilenameWritesPerRankFiles) {
  fs::path dir = fs::temp_directory_path() / unique_marker();
  Krugrun real({"-np", "2", "--output-filename", dir.string(), "sh", "-c",
                "echo out $KRUG_RANK; echo err $KRUG_RANK >&2"});
  ASSERT_EQ(real.wait(), 0) << real.err();
  for (int r = 0; r < 2; ++r) {
    fs::path rank_dir = dir / ("rank." + std::to_string(r));
    EXPECT_EQ(read_file(rank_dir / "stdout"), "out " + std::to_string(r) + "\n");
    EXPECT_EQ(read_file(rank_dir / "stderr"), "err " + std::to_string(r) + "\n");
  }
  EXPECT_TRUE(contains(real.out(), "[1]<stdout>:out 1"));  // the terminal still gets it
  fs::remove_all(dir);
}

TEST(Launcher, EnvironmentFlagsReachRanks) {
  ::setenv("KRUG_TEST_FORWARDED", "inherited", 1);
  Krugrun run({"-np", "2", "-x", "KRUG_TEST_SET=hello world", "-x", "KRUG_TEST_FORWARDED",
               "--fusion-threshold-mb", "2", "--cycle-time-ms", "3.5", "--cache-capacity", "7",
               "--no-prefix", "sh", "-c",
               "echo \"$KRUG_TEST_SET|$KRUG_TEST_FORWARDED|$KRUG_FUSION_THRESHOLD|"
               "$KRUG_CYCLE_TIME|$KRUG_CACHE_CAPACITY\""});
  ::unsetenv("KRUG_TEST_FORWARDED");
  ASSERT_EQ(run.wait(), 0) << run.err();
  std::string line = "hello world|inherited|2097152|3.5|7\n";
  EXPECT_EQ(run.out(), line + line);
}

TEST(Launcher, CommandKeepsItsOwnOptions) {
  Krugrun run({"-np", "1", "--no-prefix", "sh", "-c", "echo \"$@\"", "sh", "--lr", "0.1", "-np",
               "5"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  EXPECT_EQ(run.out(), "--lr 0.1 -np 5\n");
}

TEST(Launcher, FailingRankStopsTheJob) {
  std::string marker = unique_marker();
  Krugrun run({"-np", "3", "-x", "MARK=" + marker, "sh", "-c",
               "if [ $KRUG_RANK = 1 ]; then exit 3; fi; sleep 600; echo unreachable"});
  EXPECT_EQ(run.wait(), 3) << run.err();
  EXPECT_LT(run.seconds(), 300.0);  // the others were stopped, not waited for
  auto lines = lines_of(run.err());
  ASSERT_FALSE(lines.empty());
  // The root cause is the last line; the others are mentioned as stopped.
  EXPECT_EQ(lines.back(), "krugrun: rank 1 on host localhost exited with status 3") << run.err();
  EXPECT_TRUE(contains(run.err(), "rank 0 on host localhost also stopped")) << run.err();
  EXPECT_EQ(count_processes_with(marker), 0);
}

TEST(Launcher, RankKilledBySignalIsReported) {
  Krugrun run({"-np", "2", "sh", "-c", "if [ $KRUG_RANK = 0 ]; then kill -9 $$; fi; sleep 600"});
  EXPECT_EQ(run.wait(), 128 + 9) << run.err();
  EXPECT_LT(run.seconds(), 300.0);  // the other rank was stopped, not waited for
  EXPECT_EQ(lines_of(run.err()).back(),
            "krugrun: rank 0 on host localhost was killed by signal 9 (SIGKILL)")
      << run.err();
}

// The kernel closes a killed rank's sockets before the rank can be reaped, so a peer that fails
// because of it can be reaped first; the killed rank is still named as the cause. Here rank 1
// ignores the SIGTERM of the stop and kills itself as soon as rank 0, which failed, is reaped
// (its pid gone): within the second krugrun gives a cause, whatever the machine's load. (A
// fixed 0.1 s after rank 0 was told to fail was too short on a busy machine: rank 1 died first.)
TEST(Launcher, ARankKilledJustAfterAnotherFailsIsTheCause) {
  const std::string flag = "/tmp/krug-test-" + unique_marker();
  Krugrun run({"-np", "2", "-x", "FLAG=" + flag, "sh", "-c",
               "if [ $KRUG_RANK = 1 ]; then trap '' TERM; "
               "while [ ! -s $FLAG.pid ]; do sleep 0.01; done; p=$(cat $FLAG.pid); touch $FLAG; "
               "while kill -0 $p 2>/dev/null; do sleep 0.01; done; kill -9 $$; fi; "
               "echo $$ > $FLAG.tmp && mv $FLAG.tmp $FLAG.pid; "
               "while [ ! -e $FLAG ]; do sleep 0.01; done; exit 1"});
  EXPECT_EQ(run.wait(), 128 + 9) << run.err();
  ::unlink(flag.c_str());
  ::unlink((flag + ".pid").c_str());
  auto lines = lines_of(run.err());
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "krugrun: rank 1 on host localhost was killed by signal 9 (SIGKILL)")
      << run.err();
  EXPECT_TRUE(contains(run.err(), "rank 0 on host localhost also stopped: exited with status 1"))
      << run.err();
}

TEST(Launcher, SigintStopsEveryRank) {
  std::string marker = unique_marker();
  // `sleep; echo` keeps sh alive as the sleep's parent: the whole group must be stopped.
  Krugrun run({"-np", "3", "-x", "MARK=" + marker, "sh", "-c", "sleep 600; echo done"});
  ASSERT_TRUE(wait_for_processes(marker, 6));
  ::kill(run.pid(), SIGINT);
  EXPECT_EQ(run.wait(), 130) << run.err();
  EXPECT_FALSE(contains(run.err(), "still running")) << run.err();  // SIGTERM was enough
  EXPECT_EQ(count_processes_with(marker), 0);
  EXPECT_TRUE(contains(run.err(), "SIGINT")) << run.err();
}

TEST(Launcher, SecondSigintKillsRanksThatIgnoreSigterm) {
  std::string marker = unique_marker();
  Krugrun run(
      {"-np", "2", "-x", "MARK=" + marker, "sh", "-c", "trap '' TERM; sleep 600; echo done"});
  ASSERT_TRUE(wait_for_processes(marker, 4));
  ::kill(run.pid(), SIGINT);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(count_processes_with(marker), 4);  // SIGTERM ignored: still in the grace period
  ::kill(run.pid(), SIGINT);
  EXPECT_EQ(run.wait(), 130) << run.err();
  // Killed by the second SIGINT, not by the grace's end (which says so): no clock involved.
  EXPECT_FALSE(contains(run.err(), "still running")) << run.err();
  EXPECT_EQ(count_processes_with(marker), 0);
}

TEST(Launcher, SigtermExits143) {
  std::string marker = unique_marker();
  Krugrun run({"-np", "2", "-x", "MARK=" + marker, "sh", "-c", "sleep 600; echo done"});
  ASSERT_TRUE(wait_for_processes(marker, 4));
  ::kill(run.pid(), SIGTERM);
  EXPECT_EQ(run.wait(), 143) << run.err();
  EXPECT_EQ(count_processes_with(marker), 0);
}

TEST(Launcher, RanksDieWithAKilledLauncher) {
  std::string marker = unique_marker();
  Krugrun run({"-np", "2", "-x", "MARK=" + marker, "sleep", "600"});
  ASSERT_TRUE(wait_for_processes(marker, 2));
  ::kill(run.pid(), SIGKILL);  // PR_SET_PDEATHSIG takes the direct children with it
  EXPECT_EQ(run.wait(), 128 + 9);
  EXPECT_TRUE(wait_for_no_process(marker)) << count_processes_with(marker) << " left";
}

struct BadArgs {
  std::vector<std::string> args;
  std::string message;
};

TEST(Launcher, UsageErrorsAreExplained) {
  const std::vector<BadArgs> cases = {
      {{"-np", "0", "true"}, "-np must be at least 1"},
      {{"-np", "3", "-H", "localhost:2", "true"}, "provide only 2"},
      {{"-np", "1", "-H", "localhost:two", "true"}, "host:slots"},
      {{"-np", "1", "-H", "localhost:1,,x", "true"}, "empty host entry"},
      {{"-np", "1"}, "no command"},
      {{"-np", "1", "--bogus", "true"}, "unknown option '--bogus'"},
      // Mistakes the option parser itself finds exit 2 too, not with its own codes.
      {{"-np", "abc", "true"}, "Could not convert: --np = abc"},
      {{"-np", "1", "--ssh-port", "0", "true"}, "not in range 1 to 65535"},
  };
  for (const auto& c : cases) {
    Krugrun run(c.args);
    int code = run.wait();
    EXPECT_EQ(code, 2) << c.message << ": " << run.err();
    EXPECT_TRUE(contains(run.err(), c.message)) << run.err();
  }
}

TEST(Launcher, UnreachableHostIsNamedBeforeAnyRankStarts) {
  const std::string marker = unique_marker();
  Krugrun run({"-np", "2", "-H", "localhost:1,gpu-node-7.invalid:1", "--start-timeout", "5", "-x",
               "MARKER=" + marker, "sh", "-c", "echo started-$KRUG_RANK"});
  EXPECT_EQ(run.wait(), 1);
  EXPECT_TRUE(contains(run.err(), "cannot use host gpu-node-7.invalid")) << run.err();
  EXPECT_TRUE(contains(run.err(), "no rank was started")) << run.err();
  EXPECT_FALSE(contains(run.out(), "started-")) << run.out();
}

TEST(Launcher, CheckHostsReportsEveryHost) {
  Krugrun run({"--check-hosts", "-H", "localhost:2,gpu-node-8.invalid", "--start-timeout", "5"});
  EXPECT_EQ(run.wait(), 1);
  EXPECT_TRUE(contains(run.out(), "host localhost: ok (this machine)")) << run.out();
  EXPECT_TRUE(contains(run.err(), "cannot use host gpu-node-8.invalid")) << run.err();
  Krugrun local({"--check-hosts", "-H", "localhost:2,127.0.0.1"});
  EXPECT_EQ(local.wait(), 0) << local.err();
}

// What krugrun writes into a remote wrapper's stdin (src/run/launch/env_block.h): the byte count
// on a line, then NAME=value entries each ended by a NUL. Spelled out here so the test checks
// the format, not the launcher's own encoder.
std::string env_block(const std::vector<std::string>& entries) {
  std::string body;
  for (const auto& e : entries) body += e + '\0';
  return std::to_string(body.size()) + "\n" + body;
}

TEST(Launcher, RemoteExecWrapperRunsInTheDirectoryWithTheEnvironment) {
  auto dir = fs::temp_directory_path() / unique_marker("krug-wrap");
  fs::create_directories(dir);
  // stdin stays open, as ssh keeps it while krugrun lives.
  Krugrun run({"__remote-exec", "--cwd", dir.string(), "--", "sh", "-c",
               "echo \"$GREETING in $(pwd) $EMPTY.\"; exit 3"},
              /*stdin_pipe=*/true);
  run.write_stdin(env_block({"GREETING=hello world", "EMPTY="}));
  EXPECT_EQ(run.wait(), 3);
  EXPECT_TRUE(contains(run.out(), "hello world in " + dir.string() + " .")) << run.out()
                                                                             << run.err();
  Krugrun missing({"__remote-exec", "--cwd", (dir / "gone").string(), "--", "true"}, true);
  missing.write_stdin(env_block({}));
  EXPECT_EQ(missing.wait(), 126);
  EXPECT_TRUE(contains(missing.err(), "cannot enter the working directory")) << missing.err();
  Krugrun nocmd({"__remote-exec", "--", "krug-no-such-command"}, true);
  nocmd.write_stdin(env_block({}));
  EXPECT_EQ(nocmd.wait(), 127);
  EXPECT_TRUE(contains(nocmd.err(), "cannot start 'krug-no-such-command'")) << nocmd.err();
  fs::remove_all(dir);
}

TEST(Launcher, RemoteExecWrapperNeedsItsWholeEnvironment) {
  // The session ends before (or while) the environment arrives: nothing is started.
  Krugrun none({"__remote-exec", "--", "true"});  // stdin is /dev/null
  EXPECT_EQ(none.wait(), 126);
  EXPECT_TRUE(contains(none.err(), "closed the session before sending the environment"))
      << none.err();
  Krugrun cut({"__remote-exec", "--", "true"}, /*stdin_pipe=*/true);
  cut.write_stdin(env_block({"A=1"}).substr(0, 4));
  cut.close_stdin();
  EXPECT_EQ(cut.wait(), 126);
  EXPECT_TRUE(contains(cut.err(), "before sending the environment")) << cut.err();
  Krugrun bad({"__remote-exec", "--", "true"}, /*stdin_pipe=*/true);
  bad.write_stdin("12x\n");
  EXPECT_EQ(bad.wait(), 126);
  EXPECT_TRUE(contains(bad.err(), "bad environment header '12x'")) << bad.err();
}

TEST(Launcher, RemoteExecWrapperStopsTheRankWhenTheSessionEnds) {
  // stdin at end-of-file is what the wrapper sees when krugrun or ssh goes away.
  const std::string marker = unique_marker();
  Krugrun run({"__remote-exec", "--", "sh", "-c", "sleep 600 & echo started; sleep 600"},
              /*stdin_pipe=*/true);
  run.write_stdin(env_block({"MARKER=" + marker}));
  wait_until([&] { return contains(run.out(), "started"); });
  EXPECT_GE(count_processes_with(marker), 2);  // sh and the background sleep at least
  run.close_stdin();
  EXPECT_EQ(run.wait(), 128 + SIGTERM) << run.err();
  EXPECT_LT(run.seconds(), 300.0);  // stopped, not waited for
  // The background sleep went with its group: SIGKILLed as the wrapper returned, it leaves the
  // process table once the kernel has torn it down and init has reaped it, a moment later
  // (60 s only guards against a hang).
  EXPECT_TRUE(wait_for_no_process(marker)) << count_processes_with(marker) << " left";
}

TEST(Launcher, MissingCommandIsNamed) {
  Krugrun run({"-np", "2", "krug-no-such-command"});
  EXPECT_NE(run.wait(), 0);
  EXPECT_TRUE(contains(run.err(), "cannot start rank 0 on host localhost: "
                                  "'krug-no-such-command': No such file or directory"))
      << run.err();
}

}  // namespace

namespace {

TEST(Launcher, JobSpecRunsStepsInOrderAndStopsAtTheFirstFailure) {
  auto dir = fs::temp_directory_path() / unique_marker("krug-spec");
  fs::create_directories(dir);
  const std::string d = dir.string();
  {
    std::ofstream spec(dir / "job.yaml");
    spec << "np: 2\n"
            "env:\n  OUT: " << d << "\n"
            "run:\n"
            // Rank 1 is slow to write: the next step only starts once both ranks finished.
            "  - if [ $KRUG_RANK = 1 ]; then sleep 0.3; fi; echo done > $OUT/step1.$KRUG_RANK\n"
            "  - test -f $OUT/step1.0 && test -f $OUT/step1.1 && echo saw-both > $OUT/step2.$KRUG_RANK\n"
            "  - exit $((KRUG_RANK * 3))\n"
            "  - touch $OUT/step4.$KRUG_RANK\n";
  }
  Krugrun run({"--config", (dir / "job.yaml").string()});
  EXPECT_EQ(run.wait(), 3) << run.err();
  EXPECT_TRUE(fs::exists(dir / "step2.0") && fs::exists(dir / "step2.1")) << run.err();
  EXPECT_FALSE(fs::exists(dir / "step4.0") || fs::exists(dir / "step4.1"));
  EXPECT_TRUE(contains(run.err(), "krugrun: step 3/4: exit $((KRUG_RANK * 3))")) << run.err();
  EXPECT_TRUE(contains(run.err(), "rank 1 on host localhost exited with status 3")) << run.err();
  EXPECT_TRUE(contains(run.err(), "step 3/4 failed (exit code 3)")) << run.err();
  EXPECT_TRUE(contains(run.err(), "the 1 step(s) after it were not run")) << run.err();
  fs::remove_all(dir);
}

// ---- Host names from -H, a hostfile or a job spec reach ssh as one argument after "--" and the
// remote shell not at all: names full of shell syntax run nothing (ssh is FakeSsh, which runs
// the remote command through /bin/sh as sshd would).

class HostileHostNames : public ::testing::TestWithParam<std::string> {
 protected:
  // Each name would create `injected_` if a shell ever parsed it unquoted.
  std::vector<std::string> names() const {
    const std::string touch = "touch${IFS}" + injected_.string();
    return {"a;" + touch, "b$(" + touch + ")", "c`" + touch + "`", "d'&&" + touch + "&&'",
            "-oProxyCommand=" + touch};
  }
  // krugrun's arguments that name the hosts, one slot each, the way GetParam() says.
  std::vector<std::string> host_args() const {
    std::ostringstream list, lines, spec;
    spec << "run: ['echo \"HOST=$KRUG_HOSTNAME\"']\nworkers:\n  hosts:\n";
    for (const auto& h : names()) {
      list << (list.tellp() > 0 ? "," : "") << h << ":1";
      lines << h << " slots=1\n";
      std::string quoted;  // a YAML double-quoted scalar
      for (char c : h)
        quoted += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
      spec << "    - \"" << quoted << ":1\"\n";
    }
    if (GetParam() == "H") return {"-H", list.str()};
    const fs::path file = dir_ / GetParam();
    std::ofstream(file) << (GetParam() == "hostfile" ? lines.str() : spec.str());
    return {GetParam() == "hostfile" ? "--hostfile" : "--config", file.string()};
  }

  fs::path dir_ = fs::temp_directory_path() / unique_marker("hostile");
  fs::path injected_ = dir_ / "injected";
  bool made_ = fs::create_directories(dir_);
};

TEST_P(HostileHostNames, ReachTheRemoteShellOnlyQuoted) {
  FakeSsh ssh;
  std::vector<std::string> args{"--network-interface", "lo", "-np", "5"};
  for (const auto& a : host_args()) args.push_back(a);
  for (const char* a :
       {"sh", "-c", "echo \"HOST=$KRUG_HOSTNAME\"; [ -n \"$KRUG_SECRET\" ] && echo HAS_SECRET"})
    args.push_back(a);
  Krugrun run(args);
  ASSERT_EQ(run.wait(), 0) << run.output();
  EXPECT_FALSE(fs::exists(injected_)) << "a host name ran a command";
  // The rank gets the secret over ssh's stdin; ssh itself never holds it in its environment.
  for (const auto& line : ssh.secrets_in_environment())
    EXPECT_EQ(line, "KRUG_SECRET=(unset)");
  EXPECT_FALSE(ssh.secrets_in_environment().empty());
  const auto calls = ssh.calls();
  const auto hosts = names();
  for (size_t r = 0; r < hosts.size(); ++r) {
    const std::string& host = hosts[r];
    EXPECT_TRUE(run.rank_printed(static_cast<int>(r), "HOST=" + host)) << run.output();
    EXPECT_TRUE(run.rank_printed(static_cast<int>(r), "HAS_SECRET")) << run.output();
    int as_destination = 0;  // the probe and the rank's start
    for (const auto& call : calls) {
      const auto dashes = std::find(call.begin(), call.end(), "--");
      if (dashes != call.end() && dashes + 1 != call.end() && dashes[1] == host) ++as_destination;
      for (auto a = call.begin(); a != dashes && a != call.end(); ++a)
        EXPECT_NE(*a, host) << "a host name before ssh's \"--\" is read as an option";
    }
    EXPECT_EQ(as_destination, 2) << host;
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

INSTANTIATE_TEST_SUITE_P(From, HostileHostNames, ::testing::Values("H", "hostfile", "job_spec"));

}  // namespace
