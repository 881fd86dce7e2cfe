#include "observe/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "krug/types.h"

namespace krug::observe {
namespace {

using nlohmann::json;
using Clock = Timeline::Clock;

// A trace file unique to the running test, removed afterwards.
class TimelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (std::filesystem::temp_directory_path() /
             ("krug_timeline_" + std::to_string(getpid()) + "_" + info->name() + ".json"))
                .string();
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::string read_file() const {
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  std::string path_;
};

std::vector<json> events_with(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace)
    if (e.at("ph") == ph) out.push_back(e);
  return out;
}

TEST_F(TimelineTest, EmptyTimelineIsAnEmptyArray) {
  { Timeline timeline(path_); }
  const json trace = json::parse(read_file());
  ASSERT_TRUE(trace.is_array());
  EXPECT_TRUE(trace.empty());
}

TEST_F(TimelineTest, UnopenablePathThrowsNamingIt) {
  const std::string bad = "/nonexistent-krug-dir/trace.json";
  try {
    Timeline timeline(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

TEST_F(TimelineTest, ConcurrentWritersProduceAValidTrace) {
  constexpr int kThreads = 4, kTensorsPerThread = 3, kRounds = 200;
  // Each writer owns its tensors, as the engine's background loop does; one name needs escaping.
  auto tensor_name = [](int thread, int k) {
    if (thread == 0 && k == 0) return std::string("a\"b\\c");
    if (thread == 1 && k == 0) return std::string("grad/layer.0\n\tü");
    return "t" + std::to_string(thread) + "_" + std::to_string(k);
  };
  std::set<std::string> tensors;
  for (int t = 0; t < kThreads; ++t)
    for (int k = 0; k < kTensorsPerThread; ++k) tensors.insert(tensor_name(t, k));

  int cycles = 0;
  {
    Timeline timeline(path_);
    std::vector<std::thread> writers;
    for (int t = 0; t < kThreads; ++t) {
      writers.emplace_back([&, t] {
        for (int round = 0; round < kRounds; ++round) {
          for (int k = 0; k < kTensorsPerThread; ++k) {
            const std::string name = tensor_name(t, k);
            timeline.begin(name, "NEGOTIATE_ALLREDUCE", Clock::now(),
                           "{\"round\":" + std::to_string(round) + "}");
            timeline.end(name, "NEGOTIATE_ALLREDUCE", Clock::now());
            timeline.begin(name, "ALLREDUCE", Clock::now());
            timeline.instant(name, "FUSED", Clock::now());
            timeline.end(name, "ALLREDUCE", Clock::now());
          }
          if (t == 0) {
            timeline.mark_cycle(Clock::now());
            ++cycles;
          }
        }
      });
    }
    for (auto& w : writers) w.join();
  }

  const json trace = json::parse(read_file());
  ASSERT_TRUE(trace.is_array());
  const int per_tensor_pairs = 2 * kRounds;
  const size_t n_tensors = tensors.size();

  // One row per tensor, plus the cycle row; names round-trip through escaping.
  std::map<int, std::string> row_name;
  for (const json& m : events_with(trace, "M")) {
    EXPECT_EQ(m.at("name"), "process_name");
    const int pid = m.at("pid");
    EXPECT_TRUE(row_name.emplace(pid, m.at("args").at("name").get<std::string>()).second)
        << "row named twice: " << pid;
  }
  ASSERT_EQ(row_name.size(), n_tensors + 1);
  std::set<std::string> named;
  for (const auto& [pid, name] : row_name)
    if (name != "cycles") named.insert(name);
  EXPECT_EQ(named, tensors);

  EXPECT_EQ(events_with(trace, "B").size(), n_tensors * per_tensor_pairs);
  EXPECT_EQ(events_with(trace, "E").size(), n_tensors * per_tensor_pairs);

  // Per row: B/E nest and close, names match, ts never goes back, metadata comes first.
  std::map<int, std::vector<std::string>> open;
  std::map<int, int64_t> last_ts;
  std::map<int, int> instants;
  int cycle_marks = 0;
  for (const json& e : trace) {
    const int pid = e.at("pid");
    EXPECT_EQ(e.at("tid"), 0);
    const std::string ph = e.at("ph");
    if (ph == "M") {
      EXPECT_FALSE(last_ts.count(pid)) << "row named after its first event";
      continue;
    }
    ASSERT_TRUE(row_name.count(pid)) << "event on an unnamed row " << pid;
    const int64_t ts = e.at("ts");
    if (last_ts.count(pid)) {
      EXPECT_GE(ts, last_ts[pid]) << "row " << row_name[pid];
    }
    last_ts[pid] = ts;
    const std::string name = e.at("name");
    if (ph == "B") {
      open[pid].push_back(name);
      if (name == "NEGOTIATE_ALLREDUCE") {
        EXPECT_TRUE(e.at("args").contains("round"));
      } else {
        EXPECT_FALSE(e.contains("args"));
      }
    } else if (ph == "E") {
      ASSERT_FALSE(open[pid].empty()) << "E without B on " << row_name[pid];
      EXPECT_EQ(open[pid].back(), name);
      open[pid].pop_back();
    } else if (ph == "i") {
      if (name == "CYCLE_START") {
        EXPECT_EQ(row_name[pid], "cycles");
        ++cycle_marks;
      } else {
        EXPECT_EQ(name, "FUSED");
        ++instants[pid];
      }
    } else {
      ADD_FAILURE() << "unexpected phase " << ph;
    }
  }
  for (const auto& [pid, stack] : open) EXPECT_TRUE(stack.empty()) << row_name[pid];
  EXPECT_EQ(cycle_marks, cycles);
  EXPECT_EQ(instants.size(), n_tensors);
  for (const auto& [pid, count] : instants) EXPECT_EQ(count, kRounds) << row_name[pid];
}

TEST_F(TimelineTest, FlushWritesEverythingQueuedSoFar) {
  Timeline timeline(path_);
  const auto t0 = Clock::now();
  timeline.begin("x", "ALLREDUCE", t0, "{\"bytes\":4}");
  timeline.end("x", "ALLREDUCE", t0 + std::chrono::milliseconds(3));
  timeline.flush();
  // Still open (no closing bracket yet), but every event is on disk.
  const json trace = json::parse(read_file() + "]");
  ASSERT_EQ(trace.size(), 3u);
  EXPECT_EQ(trace[1].at("args").at("bytes"), 4);
  EXPECT_EQ(trace[2].at("ts").get<int64_t>() - trace[1].at("ts").get<int64_t>(), 3000);
}

TEST_F(TimelineTest, MalformedArgsCannotCorruptTheFile) {
  {
    Timeline timeline(path_);
    timeline.begin("x", "ALLREDUCE", Clock::now(), "not json\"}");
    timeline.end("x", "ALLREDUCE", Clock::now());
  }
  const json trace = json::parse(read_file());
  ASSERT_EQ(trace.size(), 3u);
  EXPECT_EQ(trace[1].at("args").at("raw"), "not json\"}");
}

}  // namespace
}  // namespace krug::observe
