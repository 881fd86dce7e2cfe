// Unit tests of krugrun's pure parts: -H parsing, rank layout, options, rank environment and
// output line splitting. No processes are started.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <variant>

#include "krug/types.h"
#include "run/cli/hosts.h"
#include "run/cli/options.h"
#include "run/elastic/discovery.h"
#include "run/launch/env_block.h"
#include "run/launch/output.h"
#include "run/launch/rank_env.h"
#include "run/launch/ssh.h"

namespace krug::run {
namespace {

TEST(ParseHosts, AcceptsSlotsAndBareHosts) {
  auto hosts = parse_hosts("localhost:2, node1:4,node2");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "localhost");
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].host, "node1");
  EXPECT_EQ(hosts[1].slots, 4);
  EXPECT_EQ(hosts[2].host, "node2");
  EXPECT_EQ(hosts[2].slots, 1);
}

TEST(ParseHosts, RejectsMalformedSpecsWithTheExpectedForm) {
  for (const char* bad : {"", ",", "localhost:", "localhost:x", "localhost:2x", ":2",
                          "localhost:0", "localhost:-1", "a:1,,b:1", "a:1:2", "a:1,a:2"}) {
    try {
      parse_hosts(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("host"), std::string::npos) << e.what();
    }
  }
  try {
    parse_hosts("localhost:x");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host:slots"), std::string::npos) << e.what();
  }
}

TEST(LayoutRanks, FillsHostsInOrder) {
  auto ranks = layout_ranks({{"a", 2}, {"b", 3}, {"c", 4}}, 4);
  ASSERT_EQ(ranks.size(), 4u);
  const int expect[4][5] = {// local_rank, local_size, cross_rank, cross_size, host index
                            {0, 2, 0, 2, 0}, {1, 2, 0, 2, 0}, {0, 2, 1, 2, 1}, {1, 2, 1, 2, 1}};
  const char* names[] = {"a", "b"};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[r].rank, r);
    EXPECT_EQ(ranks[r].size, 4);
    EXPECT_EQ(ranks[r].local_rank, expect[r][0]) << r;
    EXPECT_EQ(ranks[r].local_size, expect[r][1]) << r;
    EXPECT_EQ(ranks[r].cross_rank, expect[r][2]) << r;
    EXPECT_EQ(ranks[r].cross_size, expect[r][3]) << r;
    EXPECT_EQ(ranks[r].host, names[expect[r][4]]) << r;
  }
}

TEST(LayoutRanks, SingleHostAndErrors) {
  auto ranks = layout_ranks({{"localhost", 3}}, 3);
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[2].local_rank, 2);
  EXPECT_EQ(ranks[2].local_size, 3);
  EXPECT_EQ(ranks[2].cross_size, 1);
  EXPECT_THROW(layout_ranks({{"localhost", 2}}, 3), Error);
  EXPECT_THROW(layout_ranks({{"localhost", 2}}, 0), Error);
  EXPECT_THROW(layout_ranks({{"localhost", 2}}, -1), Error);
}

TEST(LayoutRanks, CrossRankCountsHostsWithTheSameLocalRank) {
  // Horovod's definition: cross_* number the ranks sharing a local_rank.
  auto ranks = layout_ranks({{"a", 3}, {"b", 1}, {"c", 2}}, 6);
  const int expect[6][4] = {// local_rank, local_size, cross_rank, cross_size
                            {0, 3, 0, 3}, {1, 3, 0, 2}, {2, 3, 0, 1},
                            {0, 1, 1, 3}, {0, 2, 2, 3}, {1, 2, 1, 2}};
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(ranks[r].local_rank, expect[r][0]) << r;
    EXPECT_EQ(ranks[r].local_size, expect[r][1]) << r;
    EXPECT_EQ(ranks[r].cross_rank, expect[r][2]) << r;
    EXPECT_EQ(ranks[r].cross_size, expect[r][3]) << r;
  }
  EXPECT_EQ(count_hosts(ranks), 3);
}

TEST(LocalHost, KnowsThisMachinesNames) {
  EXPECT_TRUE(is_local_host("localhost", "vm1"));
  EXPECT_TRUE(is_local_host("127.0.0.1", "vm1"));
  EXPECT_TRUE(is_local_host("127.0.1.1", "vm1"));
  EXPECT_TRUE(is_local_host("vm1", "vm1"));
  EXPECT_FALSE(is_local_host("vm2", "vm1"));
  EXPECT_TRUE(is_local_host("10.1.2.3", "vm1", {"10.1.2.3", "::1"}));
  EXPECT_FALSE(is_local_host("10.1.2.4", "vm1", {"10.1.2.3", "::1"}));
}

TEST(Hostfile, ParsesSlotsCommentsAndBareHosts) {
  auto hosts = parse_hostfile("# cluster\nnode1 slots=4\n\n  node2   slots=2  # spare\nnode3\r\n",
                              "hf");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "node1");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[1].host, "node2");
  EXPECT_EQ(hosts[1].slots, 2);
  EXPECT_EQ(hosts[2].host, "node3");
  EXPECT_EQ(hosts[2].slots, 1);
}

TEST(Hostfile, ErrorsNameTheLine) {
  const std::pair<const char*, const char*> bad[] = {
      {"a slots=2\nb slots=x\n", "hf:2"},   {"a slots=0\n", "at least 1"},
      {"a cpus=2\n", "unexpected"},         {"a slots=1\na slots=2\n", "twice"},
      {"a:2\n", "host slots=N"},           {"# nothing\n\n", "no hosts"}};
  for (const auto& [text, expected] : bad) {
    try {
      parse_hostfile(text, "hf");
      ADD_FAILURE() << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(read_hostfile("/nonexistent/hostfile"), Error);
}

TEST(Ssh, QuotesForThePosixShell) {
  EXPECT_EQ(shell_quote("plain/path-1.0_x"), "plain/path-1.0_x");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's $HOME"), "'it'\\''s $HOME'");
}

TEST(Ssh, CommandLineCarriesOptionsAndTheWrappedRank) {
  SshOptions o;
  o.port = 2222;
  o.identity_file = "/k/id";
  o.config_file = "/k/cfg";
  o.connect_timeout_s = 7.5;
  o.krugrun_path = "/opt/krug/bin/krugrun";
  o.working_dir = "/home/me/my project";
  std::string remote = remote_rank_command(o, {"python3", "train.py", "--name", "x y"});
  EXPECT_EQ(remote,
            "exec /opt/krug/bin/krugrun __remote-exec --cwd '/home/me/my project' -- python3 "
            "train.py --name 'x y'");
  auto argv = ssh_argv(o, "node7", remote);
  auto has_pair = [&](const std::string& a, const std::string& b) {
    for (size_t i = 0; i + 1 < argv.size(); ++i)
      if (argv[i] == a && argv[i + 1] == b) return true;
    return false;
  };
  EXPECT_EQ(argv.front(), "ssh");
  EXPECT_TRUE(has_pair("-p", "2222"));
  EXPECT_TRUE(has_pair("-i", "/k/id"));
  EXPECT_TRUE(has_pair("-F", "/k/cfg"));
  EXPECT_TRUE(has_pair("-o", "ConnectTimeout=8"));
  EXPECT_TRUE(has_pair("-o", "BatchMode=yes"));
  EXPECT_EQ(argv[argv.size() - 2], "node7");
  EXPECT_EQ(argv.back(), remote);
  // Without options ssh's own defaults (and ~/.ssh/config) apply.
  auto plain = ssh_argv(SshOptions{}, "h", "true");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), "-p"), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), "-F"), 0);
}

TEST(Ssh, CarriesTheEnvironmentButThisLoginsAndDevices) {
  auto env = remote_environment(
      {"PATH=/bin", "KRUG_RANK=1", "HOROVOD_RANK=1", "PYTHONPATH=/p", "HOME=/root", "MYVAR=1=2",
       "SSH_CONNECTION=a b", "CUDA_VISIBLE_DEVICES=0", "XDG_RUNTIME_DIR=/run", "PWD=/x",
       "BASH_FUNC_f%%=() { :; }", "USER=me", "NCCL_DEBUG=INFO"},
      {"USER"});
  EnvEntries expected{{"PATH", "/bin"},      {"KRUG_RANK", "1"}, {"HOROVOD_RANK", "1"},
                      {"PYTHONPATH", "/p"},  {"MYVAR", "1=2"},   {"USER", "me"},
                      {"NCCL_DEBUG", "INFO"}};
  EXPECT_EQ(env, expected);
}

TEST(Ssh, EnvironmentBlockRoundTrips) {
  EnvEntries env{{"A", "1"}, {"KRUG_SECRET", "s e=c\nret"}, {"EMPTY", ""}};
  const std::string block = encode_env_block(env);
  const size_t newline = block.find('\n');
  ASSERT_NE(newline, std::string::npos);
  const size_t bytes = parse_env_block_header(block.substr(0, newline));
  EXPECT_EQ(bytes, block.size() - newline - 1);
  EXPECT_EQ(decode_env_block_body(std::string_view(block).substr(newline + 1)), env);
  EXPECT_TRUE(decode_env_block_body("").empty());
  EXPECT_THROW(parse_env_block_header("12x"), Error);
  EXPECT_THROW(parse_env_block_header(""), Error);
  EXPECT_THROW(parse_env_block_header(std::to_string(kMaxEnvBlockBytes + 1)), Error);
  EXPECT_THROW(decode_env_block_body(std::string("A=1", 3)), Error);  // no terminator
  EXPECT_THROW(decode_env_block_body(std::string("=1\0", 3)), Error);
}

LaunchOptions parse(std::vector<const char*> args) {
  args.insert(args.begin(), "krugrun");
  auto result = parse_command_line(static_cast<int>(args.size()), args.data());
  if (auto* code = std::get_if<int>(&result)) throw Error("exit code " + std::to_string(*code));
  return std::get<LaunchOptions>(result);
}

TEST(Options, CommandStartsAtFirstPositional) {
  auto o = parse({"-np", "2", "-x", "A", "-x", "B=1=2", "--no-prefix", "python3", "train.py",
                  "--lr", "0.1", "-np", "5", "-x", "C"});
  EXPECT_EQ(o.np, 2);
  EXPECT_FALSE(o.prefix);
  EXPECT_EQ(o.forward_env, std::vector<std::string>{"A"});
  ASSERT_EQ(o.set_env.size(), 1u);
  EXPECT_EQ(o.set_env[0].first, "B");
  EXPECT_EQ(o.set_env[0].second, "1=2");
  EXPECT_EQ(o.command, (std::vector<std::string>{"python3", "train.py", "--lr", "0.1", "-np",
                                                  "5", "-x", "C"}));
  ASSERT_EQ(o.hosts.size(), 1u);
  EXPECT_EQ(o.hosts[0].host, "localhost");
  EXPECT_EQ(o.hosts[0].slots, 2);
}

TEST(Options, NpMayFollowFlagsAndValuedOptions) {
  auto o = parse({"--no-prefix", "--verbose", "--timeout-seconds", "5", "-np", "3", "true"});
  EXPECT_EQ(o.np, 3);
  EXPECT_FALSE(o.prefix);
  EXPECT_EQ(o.command, std::vector<std::string>{"true"});
}

TEST(Options, DoubleDashAndHostList) {
  auto o = parse({"-np", "3", "-H", "localhost:2,127.0.0.1:1", "--", "-weird-cmd"});
  EXPECT_EQ(o.command, std::vector<std::string>{"-weird-cmd"});
  EXPECT_EQ(o.hosts.size(), 2u);
}

TEST(Options, KnobFlagsBecomeEnvironment) {
  auto o = parse({"-np", "1", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
                  "--timeline-filename", "/tmp/t.json", "--timeout-seconds", "7",
                  "--log-level", "debug", "--stall-check-seconds", "30",
                  "--stall-shutdown-seconds", "90", "--cache-capacity", "0",
                  "--start-timeout", "12", "true"});
  EXPECT_EQ(o.knob_env.at("KRUG_FUSION_THRESHOLD"), std::to_string(32LL * 1024 * 1024));
  EXPECT_EQ(o.knob_env.at("KRUG_CYCLE_TIME"), "2.5");
  EXPECT_EQ(o.knob_env.at("KRUG_TIMELINE"), "/tmp/t.json");
  EXPECT_EQ(o.knob_env.at("KRUG_TIMEOUT_SECONDS"), "7");
  EXPECT_EQ(o.knob_env.at("KRUG_LOG_LEVEL"), "debug");
  EXPECT_EQ(o.knob_env.at("KRUG_STALL_CHECK_TIME_SECONDS"), "30");
  EXPECT_EQ(o.knob_env.at("KRUG_STALL_SHUTDOWN_TIME_SECONDS"), "90");
  EXPECT_EQ(o.knob_env.at("KRUG_CACHE_CAPACITY"), "0");
  EXPECT_EQ(o.start_timeout_s, 12.0);
  EXPECT_EQ(parse({"-np", "1", "true"}).knob_env.size(), 0u);  // unset flags set nothing
}

// A hostfile of two hosts (n1, n2: two slots each) and an ssh key file, in a directory of their
// own that goes with the object.
struct HostsAndKey {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("krug-hk-" + make_job_id());
  std::string hostfile = (dir / "hosts").string();
  std::string key = (dir / "id").string();
  HostsAndKey() {
    std::filesystem::create_directories(dir);
    std::ofstream(hostfile) << "n1 slots=2\nn2 slots=2\n";
    std::ofstream(key) << "key";
  }
  ~HostsAndKey() { std::filesystem::remove_all(dir); }
};

TEST(Options, HostfileSshAndInterfaceFlags) {
  HostsAndKey files;
  const std::string& hf = files.hostfile;
  const std::string& id = files.key;
  auto o = parse({"-np", "4", "--hostfile", hf.c_str(), "--ssh-port", "2200",
                  "--ssh-identity-file", id.c_str(), "--network-interface", "eth1", "true"});
  ASSERT_EQ(o.hosts.size(), 2u);
  EXPECT_EQ(o.hosts[1].host, "n2");
  EXPECT_EQ(o.ssh_port, 2200);
  EXPECT_EQ(o.ssh_identity_file, id);
  EXPECT_EQ(o.knob_env.at("KRUG_GLOO_IFACE"), "eth1");
  auto check = parse({"--check-hosts", "-H", "a,b:2"});
  EXPECT_TRUE(check.check_hosts_only);
  EXPECT_EQ(check.hosts.size(), 2u);
  EXPECT_THROW(parse({"-np", "5", "--hostfile", hf.c_str(), "true"}), Error);  // 4 slots
  EXPECT_THROW(parse({"-np", "1", "-H", "a", "--hostfile", hf.c_str(), "true"}), Error);
  EXPECT_THROW(parse({"--check-hosts"}), Error);
  EXPECT_THROW(parse({"-np", "1", "--ssh-port", "0", "true"}), Error);
}

TEST(Options, HorovodrunSpellingsAndAliases) {
  HostsAndKey files;
  // "-hostfile" was read as -h (help) plus "ostfile".
  auto o = parse({"-np", "4", "-hostfile", files.hostfile.c_str(), "-p", "2200", "-i",
                  files.key.c_str(), "true"});
  EXPECT_EQ(o.hosts.size(), 2u);
  EXPECT_EQ(o.ssh_port, 2200);
  EXPECT_EQ(o.ssh_identity_file, files.key);

  o = parse({"-np", "1", "--stall-check-warning-time-seconds", "5",
             "--stall-check-shutdown-time-seconds", "9", "--gloo-timeout-seconds", "7",
             "--no-stall-check", "--timeline-mark-cycles", "--gloo", "--disable-cache",
             "--log-hide-timestamp", "--log-level", "WARN", "true"});
  EXPECT_EQ(o.knob_env.at("KRUG_STALL_CHECK_TIME_SECONDS"), "5");
  EXPECT_EQ(o.knob_env.at("KRUG_STALL_SHUTDOWN_TIME_SECONDS"), "9");
  EXPECT_EQ(o.knob_env.at("KRUG_TIMEOUT_SECONDS"), "7");
  EXPECT_EQ(o.knob_env.at("KRUG_STALL_CHECK_DISABLE"), "1");
  EXPECT_EQ(o.knob_env.at("KRUG_TIMELINE_MARK_CYCLES"), "1");
  EXPECT_EQ(o.knob_env.at("KRUG_LOG_LEVEL"), "warning");  // the engine's spelling
  EXPECT_THROW(parse({"-np", "1", "--gloo", "--mpi", "true"}), Error);
}

TEST(Options, HorovodrunConfigFile) {
  auto dir = std::filesystem::temp_directory_path() / ("krug-hcfg-" + make_job_id());
  std::filesystem::create_directories(dir);
  const auto path = (dir / "horovod.yaml").string();
  std::ofstream(path) << "controller: mpi\n"
                         "params:\n  fusion_threshold_mb: 32\n  cycle_time_ms: 2.5\n"
                         "  hierarchical_allreduce: true\n  hierarchical_allgather: false\n"
                         "autotune:\n  enabled: true\n  warmup_samples: 3\n"
                         "timeline:\n  filename: /tmp/t.json\n  mark_cycles: false\n"
                         "stall_check:\n  enabled: false\n  warning_time_seconds: 60\n"
                         "library_options:\n  gloo_timeout_seconds: 45\n  num_nccl_streams: 2\n"
                         "logging:\n  level: WARNING\n";
  auto o = parse({"-np", "1", "--config-file", path.c_str(), "--cycle-time-ms", "7", "true"});
  EXPECT_TRUE(o.mpi);
  EXPECT_EQ(o.knob_env.at("KRUG_FUSION_THRESHOLD"), std::to_string(32LL * 1024 * 1024));
  EXPECT_EQ(o.knob_env.at("KRUG_CYCLE_TIME"), "7");  // the flag wins
  EXPECT_EQ(o.knob_env.at("KRUG_HIERARCHICAL_ALLREDUCE"), "1");
  EXPECT_EQ(o.knob_env.at("KRUG_AUTOTUNE"), "1");
  EXPECT_EQ(o.knob_env.at("KRUG_AUTOTUNE_WARMUP_SAMPLES"), "3");
  EXPECT_EQ(o.knob_env.at("KRUG_TIMELINE"), "/tmp/t.json");
  EXPECT_EQ(o.knob_env.at("KRUG_TIMELINE_MARK_CYCLES"), "0");
  EXPECT_EQ(o.knob_env.at("KRUG_STALL_CHECK_DISABLE"), "1");
  EXPECT_EQ(o.knob_env.at("KRUG_STALL_CHECK_TIME_SECONDS"), "60");
  EXPECT_EQ(o.knob_env.at("KRUG_TIMEOUT_SECONDS"), "45");
  EXPECT_EQ(o.knob_env.at("KRUG_LOG_LEVEL"), "warning");
  EXPECT_FALSE(parse({"-np", "1", "--config-file", path.c_str(), "--gloo", "true"}).mpi);
  for (const char* bad : {"params:\n  fusion_treshold_mb: 32\n", "tuning:\n  x: 1\n",
                          "params:\n  cycle_time_ms: -1\n", "controller: nccl\n",
                          "stall_check:\n  enabled: maybe\n"}) {
    std::ofstream(path) << bad;
    try {
      parse({"-np", "1", "--config-file", path.c_str(), "true"});
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error&) {
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Options, StartTimeoutFromTheEnvironment) {
  ::setenv("HOROVOD_START_TIMEOUT", "45", 1);
  EXPECT_EQ(parse({"-np", "1", "true"}).start_timeout_s, 45.0);
  EXPECT_EQ(parse({"-np", "1", "--start-timeout", "9", "true"}).start_timeout_s, 9.0);
  ::setenv("HOROVOD_START_TIMEOUT", "soon", 1);
  EXPECT_THROW(parse({"-np", "1", "true"}), Error);
  ::unsetenv("HOROVOD_START_TIMEOUT");
  EXPECT_EQ(parse({"-np", "1", "true"}).start_timeout_s, 30.0);
}

TEST(Options, SeveralNetworkInterfaces) {
  ::unsetenv("NCCL_SOCKET_IFNAME");
  for (const auto& args :
       {std::vector<const char*>{"-np", "1", "--network-interface", "eth1", "--network-interface",
                                 "eth2", "true"},
        std::vector<const char*>{"-np", "1", "--network-interfaces", "eth1,eth2", "true"}}) {
    auto o = parse(args);
    EXPECT_EQ(o.network_interface, "eth1");
    EXPECT_EQ(o.knob_env.at("KRUG_GLOO_IFACE"), "eth1");
    EXPECT_EQ(o.knob_env.at("NCCL_SOCKET_IFNAME"), "eth1,eth2");
  }
}

TEST(Options, ElasticFlags) {
  // The cooldown range takes two values: -np after it is still krugrun's.
  auto o = parse({"--host-discovery-script", "/bin/true", "--blacklist-cooldown-range", "10", "20",
                  "-np", "2", "true"});
  EXPECT_EQ(o.np, 2);
  ASSERT_TRUE(o.elastic.cooldown_range.has_value());
  EXPECT_EQ(o.elastic.cooldown_range->second, 20.0);
  // Fixed hosts with --min-np: horovodrun's elastic job on them, through a discovery script
  // that prints them.
  auto fixed = parse({"--min-np", "1", "-H", "localhost:2,127.0.0.1:1", "-np", "2", "true"});
  EXPECT_TRUE(fixed.hosts.empty());
  auto found = parse_discovery_output(
      run_discovery_script(fixed.elastic.discovery_script, std::chrono::seconds(30)),
      fixed.elastic.discovery_script, 1);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].host + ":" + std::to_string(found[0].slots), "localhost:2");
  EXPECT_EQ(found[1].host + ":" + std::to_string(found[1].slots), "127.0.0.1:1");
  EXPECT_THROW(parse({"--min-np", "1", "-H", "a:1", "--host-discovery-script", "true", "true"}),
               Error);
  // Elastic settings without a discovery script would be ignored: refused instead.
  EXPECT_THROW(parse({"-np", "1", "--reset-limit", "3", "true"}), Error);
  EXPECT_THROW(parse({"-np", "1", "--blacklist-cooldown-range", "5", "1", "true"}), Error);
}

TEST(Options, HierarchicalAllreduceFlags) {
  EXPECT_EQ(parse({"-np", "4", "--hierarchical-allreduce", "true"})
                .knob_env.at("KRUG_HIERARCHICAL_ALLREDUCE"),
            "1");
  EXPECT_EQ(parse({"-np", "4", "--no-hierarchical-allreduce", "true"})
                .knob_env.at("KRUG_HIERARCHICAL_ALLREDUCE"),
            "0");
  EXPECT_EQ(parse({"-np", "4", "true"}).knob_env.count("KRUG_HIERARCHICAL_ALLREDUCE"), 0u);
  EXPECT_THROW(
      parse({"-np", "4", "--hierarchical-allreduce", "--no-hierarchical-allreduce", "true"}),
      Error);
}

TEST(Options, EncryptFlagAndEnvironmentBothMakeTheJobEncrypt) {
  const auto encrypted = parse({"-np", "2", "--encrypt", "true"});
  EXPECT_EQ(encrypted.knob_env.at("KRUG_ENCRYPT"), "1");
  EXPECT_EQ(job_protection(encrypted), net::Protection::kEncrypt);
  EXPECT_EQ(job_protection(parse({"-np", "2", "true"})), net::Protection::kAuthenticate);
  ::setenv("KRUG_ENCRYPT", "yes", 1);
  const auto from_env = parse({"-np", "2", "true"});
  ::unsetenv("KRUG_ENCRYPT");
  EXPECT_EQ(from_env.knob_env.at("KRUG_ENCRYPT"), "1");  // so that every rank gets it
  EXPECT_EQ(job_protection(from_env), net::Protection::kEncrypt);
}

TEST(Options, UsageErrors) {
  EXPECT_THROW(parse({"true"}), Error);                                  // no -np
  EXPECT_THROW(parse({"-np", "2"}), Error);                              // no command
  EXPECT_THROW(parse({"-np", "0", "true"}), Error);
  EXPECT_THROW(parse({"-np", "3", "-H", "localhost:2", "true"}), Error);
  EXPECT_THROW(parse({"-np", "1", "-H", "localhost:x", "true"}), Error);
  EXPECT_THROW(parse({"-np", "1", "--bogus", "true"}), Error);
  EXPECT_THROW(parse({"-np", "1", "-x", "1BAD=2", "true"}), Error);
  EXPECT_THROW(parse({"-np", "1", "--log-level", "loud", "true"}), Error);
  EXPECT_THROW(parse({"-np", "1", "--cycle-time-ms", "-1", "true"}), Error);
}

TEST(RankEnv, LauncherVariablesWinOverInheritedOnes) {
  LaunchOptions o;
  o.knob_env["KRUG_CYCLE_TIME"] = "5";
  o.set_env = {{"FOO", "bar"}, {"KRUG_CYCLE_TIME", "6"}};
  RankSlot slot{3, 4, 1, 2, 1, 2, "localhost"};
  JobInfo job{"127.0.0.1", 1234, "s3cret", "abcd1234", ""};
  EnvMap env = rank_environment({{"PATH", "/bin"}, {"KRUG_RANK", "99"}}, o, slot, job);
  EXPECT_EQ(env["PATH"], "/bin");
  EXPECT_EQ(env["FOO"], "bar");
  EXPECT_EQ(env["KRUG_CYCLE_TIME"], "6");
  EXPECT_EQ(env["KRUG_RANK"], "3");
  EXPECT_EQ(env["HOROVOD_RANK"], "3");
  EXPECT_EQ(env["KRUG_SIZE"], "4");
  EXPECT_EQ(env["HOROVOD_LOCAL_RANK"], "1");
  EXPECT_EQ(env["HOROVOD_LOCAL_SIZE"], "2");
  EXPECT_EQ(env["HOROVOD_CROSS_RANK"], "1");
  EXPECT_EQ(env["KRUG_CROSS_SIZE"], "2");
  EXPECT_EQ(env["HOROVOD_HOSTNAME"], "localhost");
  EXPECT_EQ(env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], "127.0.0.1");
  EXPECT_EQ(env["KRUG_RENDEZVOUS_PORT"], "1234");
  EXPECT_EQ(env["KRUG_SECRET"], "s3cret");
  EXPECT_EQ(env["KRUG_JOB_ID"], "abcd1234");
  EXPECT_EQ(env["HOROVOD_CONTROLLER"], "gloo");
  EXPECT_EQ(env.count("HOROVOD_CPU_OPERATIONS"), 0u) << "would force the data plane";
  EXPECT_EQ(make_job_id().size(), 8u);
}

TEST(RankEnv, PrependsTheBuildTreePythonDirToPythonPath) {
  LaunchOptions o;
  RankSlot slot{0, 1, 0, 1, 0, 1, "localhost"};
  JobInfo job{"127.0.0.1", 1234, "s3cret", "abcd1234", ""};
  EXPECT_EQ(rank_environment({}, o, slot, job).count("PYTHONPATH"), 0u);
  job.python_dir = "/b/python";
  EXPECT_EQ(rank_environment({}, o, slot, job)["PYTHONPATH"], "/b/python");
  EXPECT_EQ(rank_environment({{"PYTHONPATH", "/x:/y"}}, o, slot, job)["PYTHONPATH"],
            "/b/python:/x:/y");
  o.set_env = {{"PYTHONPATH", "/z"}};
  EXPECT_EQ(rank_environment({{"PYTHONPATH", "/x"}}, o, slot, job)["PYTHONPATH"], "/b/python:/z");
}

TEST(LineBuffer, EmitsWholePrefixedLines) {
  LineBuffer lines("[1]<stdout>:");
  std::string out;
  lines.feed("hel", out);
  EXPECT_EQ(out, "");
  lines.feed("lo\nwor", out);
  EXPECT_EQ(out, "[1]<stdout>:hello\n");
  lines.feed("ld\n\nx", out);
  EXPECT_EQ(out, "[1]<stdout>:hello\n[1]<stdout>:world\n[1]<stdout>:\n");
  out.clear();
  lines.finish(out);
  EXPECT_EQ(out, "[1]<stdout>:x\n");
  out.clear();
  lines.finish(out);  // nothing left
  EXPECT_EQ(out, "");
  EXPECT_EQ(output_prefix(12, true), "[12]<stderr>:");
}

TEST(LineBuffer, SplitsOverlongLines) {
  LineBuffer lines("");
  std::string out;
  lines.feed(std::string(LineBuffer::kMaxLine + 5, 'a'), out);
  EXPECT_EQ(out, std::string(LineBuffer::kMaxLine, 'a') + "\n");
  out.clear();
  lines.finish(out);
  EXPECT_EQ(out, "aaaaa\n");
}

}  // namespace
}  // namespace krug::run
