// The job spec file of `krugrun --config`: a full file, each class of error with the location
// and key it must name, the workers shorthand, and the merge in which flags win.
#include "run/cli/job_spec.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "krug/types.h"
#include "run/cli/options.h"
#include "run/launch/rank_env.h"

namespace krug::run {
namespace {

namespace fs = std::filesystem;

// A directory of files for one test, removed with it.
class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("krug-jobspec-" + make_job_id())) {
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return (path_ / name).string();
  }

 private:
  fs::path path_;
};

JobSpec parse(const std::string& text) {
  return parse_job_spec(text, "job.yaml");
}

// The message of the Error that parsing `text` throws ("" and a failure if none is thrown).
std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

LaunchOptions parse_args(std::vector<std::string> args) {
  args.insert(args.begin(), "krugrun");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  auto result = parse_command_line(static_cast<int>(argv.size()), argv.data());
  if (auto* code = std::get_if<int>(&result)) throw Error("exit code " + std::to_string(*code));
  return std::get<LaunchOptions>(result);
}

using Env = std::vector<std::pair<std::string, std::string>>;
using Steps = std::vector<std::vector<std::string>>;

TEST(JobSpec, FullFile) {
  TempDir dir;
  std::string key = dir.write("id", "key"), config = dir.write("ssh_config", "Host *\n");
  JobSpec s = parse(
      "# a two-host job\n"
      "np: 3\n"
      "workers:\n"
      "  hosts: [\"node1:2\", node2]\n"
      "  processes_per_worker: 4\n"
      "env:\n"
      "  DATA: /data/set 1\n"
      "  LR: 0.10\n"
      "forward_env: [HOME, PATH]\n"
      "fusion_threshold_mb: 32\n"
      "cycle_time_ms: 2.50\n"
      "timeline_filename: /tmp/t.json\n"
      "timeout_seconds: 7\n"
      "log_level: debug\n"
      "stall_check_seconds: 30\n"
      "stall_shutdown_seconds: 90\n"
      "cache_capacity: 0\n"
      "output_filename: logs\n"
      "verbose: true\n"
      "prefix: no\n"
      "start_timeout: 12.5\n"
      "ssh_port: 2222\n"
      "ssh_identity_file: " +
      key +
      "\n"
      "ssh_config_file: " +
      config +
      "\n"
      "network_interface: eth1\n"
      "run:\n"
      "  - python3 prepare.py --out \"/tmp/a b\"\n"
      "  - cd work && python3 train.py\n");
  EXPECT_EQ(s.np, 3);
  ASSERT_EQ(s.hosts.size(), 2u);
  EXPECT_EQ(s.hosts[0].host, "node1");
  EXPECT_EQ(s.hosts[0].slots, 2);  // its own count wins over processes_per_worker
  EXPECT_EQ(s.hosts[1].host, "node2");
  EXPECT_EQ(s.hosts[1].slots, 4);
  EXPECT_EQ(s.env, (Env{{"DATA", "/data/set 1"}, {"LR", "0.10"}}));  // as written
  EXPECT_EQ(s.forward_env, (std::vector<std::string>{"HOME", "PATH"}));
  EXPECT_EQ(s.knob_env.at("KRUG_FUSION_THRESHOLD"), std::to_string(32LL << 20));
  EXPECT_EQ(s.knob_env.at("KRUG_CYCLE_TIME"), "2.5");
  EXPECT_EQ(s.knob_env.at("KRUG_TIMELINE"), "/tmp/t.json");
  EXPECT_EQ(s.knob_env.at("KRUG_TIMEOUT_SECONDS"), "7");
  EXPECT_EQ(s.knob_env.at("KRUG_LOG_LEVEL"), "debug");
  EXPECT_EQ(s.knob_env.at("KRUG_STALL_CHECK_TIME_SECONDS"), "30");
  EXPECT_EQ(s.knob_env.at("KRUG_STALL_SHUTDOWN_TIME_SECONDS"), "90");
  EXPECT_EQ(s.knob_env.at("KRUG_CACHE_CAPACITY"), "0");
  EXPECT_EQ(s.knob_env.size(), 8u);
  EXPECT_EQ(s.output_filename, "logs");
  EXPECT_EQ(s.verbose, true);
  EXPECT_EQ(s.prefix, false);
  EXPECT_EQ(s.start_timeout, 12.5);
  EXPECT_EQ(s.ssh_port, 2222);
  EXPECT_EQ(s.ssh_identity_file, key);
  EXPECT_EQ(s.ssh_config_file, config);
  EXPECT_EQ(s.network_interface, "eth1");
  EXPECT_EQ(step_commands(s), (Steps{{"/bin/sh", "-c", "python3 prepare.py --out \"/tmp/a b\""},
                                     {"/bin/sh", "-c", "cd work && python3 train.py"}}));
}

TEST(JobSpec, KnobsMatchTheirFlags) {
  JobSpec s = parse(
      "fusion_threshold_mb: 8\ncycle_time_ms: 1e1\ntimeout_seconds: 2.0\n"
      "log_level: WARNING\ncache_capacity: 12\nrun: 'true'\n");
  LaunchOptions o = parse_args({"-np", "1", "--fusion-threshold-mb", "8", "--cycle-time-ms", "1e1",
                                "--timeout-seconds", "2.0", "--log-level", "WARNING",
                                "--cache-capacity", "12", "true"});
  EXPECT_EQ(s.knob_env, o.knob_env);
  EXPECT_EQ(s.knob_env.at("KRUG_CYCLE_TIME"), "10");
}

TEST(JobSpec, SwitchesMatchTheirFlags) {
  JobSpec on = parse("autotune: true\nhierarchical_allreduce: yes\nrun: 'true'\n");
  LaunchOptions o = parse_args({"-np", "1", "--autotune", "--hierarchical-allreduce", "true"});
  EXPECT_EQ(on.knob_env, o.knob_env);
  JobSpec off = parse("autotune: false\nhierarchical_allreduce: false\nrun: 'true'\n");
  EXPECT_EQ(off.knob_env.at("KRUG_AUTOTUNE"), "0");
  EXPECT_EQ(off.knob_env.at("KRUG_HIERARCHICAL_ALLREDUCE"), "0");
  // The command line wins over the file.
  LaunchOptions flags = parse_args({"-np", "1", "--no-hierarchical-allreduce", "true"});
  LaunchOptions merged = apply_job_spec(on, flags, {});
  EXPECT_EQ(merged.knob_env.at("KRUG_HIERARCHICAL_ALLREDUCE"), "0");
  EXPECT_EQ(merged.knob_env.at("KRUG_AUTOTUNE"), "1");
}

TEST(JobSpec, MinimalFileAndSingleStringForms) {
  JobSpec s = parse("run: python3 train.py --epochs 3\nforward_env: HOME\n");
  EXPECT_FALSE(s.np);
  EXPECT_TRUE(s.hosts.empty());
  EXPECT_EQ(s.run, std::vector<std::string>{"python3 train.py --epochs 3"});
  EXPECT_EQ(s.forward_env, std::vector<std::string>{"HOME"});
  JobSpec h = parse("workers: {hosts: 'a:2,b'}\nrun: [x]\n");  // horovodrun's -H string
  ASSERT_EQ(h.hosts.size(), 2u);
  EXPECT_EQ(h.hosts[1].slots, 1);
}

struct BadFile {
  std::string text;
  std::string message;  // a part of the error's message
};

TEST(JobSpec, ErrorsNameFileLineAndKey) {
  const std::vector<BadFile> cases = {
      {"", "job.yaml: the job spec is empty"},
      {"# only a comment\n", "job.yaml: the job spec is empty"},
      {"- np: 2\n", "job.yaml:1:1: expected a mapping of settings"},
      {"np: [1, 2\nrun: x\n", "job.yaml:2:"},  // unclosed list
      {"np: 2\nrun: x\nfusion_treshold_mb: 3\n",
       "job.yaml:3:1: fusion_treshold_mb: unknown key; did you mean 'fusion_threshold_mb'?"},
      {"run: x\nhosts: [a]\n", "job.yaml:2:1: hosts: unknown key; known keys: np, workers"},
      {"np: 2\nnp: 3\nrun: x\n", "job.yaml:2:1: np: given twice"},
      {"workers:\n  hosts: [a]\n  slots: 2\nrun: x\n",
       "job.yaml:3:3: workers: unknown key 'slots'"},
      {"np: four\nrun: x\n", "job.yaml:1:5: np: 'four' is not a whole number"},
      {"np: 2.5\nrun: x\n", "np: '2.5' is not a whole number"},
      {"np: [4]\nrun: x\n", "job.yaml:1:5: np: expected a whole number, got a list"},
      {"np:\nrun: x\n", "np: expected a whole number, got nothing"},
      {"np: 0\nrun: x\n", "np: 0 is not in 1..2147483647"},
      {"ssh_port: 70000\nrun: x\n", "ssh_port: 70000 is not in 1..65535"},
      {"verbose: maybe\nrun: x\n", "job.yaml:1:10: verbose: 'maybe' is not true or false"},
      {"start_timeout: 0\nrun: x\n", "start_timeout: 0 must be greater than 0"},
      {"cycle_time_ms: 0\nrun: x\n", "job.yaml:1:16: cycle_time_ms: 0 must be greater than 0"},
      {"fusion_threshold_mb: -1\nrun: x\n", "fusion_threshold_mb: -1 must be at least 0"},
      {"cache_capacity: 1.5\nrun: x\n", "cache_capacity: '1.5' is not a whole number"},
      {"log_level: loud\nrun: x\n", "log_level: invalid log level 'loud'"},
      {"timeline_filename: {a: b}\nrun: x\n", "timeline_filename: expected a value, got a mapping"},
      {"env: [A]\nrun: x\n", "job.yaml:1:6: env: expected a mapping, got a list"},
      {"env:\n  1BAD: x\nrun: x\n", "job.yaml:2:3: env: '1BAD' is not a variable name"},
      {"env:\n  A:\nrun: x\n", "env.A: has no value"},
      {"env:\n  A: [1]\nrun: x\n", "env.A: expected a value, got a list"},
      {"forward_env: [HOME, 'A-B']\nrun: x\n", "forward_env: 'A-B' is not a variable name"},
      {"workers: [a]\nrun: x\n", "workers: expected a mapping, got a list"},
      {"workers: {hosts: ['a:x']}\nrun: x\n",
       "job.yaml:1:18: workers.hosts: slot count 'x' of host 'a' is not a number"},
      {"workers: {hosts: [a, b, a]}\nrun: x\n",
       "job.yaml:1:18: workers.hosts: host 'a' is listed twice"},
      {"workers: {hosts: []}\nrun: x\n", "workers.hosts: the list is empty"},
      {"workers: {hosts: [a], count: 2}\nrun: x\n",
       "workers.count: 2 workers asked for, but workers.hosts lists 1"},
      {"workers: {count: 0}\nrun: x\n", "workers.count: 0 is not in 1.."},
      {"workers: {processes_per_worker: two}\nrun: x\n",
       "workers.processes_per_worker: 'two' is not a whole number"},
      {"hostfile: /nonexistent/hosts\nrun: x\n",
       "job.yaml:1:11: hostfile: '/nonexistent/hosts' "
       "is not a file"},
      {"ssh_identity_file: /nonexistent/id\nrun: x\n", "ssh_identity_file: '/nonexistent/id'"},
      {"output_filename: ''\nrun: x\n", "output_filename: must not be empty"},
      {"np: 2\n", "job.yaml: no `run:` steps"},
      {"run: []\n", "job.yaml:1:6: run: the list of steps is empty"},
      {"run: [a, '  ']\n", "job.yaml:1:10: run: a step is empty"},
      {"run: {a: b}\n", "run: expected a list, got a mapping"},
  };
  for (const auto& c : cases) {
    std::string message = error_of(c.text);
    EXPECT_NE(message.find(c.message), std::string::npos)
        << "file:\n"
        << c.text << "\nmessage: " << message << "\nexpected: " << c.message;
    EXPECT_EQ(message.rfind("krugrun: ", 0), 0u) << message;
  }
}

TEST(JobSpec, HostfileConflicts) {
  TempDir dir;
  std::string hf = dir.write("hosts", "n1 slots=2\nn2 slots=2\n");
  EXPECT_NE(error_of("workers: {hosts: [a]}\nhostfile: " + hf + "\nrun: x\n")
                .find("job.yaml:2:1: hostfile: give the hosts in workers.hosts or in a hostfile"),
            std::string::npos);
  EXPECT_NE(error_of("workers: {processes_per_worker: 2}\nhostfile: " + hf + "\nrun: x\n")
                .find("cannot be used with a hostfile"),
            std::string::npos);
}

TEST(JobSpec, LoadReadsTheFileAndNamesAMissingOne) {
  TempDir dir;
  std::string path = dir.write("job.yaml", "np: 2\nrun: [hostname]\n");
  JobSpec s = load_job_spec(path);
  EXPECT_EQ(s.np, 2);
  EXPECT_EQ(s.path, path);
  try {
    load_job_spec(path + ".missing");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read the job spec " + path + ".missing"),
              std::string::npos)
        << e.what();
  }
  std::string bad = dir.write("bad.yaml", "run: x\nbogus: 1\n");
  try {
    load_job_spec(bad);
    ADD_FAILURE() << "no error for an unknown key";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":2:1: bogus: unknown key"), std::string::npos)
        << e.what();
  }
}

// The example in docs/krugrun.md is a valid file and means what the page says.
TEST(JobSpec, DocumentedExampleParses) {
  std::ifstream in(std::string(KRUG_SOURCE_DIR) + "/docs/krugrun.md");
  std::stringstream page;
  page << in.rdbuf();
  std::string text = page.str();
  size_t section = text.find("## Job spec file");
  ASSERT_NE(section, std::string::npos);
  size_t begin = text.find("```yaml\n", section);
  ASSERT_NE(begin, std::string::npos);
  begin += 8;
  std::string yaml = text.substr(begin, text.find("```", begin) - begin);
  LaunchOptions o = apply_job_spec(parse(yaml), {}, {});
  EXPECT_EQ(o.np, 8);
  ASSERT_EQ(o.hosts.size(), 2u);
  EXPECT_EQ(o.hosts[1].host, "node2");
  EXPECT_EQ(o.hosts[1].slots, 4);
  EXPECT_EQ(o.knob_env.at("KRUG_LOG_LEVEL"), "info");
  EXPECT_EQ(o.knob_env.at("KRUG_AUTOTUNE"), "1");
  EXPECT_EQ(o.steps.size(), 2u);
}

TEST(JobSpecApply, WorkersShorthand) {
  // count alone: that many workers on this machine, processes_per_worker each.
  LaunchOptions o =
      apply_job_spec(parse("workers: {count: 2, processes_per_worker: 3}\nrun: x\n"), {}, {});
  ASSERT_EQ(o.hosts.size(), 1u);
  EXPECT_EQ(o.hosts[0].host, "localhost");
  EXPECT_EQ(o.hosts[0].slots, 6);
  EXPECT_EQ(o.np, 6);
  // count keeps the first workers of the list; np defaults to their slots.
  o = apply_job_spec(parse("workers: {hosts: [a, 'b:3', c], count: 2, processes_per_worker: 2}\n"
                           "run: x\n"),
                     {}, {});
  ASSERT_EQ(o.hosts.size(), 2u);
  EXPECT_EQ(o.hosts[1].host, "b");
  EXPECT_EQ(o.np, 5);
  // ... and of a hostfile, read when the spec is applied.
  TempDir dir;
  std::string hf = dir.write("hosts", "n1 slots=2\nn2 slots=2\nn3 slots=2\n");
  o = apply_job_spec(parse("hostfile: " + hf + "\nworkers: {count: 2}\nrun: x\n"), {}, {});
  ASSERT_EQ(o.hosts.size(), 2u);
  EXPECT_EQ(o.np, 4);
  EXPECT_EQ(o.hostfile, hf);
  try {
    apply_job_spec(parse("hostfile: " + hf + "\nworkers: {count: 4}\nrun: x\n"), {}, {});
    ADD_FAILURE() << "count larger than the hostfile accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workers.count is 4, but hostfile " + hf + " lists 3"),
              std::string::npos)
        << e.what();
  }
}

TEST(JobSpecApply, FlagsWinOverTheFile) {
  JobSpec s = parse(
      "np: 4\nworkers: {hosts: ['a:4']}\nenv: {A: file, B: file, C: file}\n"
      "forward_env: [HOME]\ncycle_time_ms: 5\ntimeout_seconds: 9\noutput_filename: file-logs\n"
      "verbose: true\nprefix: false\nstart_timeout: 3\nssh_port: 2200\nnetwork_interface: eth9\n"
      "run: [step one, step two]\n");
  LaunchOptions flags;
  flags.np = 2;
  flags.hosts = {{"localhost", 2}};
  flags.set_env = {{"A", "flag"}};
  flags.forward_env = {"C", "HOME"};
  flags.knob_env = {{"KRUG_CYCLE_TIME", "1"}};
  flags.output_dir = "flag-logs";
  flags.start_timeout_s = 30;  // a default: start_timeout not given
  LaunchOptions o = apply_job_spec(s, flags, {"np", "hosts", "output_filename"});
  EXPECT_EQ(o.np, 2);
  ASSERT_EQ(o.hosts.size(), 1u);
  EXPECT_EQ(o.hosts[0].host, "localhost");
  EXPECT_EQ(o.output_dir, "flag-logs");
  EXPECT_EQ(o.knob_env.at("KRUG_CYCLE_TIME"), "1");
  EXPECT_EQ(o.knob_env.at("KRUG_TIMEOUT_SECONDS"), "9");
  // Applied in order, so the flag's A comes last; C is forwarded by the flags, not set.
  EXPECT_EQ(o.set_env, (Env{{"A", "file"}, {"B", "file"}, {"A", "flag"}}));
  EXPECT_EQ(o.forward_env, (std::vector<std::string>{"HOME", "C"}));
  EXPECT_TRUE(o.verbose);
  EXPECT_FALSE(o.prefix);
  EXPECT_EQ(o.start_timeout_s, 3.0);
  EXPECT_EQ(o.ssh_port, 2200);
  EXPECT_EQ(o.network_interface, "eth9");
  EXPECT_EQ(o.steps, (Steps{{"/bin/sh", "-c", "step one"}, {"/bin/sh", "-c", "step two"}}));
  EXPECT_TRUE(o.command.empty());

  // A command on the command line replaces the steps; an unset flag keeps the file's value.
  flags.command = {"python3", "other.py"};
  o = apply_job_spec(s, flags, {"verbose"});
  EXPECT_TRUE(o.steps.empty());
  EXPECT_EQ(o.command, flags.command);
  EXPECT_FALSE(o.verbose);  // --verbose not given on the flags, but named as given
  EXPECT_EQ(o.np, 4);
  EXPECT_EQ(o.hosts[0].host, "a");
}

TEST(JobSpecApply, ConfigFlagEndToEnd) {
  TempDir dir;
  std::string job = dir.write("job.yaml",
                              "np: 3\ncycle_time_ms: 5\nverbose: true\nenv: {A: '1'}\n"
                              "run:\n  - echo one\n  - echo two\n");
  LaunchOptions o = parse_args({"--config", job, "--cycle-time-ms", "7", "-x", "A=2"});
  EXPECT_EQ(o.np, 3);
  ASSERT_EQ(o.hosts.size(), 1u);
  EXPECT_EQ(o.hosts[0].slots, 3);  // localhost:np, as without -H
  EXPECT_EQ(o.knob_env.at("KRUG_CYCLE_TIME"), "7");
  EXPECT_TRUE(o.verbose);
  EXPECT_EQ(o.set_env, (Env{{"A", "1"}, {"A", "2"}}));
  EXPECT_EQ(o.steps.size(), 2u);
  EXPECT_TRUE(o.command.empty());

  LaunchOptions c = parse_args({"--config", job, "-np", "2", "hostname"});
  EXPECT_EQ(c.np, 2);
  EXPECT_EQ(c.command, std::vector<std::string>{"hostname"});
  EXPECT_TRUE(c.steps.empty());

  std::string no_np = dir.write("no-np.yaml", "run: [x]\n");
  EXPECT_THROW(parse_args({"--config", no_np}), Error);  // np nowhere
  EXPECT_EQ(parse_args({"--config", no_np, "-np", "2"}).np, 2);
  std::string too_many = dir.write("many.yaml",
                                   "np: 5\nworkers: {hosts: ['localhost:2']}\n"
                                   "run: [x]\n");
  EXPECT_THROW(parse_args({"--config", too_many}), Error);  // 2 slots for 5 ranks
  EXPECT_THROW(parse_args({"--config", job + ".missing"}), Error);
  EXPECT_THROW(parse_args({"-np", "1"}), Error);  // still no command without --config
}

}  // namespace
}  // namespace krug::run
