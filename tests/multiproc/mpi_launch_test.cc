// Unit tests of `krugrun --mpi`'s pure parts: the mpirun command line and environment, the
// rewriting of mpirun's output tags, and where the rendezvous server listens. No processes.
#include "run/hpc/mpi_launch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "run/cli/options.h"
#include "run/launch/output.h"
#include "run/launch/rank_env.h"

namespace krug::run {
namespace {

LaunchOptions parse(std::vector<const char*> args) {
  args.insert(args.begin(), "krugrun");
  auto parsed = parse_command_line(static_cast<int>(args.size()), args.data());
  EXPECT_TRUE(std::holds_alternative<LaunchOptions>(parsed));
  return std::get<LaunchOptions>(parsed);
}

const JobInfo kJob{"127.0.0.1", 4321, "s3cret", "abcd1234", ""};

// The value after `flag` in argv ("" when absent).
std::string after(const std::vector<std::string>& argv, const std::string& flag) {
  auto it = std::find(argv.begin(), argv.end(), flag);
  return it == argv.end() || it + 1 == argv.end() ? "" : *(it + 1);
}

// Names passed with -x.
std::vector<std::string> forwarded(const std::vector<std::string>& argv) {
  std::vector<std::string> names;
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "-x") names.push_back(argv[i + 1]);
  return names;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(MpirunCommand, MapsKrugrunFlagsToMpirunAndEndsWithTheCommand) {
  LaunchOptions o =
      parse({"--mpi", "-np", "3", "-H", "localhost:2,node1:4", "python3", "t.py", "-np", "9"});
  EXPECT_TRUE(o.mpi);
  MpirunCommand cmd = mpirun_command(o, {}, kJob, /*as_root=*/false, "/usr/bin/mpirun");
  const auto& a = cmd.argv;
  EXPECT_EQ(a.front(), "/usr/bin/mpirun");
  EXPECT_EQ(after(a, "-np"), "3");
  EXPECT_EQ(after(a, "--host"), "localhost:2,node1:4");
  EXPECT_EQ(after(a, "--bind-to"), "none");
  EXPECT_EQ(after(a, "--map-by"), "slot");
  EXPECT_TRUE(has(a, "--tag-output"));
  EXPECT_FALSE(has(a, "--allow-run-as-root"));
  EXPECT_FALSE(has(a, "--output-filename"));
  const std::vector<std::string> tail(a.end() - 4, a.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"python3", "t.py", "-np", "9"}));
}

TEST(MpirunCommand, DefaultHostIsLocalhostWithNpSlots) {
  MpirunCommand cmd = mpirun_command(parse({"--mpi", "-np", "4", "true"}), {}, kJob, true);
  EXPECT_EQ(cmd.argv.front(), "mpirun");
  EXPECT_EQ(after(cmd.argv, "--host"), "localhost:4");
  EXPECT_TRUE(has(cmd.argv, "--allow-run-as-root"));
}

TEST(MpirunCommand, NoPrefixAndOutputFilenameGoToMpirun) {
  MpirunCommand cmd = mpirun_command(
      parse({"--mpi", "--no-prefix", "--output-filename", "/tmp/out", "-np", "2", "true"}), {},
      kJob, false);
  EXPECT_FALSE(has(cmd.argv, "--tag-output"));
  EXPECT_EQ(after(cmd.argv, "--output-filename"), "/tmp/out");
}

TEST(MpirunCommand, SshSettingsAndInterfaceGoToMpirun) {
  auto dir = std::filesystem::temp_directory_path() / ("krug-mpissh-" + make_job_id());
  std::filesystem::create_directories(dir);
  const auto key = (dir / "id").string();
  std::ofstream(key) << "key";
  MpirunCommand cmd = mpirun_command(
      parse({"--mpi", "-np", "2", "-p", "2200", "-i", key.c_str(), "--network-interface", "eth1",
             "true"}),
      {}, kJob, false);
  EXPECT_EQ(after(cmd.argv, "plm_rsh_args"), "-p 2200 -i " + key);
  EXPECT_EQ(after(cmd.argv, "btl_tcp_if_include"), "eth1");
  EXPECT_EQ(after(cmd.argv, "oob_tcp_if_include"), "eth1");
  MpirunCommand plain = mpirun_command(parse({"--mpi", "-np", "2", "true"}), {}, kJob, false);
  EXPECT_FALSE(has(plain.argv, "plm_rsh_args"));
  EXPECT_FALSE(has(plain.argv, "btl_tcp_if_include"));
  std::filesystem::remove_all(dir);
}

TEST(MpirunCommand, EnvironmentCarriesTheJobButNoPerRankTopology) {
  LaunchOptions o = parse({"--mpi", "-np", "2", "--cycle-time-ms", "5", "-x", "FOO=bar", "-x",
                           "HOME", "-x", "UNSET_VAR", "true"});
  const EnvMap base{{"HOME", "/root"},        {"PATH", "/bin"},
                    {"KRUG_RANK", "7"},       {"HOROVOD_LOCAL_RANK", "1"},
                    {"KRUG_HOSTNAME", "old"}, {"KRUG_LOG_LEVEL", "info"},
                    {"USER", "me"},           {"OMPI_MCA_btl", "tcp,self"}};
  MpirunCommand cmd = mpirun_command(o, base, kJob, false);
  EnvMap& env = cmd.env;
  EXPECT_EQ(env.count("KRUG_RANK"), 0u);
  EXPECT_EQ(env.count("HOROVOD_LOCAL_RANK"), 0u);
  EXPECT_EQ(env.count("KRUG_HOSTNAME"), 0u);
  EXPECT_EQ(env["PATH"], "/bin");
  EXPECT_EQ(env["FOO"], "bar");
  EXPECT_EQ(env["KRUG_CYCLE_TIME"], "5");
  EXPECT_EQ(env["KRUG_RENDEZVOUS_ADDR"], "127.0.0.1");
  EXPECT_EQ(env["HOROVOD_GLOO_RENDEZVOUS_PORT"], "4321");
  EXPECT_EQ(env["KRUG_SECRET"], "s3cret");
  EXPECT_EQ(env["KRUG_JOB_ID"], "abcd1234");
  EXPECT_EQ(env["KRUG_CPU_OPERATIONS"], "mpi");

  const auto names = forwarded(cmd.argv);
  for (const char* name : {"KRUG_SECRET", "KRUG_RENDEZVOUS_ADDR", "KRUG_RENDEZVOUS_PORT",
                           "HOROVOD_GLOO_RENDEZVOUS_ADDR", "KRUG_CPU_OPERATIONS", "KRUG_CYCLE_TIME",
                           "KRUG_LOG_LEVEL", "FOO", "HOME"})
    EXPECT_TRUE(has(names, name)) << name;
  EXPECT_FALSE(has(names, "UNSET_VAR")) << "mpirun rejects -x of a variable it does not have";
  EXPECT_TRUE(has(names, "PATH")) << "carried to every host, as an ssh start does";
  EXPECT_FALSE(has(names, "USER")) << "the login's own";
  EXPECT_FALSE(has(names, "OMPI_MCA_btl")) << "mpirun's own: it reads it itself";
  EXPECT_FALSE(has(names, "KRUG_RANK"));
  // The secret travels by name only: it is not on the command line.
  for (const auto& arg : cmd.argv) EXPECT_EQ(arg.find("s3cret"), std::string::npos) << arg;
}

TEST(MpirunCommand, KeepsTheUsersChoiceOfDataPlane) {
  LaunchOptions o = parse({"--mpi", "-np", "2", "-x", "KRUG_CPU_OPERATIONS=gloo", "true"});
  EXPECT_EQ(mpirun_command(o, {}, kJob, false).env["KRUG_CPU_OPERATIONS"], "gloo");
  o = parse({"--mpi", "-np", "2", "true"});
  auto env = mpirun_command(o, {{"HOROVOD_CPU_OPERATIONS", "gloo"}}, kJob, false).env;
  EXPECT_EQ(env.count("KRUG_CPU_OPERATIONS"), 0u);
  EXPECT_EQ(env["HOROVOD_CPU_OPERATIONS"], "gloo");
}

TEST(MpirunCommand, PrependsTheBuildTreePythonDirAndForwardsIt) {
  JobInfo job = kJob;
  job.python_dir = "/b/python";
  MpirunCommand cmd =
      mpirun_command(parse({"--mpi", "-np", "2", "true"}), {{"PYTHONPATH", "/x"}}, job, false);
  EXPECT_EQ(cmd.env["PYTHONPATH"], "/b/python:/x");
  EXPECT_TRUE(has(forwarded(cmd.argv), "PYTHONPATH"));
}

// mpirun's output through the same line splitting the output pumps use.
std::string regroup(const std::vector<std::string>& chunks) {
  LineBuffer lines("", std::make_unique<MpirunOutput>());
  std::string out;
  for (const auto& c : chunks) lines.feed(c, out);
  lines.finish(out);
  return out;
}

TEST(MpirunOutput, RewritesOpenMpiTagsToKrugruns) {
  EXPECT_EQ(regroup({"[1,0]<stdout>:hello\n"}), "[0]<stdout>:hello\n");
  EXPECT_EQ(regroup({"[12,37]<stderr>:x [1,2] y\n"}), "[37]<stderr>:x [1,2] y\n");
  EXPECT_EQ(regroup({"[1,3]<stdout>:\n"}), "[3]<stdout>:\n");
  EXPECT_EQ(regroup({"[1,0]<stdout>:a\n[1,1]<st", "dout>:b\n"}), "[0]<stdout>:a\n[1]<stdout>:b\n");
  // mpirun's own messages and look-alikes are left alone.
  for (const char* line : {"", "mpirun noticed that process rank 1 ...", "[1,0]<stdin>:x",
                           "[1,x]<stdout>:x", "[,0]<stdout>:x", "[1,0<stdout>:x", "[[1,0]"})
    EXPECT_EQ(regroup({std::string(line) + "\n"}), std::string(line) + "\n");
}

// What mpirun printed for two ranks that each wrote "aaaa", then "bbbb\n": every chunk is
// tagged, lines are not. Each rank's line comes out whole.
TEST(MpirunOutput, JoinsTheChunksOfEachRanksLine) {
  EXPECT_EQ(
      regroup({"[1,0]<stdout>:aaaa[1,1]<stdout>:aaaa[1,0]<stdout>:bbbb\n", "[1,1]<stdout>:bbbb\n"}),
      "[0]<stdout>:aaaabbbb\n[1]<stdout>:aaaabbbb\n");
  // A chunk holding several lines tags each of them; an unterminated last line is flushed at
  // the end of the stream.
  EXPECT_EQ(regroup({"[1,1]<stdout>:x\n[1,1]<stdout>:y\n[1,1]<stdout>:z[1,0]<stdout>:x\n",
                     "[1,0]<stdout>:z[1,1]<stdout>:w\n[1,0]<stdout>:w"}),
            "[1]<stdout>:x\n[1]<stdout>:y\n[0]<stdout>:x\n[1]<stdout>:zw\n[0]<stdout>:zw\n");
  EXPECT_EQ(regroup({"[1,2]<stderr>:tail"}), "[2]<stderr>:tail\n");
}

TEST(MpiRendezvousPlace, LoopbackForThisHostOnlyElseEveryInterface) {
  auto local = mpi_rendezvous_place({{"localhost", 2}, {"myhost", 2}}, "myhost");
  EXPECT_EQ(local.bind_host, "127.0.0.1");
  EXPECT_EQ(local.advertise, "127.0.0.1");
  auto remote = mpi_rendezvous_place({{"localhost", 2}, {"node1", 2}}, "myhost");
  EXPECT_EQ(remote.bind_host, "");
  EXPECT_EQ(remote.advertise, "myhost");
}

}  // namespace
}  // namespace krug::run
