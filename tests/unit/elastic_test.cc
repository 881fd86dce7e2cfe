// Elastic training's pure parts: the driver/worker codecs, round planning, the host blacklist,
// straggler detection, readiness statistics and the discovery script's output.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "controller/readiness_stats.h"
#include "krug/types.h"
#include "rendezvous/elastic_protocol.h"
#include "run/cli/options.h"
#include "run/elastic/discovery.h"
#include "run/elastic/plan.h"

namespace krug {
namespace {

namespace el = rendezvous::elastic;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(ElasticProtocol, AssignmentRoundTrips) {
  el::Assignment a;
  a.round = 7;
  a.rank = 2;
  a.size = 5;
  a.local_rank = 1;
  a.local_size = 2;
  a.cross_rank = 1;
  a.cross_size = 3;
  a.hostname = "node-3.example";
  a.has_new_workers = true;
  a.hosts_version = 11;
  const el::Assignment b = el::decode_assignment(el::encode(a));
  EXPECT_EQ(b.round, 7);
  EXPECT_EQ(b.rank, 2);
  EXPECT_EQ(b.size, 5);
  EXPECT_EQ(b.local_rank, 1);
  EXPECT_EQ(b.local_size, 2);
  EXPECT_EQ(b.cross_rank, 1);
  EXPECT_EQ(b.cross_size, 3);
  EXPECT_EQ(b.hostname, "node-3.example");
  EXPECT_TRUE(b.has_new_workers);
  EXPECT_EQ(b.hosts_version, 11);
  EXPECT_FALSE(b.removed);
}

TEST(ElasticProtocol, RemovalCarriesItsReason) {
  el::Assignment a;
  a.removed = "host h left the discovery script's output";
  const auto b = el::decode_assignment(el::encode(a));
  ASSERT_TRUE(b.removed);
  EXPECT_EQ(*b.removed, *a.removed);
}

TEST(ElasticProtocol, MalformedTextIsNamed) {
  EXPECT_THROW(el::decode_assignment("round=1 rank=x"), Error);
  EXPECT_THROW(el::decode_assignment("round=1 rank=3 size=2 local_rank=0 local_size=1 "
                                     "cross_rank=0 cross_size=1 host=h new_workers=0 "
                                     "hosts_version=0"),
               Error);  // rank >= size
  try {
    el::decode_hosts_version("version=2");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("last_addition"), std::string::npos);
  }
}

TEST(ElasticProtocol, HostsVersionAndHealthRoundTrip) {
  const auto h = el::decode_hosts_version(el::encode(el::HostsVersion{5, 3}));
  EXPECT_EQ(h.version, 5);
  EXPECT_EQ(h.last_addition, 3);
  el::Health health{2000000, 40, 19, {0, 15, 900000}};
  const auto back = el::decode_health(el::encode(health));
  EXPECT_EQ(back.elapsed_us, 2000000);
  EXPECT_EQ(back.tensors, 40);
  EXPECT_EQ(back.steps, 19);
  EXPECT_EQ(back.lateness_us, (std::vector<int64_t>{0, 15, 900000}));
}

TEST(ElasticProtocol, KeysAreDistinctPerWorkerAndSequence) {
  EXPECT_NE(el::join_key("w1", 0), el::join_key("w1", 1));
  EXPECT_NE(el::join_key("w1", 0), el::join_key("w10", 0));
  EXPECT_NE(el::join_key("w1", 0), el::assign_key("w1", 0));
  EXPECT_EQ(el::health_key(3), el::round_prefix(3) + "/health");
}

TEST(ElasticPlan, SurvivorsKeepTheirOrderAndNewWorkersFollow) {
  std::vector<run::RoundMember> members{{"w5", "b", 0, std::nullopt},
                                        {"w2", "a", 1, 3},
                                        {"w0", "a", 0, 1},
                                        {"w6", "a", 2, std::nullopt}};
  const auto plan = run::plan_round(members, {"a", "b"}, 4, 9);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan.at("w0").rank, 0);  // lowest surviving rank becomes rank 0
  EXPECT_EQ(plan.at("w2").rank, 1);
  EXPECT_EQ(plan.at("w6").rank, 2);  // new: host a before host b
  EXPECT_EQ(plan.at("w5").rank, 3);
  for (const auto& [id, a] : plan) {
    EXPECT_EQ(a.size, 4);
    EXPECT_EQ(a.round, 4);
    EXPECT_EQ(a.hosts_version, 9);
    EXPECT_TRUE(a.has_new_workers);
  }
  EXPECT_EQ(plan.at("w0").local_rank, 0);
  EXPECT_EQ(plan.at("w2").local_rank, 1);
  EXPECT_EQ(plan.at("w6").local_rank, 2);
  EXPECT_EQ(plan.at("w6").local_size, 3);
  EXPECT_EQ(plan.at("w5").local_rank, 0);
  EXPECT_EQ(plan.at("w5").local_size, 1);
  // Local rank 0 exists on both hosts: cross ranks 0 (host a) and 1 (host b).
  EXPECT_EQ(plan.at("w0").cross_rank, 0);
  EXPECT_EQ(plan.at("w5").cross_rank, 1);
  EXPECT_EQ(plan.at("w5").cross_size, 2);
  EXPECT_EQ(plan.at("w6").cross_size, 1);
}

TEST(ElasticPlan, NoNewWorkersWhenEveryoneSurvived) {
  const auto plan = run::plan_round({{"w0", "a", 0, 1}, {"w1", "a", 1, 0}}, {"a"}, 1, 0);
  EXPECT_EQ(plan.at("w1").rank, 0);
  EXPECT_EQ(plan.at("w0").rank, 1);
  EXPECT_FALSE(plan.at("w0").has_new_workers);
}

TEST(HostBlacklist, CooldownExpiresAndGrowsWithRepeatedFailures) {
  run::HostBlacklist list(std::make_pair(2.0, 4.0), 42);
  const auto t0 = Clock::now();
  const auto first = list.add("h", t0);
  ASSERT_TRUE(first);
  EXPECT_GE(*first, 2.0);
  EXPECT_LE(*first, 4.0);
  EXPECT_TRUE(list.blocked("h", t0 + 1s));
  EXPECT_FALSE(list.blocked("h", t0 + 5s));
  EXPECT_FALSE(list.blocked("other", t0));
  const auto second = list.add("h", t0 + 10s);
  ASSERT_TRUE(second);
  EXPECT_GE(*second, 4.0);  // doubled
  EXPECT_LE(*second, 8.0);
}

TEST(HostBlacklist, WithoutARangeItIsForever) {
  run::HostBlacklist list(std::nullopt);
  const auto t0 = Clock::now();
  EXPECT_FALSE(list.add("h", t0));
  EXPECT_TRUE(list.blocked("h", t0 + std::chrono::hours(1000)));
}

// A report after `steps` steps of equal length, `elapsed_us` in all.
el::Health health(int64_t steps, int64_t elapsed_us, std::vector<int64_t> lateness) {
  return el::Health{elapsed_us, steps * 2, steps, std::move(lateness)};
}

TEST(Straggler, FoundWhenTheOthersWaitLongEnough) {
  // Steps of 150 ms, of which the others wait 100 ms for rank 2: it is 3x slower.
  const auto from = health(10, 1'500'000, {0, 0, 0});
  const auto to = health(30, 4'500'000, {1000, 2000, 2'000'000});
  const auto s = run::find_straggler(from, to, 1.5, 20);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rank, 2);
  EXPECT_NEAR(s->lateness_s, 0.1, 1e-9);
  EXPECT_NEAR(s->period_s, 0.15, 1e-9);
  EXPECT_NEAR(s->slowdown, 3.0, 1e-9);
  EXPECT_EQ(s->steps, 20);
}

TEST(Straggler, WaitsLongerThanTheStepsAreCappedNotInfinite) {
  const auto s =
      run::find_straggler(health(0, 0, {0, 0}), health(20, 2'000'000, {0, 2'500'000}), 2, 20);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rank, 1);
  EXPECT_NEAR(s->slowdown, 1000, 1e-6);
}

TEST(Straggler, NotBelowTheFactorNorBeforeTheWindow) {
  const auto from = health(0, 0, {0, 0});
  // 20 ms of 150 ms: 1.15x slower.
  EXPECT_FALSE(run::find_straggler(from, health(20, 3'000'000, {0, 400'000}), 1.5, 20));
  EXPECT_TRUE(run::find_straggler(from, health(20, 3'000'000, {0, 400'000}), 1.1, 20));
  // Slow enough, but only 5 steps seen.
  EXPECT_FALSE(run::find_straggler(from, health(5, 750'000, {0, 500'000}), 1.5, 20));
  // Off.
  EXPECT_FALSE(run::find_straggler(from, health(20, 3'000'000, {0, 2'000'000}), 0, 20));
}

TEST(ReadinessStats, LatenessIsWallTimeWaitedAndStepsCountOneName) {
  controller::ReadinessStats stats(3);
  const auto t0 = Clock::now();
  for (int step = 0; step < 5; ++step) {
    const auto start = t0 + step * 150ms;
    // Two tensors per step; rank 2 submits both 100 ms after the others (one wait, not two).
    stats.observe("a", {start, start + 1ms, start + 100ms});
    stats.observe("b", {start + 2ms, start + 3ms, start + 101ms});
  }
  EXPECT_EQ(stats.tensors(), 10);
  EXPECT_EQ(stats.steps(), 4);  // intervals between consecutive readiness of one name
  EXPECT_EQ(stats.elapsed_us(t0 + 1s), 1'000'000);
  EXPECT_EQ(stats.lateness_us()[0], 0);
  // Rank 1 is the median; rank 2 keeps the others waiting from 1 ms to 101 ms of every step.
  EXPECT_EQ(stats.lateness_us()[2], 5 * 100'000);
  EXPECT_EQ(stats.lateness_us()[1], 0);
}

TEST(ReadinessStats, TwoRanksBlameTheLaterOne) {
  controller::ReadinessStats stats(2);
  const auto t0 = Clock::now();
  stats.observe("x", {t0 + 30ms, t0});
  EXPECT_EQ(stats.lateness_us()[0], 30'000);
  EXPECT_EQ(stats.lateness_us()[1], 0);
}

TEST(Discovery, ParsesHostsSlotsCommentsAndDefaults) {
  const auto hosts =
      run::parse_discovery_output("# comment\nnode1:4\n\n  node2  \n10.0.0.3:2\r\n", "disc.sh", 3);
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "node1");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[1].host, "node2");
  EXPECT_EQ(hosts[1].slots, 3);
  EXPECT_EQ(hosts[2].host, "10.0.0.3");
  EXPECT_EQ(hosts[2].slots, 2);
  EXPECT_TRUE(run::parse_discovery_output("", "disc.sh", 1).empty());
}

TEST(Discovery, BadLinesAreNamed) {
  for (const char* bad : {"node:0\n", "node:x\n", "a:1\na:2\n", ":3\n", "node:2 3\n"}) {
    try {
      run::parse_discovery_output(bad, "disc.sh", 1);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("disc.sh"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("line"), std::string::npos) << e.what();
    }
  }
}

TEST(Discovery, RunsTheScriptAndReportsFailures) {
  EXPECT_EQ(run::run_discovery_script("printf 'a:1\\nb:2\\n'", 10s), "a:1\nb:2\n");
  try {
    run::run_discovery_script("echo broken >&2; exit 3", 10s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("status 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("broken"), std::string::npos) << e.what();
  }
  const auto t0 = Clock::now();
  // Killed at its deadline: without that the script would run for 10 minutes.
  EXPECT_THROW(run::run_discovery_script("sleep 600", 300ms), Error);
  EXPECT_LT(Clock::now() - t0, 300s);
}

}  // namespace
}  // namespace krug

namespace krug::run {
namespace {

std::variant<LaunchOptions, int> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "krugrun");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

TEST(ElasticOptions, FlagsAndDefaults) {
  auto r = parse({"-np",
                  "4",
                  "--min-np",
                  "2",
                  "--max-np",
                  "6",
                  "--host-discovery-script",
                  "./disc.sh",
                  "--blacklist-cooldown-range",
                  "5",
                  "10",
                  "--reset-limit",
                  "3",
                  "--straggler-factor",
                  "1.5",
                  "--straggler-window",
                  "30",
                  "--elastic-timeout",
                  "60",
                  "python3",
                  "train.py"});
  ASSERT_TRUE(std::holds_alternative<LaunchOptions>(r));
  const auto& o = std::get<LaunchOptions>(r);
  EXPECT_TRUE(o.elastic.enabled());
  EXPECT_EQ(o.np, 4);
  EXPECT_EQ(o.elastic.min_np, 2);
  EXPECT_EQ(o.elastic.max_np, 6);
  ASSERT_TRUE(o.elastic.cooldown_range);
  EXPECT_EQ(o.elastic.cooldown_range->first, 5);
  EXPECT_EQ(o.elastic.cooldown_range->second, 10);
  EXPECT_EQ(o.elastic.reset_limit, 3);
  EXPECT_EQ(o.elastic.straggler_factor, 1.5);
  EXPECT_EQ(o.elastic.straggler_window, 30);
  EXPECT_EQ(o.elastic.elastic_timeout_s, 60);
  EXPECT_EQ(o.command, (std::vector<std::string>{"python3", "train.py"}));
  // --min-np defaults to -np, -np to --min-np.
  auto d = parse({"-np", "3", "--host-discovery-script", "./disc.sh", "prog"});
  EXPECT_EQ(std::get<LaunchOptions>(d).elastic.min_np, 3);
  auto m = parse({"--min-np", "2", "--host-discovery-script", "./disc.sh", "prog"});
  EXPECT_EQ(std::get<LaunchOptions>(m).np, 2);
}

TEST(ElasticOptions, ContradictionsAreUsageErrors) {
  EXPECT_EQ(std::get<int>(parse({"-np", "2", "--min-np", "2", "prog"})), 2);  // no script
  EXPECT_EQ(std::get<int>(parse({"-np", "2", "-H", "a:2", "--host-discovery-script", "d", "prog"})),
            2);
  EXPECT_EQ(std::get<int>(
                parse({"--min-np", "4", "--max-np", "2", "--host-discovery-script", "d", "prog"})),
            2);
  EXPECT_EQ(std::get<int>(parse({"-np", "2", "--host-discovery-script", "d",
                                 "--blacklist-cooldown-range", "9", "3", "prog"})),
            2);
  EXPECT_EQ(std::get<int>(parse(
                {"-np", "2", "--host-discovery-script", "d", "--straggler-factor", "0.5", "prog"})),
            2);
}

}  // namespace
}  // namespace krug::run
