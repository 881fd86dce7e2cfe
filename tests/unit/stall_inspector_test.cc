// The stall inspector over a real negotiator, on time points the test chooses: when it looks
// again, what it reports and tells the other ranks, and when it stops the job.
#include "engine/stall_inspector.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace krug::engine {
namespace {

using namespace std::chrono_literals;
using controller::Stall;

class RecordingKnobs : public EngineKnobs {
 public:
  void retune(int64_t, double) override {}
  void stop(const std::string& reason) override { stopped = reason; }
  void announce_stalls(std::vector<Stall> stalls) override { announced.push_back(stalls); }

  std::string stopped;
  std::vector<std::vector<Stall>> announced;
};

std::vector<std::string> names(const std::vector<Stall>& stalls) {
  std::vector<std::string> out;
  for (const auto& s : stalls) out.push_back(s.name);
  return out;
}

// Two ranks; check time 1 s, no shutdown unless a test sets one.
class StallInspectorTest : public ::testing::Test {
 protected:
  StallInspectorTest() {
    config_.size = 2;
    config_.stall_check_time = Seconds(1);
  }

  // `rank` submits an allreduce of `name` at t0 + `at`; what every rank submitted leaves.
  void submit(int rank, const std::string& name, Clock::duration at) {
    controller::Request q;
    q.name = name;
    q.shape = {4};
    controller::RequestList list;
    list.rank = rank;
    list.requests = {q};
    negotiator_.add(list, t0_ + at);
    negotiator_.compute();
  }
  void cycle(Clock::duration at) { inspector_.on_cycle(t0_ + at, negotiator_.readiness()); }
  Clock::duration wake() const { return *inspector_.wake_at() - t0_; }

  Config config_;
  controller::ResponseCache cache_{16};
  controller::Negotiator negotiator_{2, 1 << 20, cache_};
  RecordingKnobs knobs_;
  StallInspector inspector_{config_, negotiator_, knobs_};
  const Clock::time_point t0_ = Clock::now();
};

// Rank 1 leaves a collective early: rank 0 waits in 'b' from 0.4 s, rank 1 in 'c' from 0.5 s.
// Each is reported once it has waited the check time, not at the next period's check.
TEST_F(StallInspectorTest, ReportsEachOperationOnceItHasWaitedTheCheckTime) {
  submit(0, "a", 0ms);
  cycle(0ms);
  EXPECT_EQ(wake(), 1s);
  submit(1, "a", 400ms);
  submit(0, "b", 400ms);
  submit(1, "c", 500ms);
  cycle(1s);  // 'a' completed; 'b' has waited 0.6 s
  EXPECT_TRUE(knobs_.announced.empty());
  EXPECT_EQ(wake(), 1400ms);

  cycle(1400ms);
  ASSERT_EQ(knobs_.announced.size(), 1u);
  ASSERT_EQ(names(knobs_.announced[0]), std::vector<std::string>{"b"});
  EXPECT_EQ(knobs_.announced[0][0].missing_ranks, std::vector<int32_t>{1});
  EXPECT_EQ(knobs_.announced[0][0].ready_ranks, std::vector<int32_t>{0});
  EXPECT_EQ(wake(), 1500ms);  // when 'c' has waited 1 s

  cycle(1500ms);  // a new stall is reported at once, with the one before
  ASSERT_EQ(knobs_.announced.size(), 2u);
  EXPECT_EQ(names(knobs_.announced[1]), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(knobs_.announced[1][1].missing_ranks, std::vector<int32_t>{0});
  EXPECT_EQ(wake(), 2500ms);  // then once per check time

  cycle(2400ms);
  EXPECT_EQ(knobs_.announced.size(), 2u);
  cycle(2500ms);
  EXPECT_EQ(knobs_.announced.size(), 3u);
  EXPECT_TRUE(knobs_.stopped.empty());
}

TEST_F(StallInspectorTest, StopsWhenTheOldestHasWaitedTheShutdownTime) {
  config_.stall_shutdown_time = Seconds(3);
  submit(0, "b", 400ms);
  cycle(400ms);
  submit(1, "c", 500ms);
  for (int i = 0; i < 10 && knobs_.stopped.empty(); ++i) {
    ASSERT_LE(wake(), 3400ms);
    cycle(wake());
  }
  EXPECT_EQ(wake(), 3400ms);  // the last look, at the limit itself
  EXPECT_NE(knobs_.stopped.find("stalled for more than 3 s (KRUG_STALL_SHUTDOWN_TIME_SECONDS)"),
            std::string::npos)
      << knobs_.stopped;
  EXPECT_NE(knobs_.stopped.find("allreduce 'b' (process set 0): waiting 3 s for ranks [1]"),
            std::string::npos)
      << knobs_.stopped;
  EXPECT_NE(knobs_.stopped.find("allreduce 'c' (process set 0): waiting 3 s for ranks [0]"),
            std::string::npos)
      << knobs_.stopped;
}

TEST_F(StallInspectorTest, NothingPendingNothingToWakeFor) {
  EXPECT_FALSE(inspector_.wake_at().has_value());
  submit(0, "a", 0ms);
  submit(1, "a", 10ms);
  cycle(10ms);
  EXPECT_FALSE(inspector_.wake_at().has_value());
  EXPECT_TRUE(knobs_.announced.empty());
}

// A rank the coordinator tells of stalls logs those it waits in or is waited for in.
TEST(StallReportTest, ARankLogsTheStallsItTakesPartIn) {
  const std::vector<Stall> stalls = {
      {.name = "b",
       .process_set = 0,
       .ready_ranks = {0},
       .missing_ranks = {1},
       .waited_seconds = 1},
      {.name = "s",
       .process_set = 1,
       .ready_ranks = {2},
       .missing_ranks = {3},
       .waited_seconds = 1},
  };
  testing::internal::CaptureStderr();
  log_stalls_of_rank(1, 1.0, stalls);
  log_stalls_of_rank(4, 1.0, stalls);
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("[krug warning rank 1] stalled operations"), std::string::npos) << out;
  EXPECT_NE(
      out.find("allreduce 'b' (process set 0): waiting 1 s for ranks [1]; ready on ranks [0]"),
      std::string::npos)
      << out;
  EXPECT_EQ(out.find("'s'"), std::string::npos) << out;
  EXPECT_EQ(out.find("rank 4"), std::string::npos) << out;
}

}  // namespace
}  // namespace krug::engine
