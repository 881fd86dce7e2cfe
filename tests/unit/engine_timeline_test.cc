// The timeline started and stopped while the engine runs (Engine::start_timeline /
// stop_timeline, Horovod's hvd.start_timeline / hvd.stop_timeline), with ranks as threads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "krug/types.h"

namespace krug::engine {
namespace {

using controller::OpType;
using nlohmann::json;
using namespace testing;
namespace fs = std::filesystem;

// Trace files unique to the running test, removed afterwards.
class EngineTimeline : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("krug_engine_timeline_" + std::to_string(getpid()) + "_" + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

// The whole file as JSON: a trace that does not parse fails the test here.
json read_trace(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "no file " << path;
  std::stringstream text;
  text << in.rdbuf();
  json trace = json::parse(text.str());
  EXPECT_TRUE(trace.is_array()) << path;
  return trace;
}

// Row number -> tensor name, from the "process_name" metadata events.
std::map<int, std::string> rows(const json& trace) {
  std::map<int, std::string> out;
  for (const json& e : trace)
    if (e.at("ph") == "M" && e.at("name") == "process_name")
      out[e.at("pid").get<int>()] = e.at("args").at("name").get<std::string>();
  return out;
}

// The names of the phases recorded for `tensor` ("ALLREDUCE", "NEGOTIATE_ALLREDUCE", ...).
std::set<std::string> phases_of(const json& trace, const std::string& tensor) {
  const auto names = rows(trace);
  std::set<std::string> out;
  for (const json& e : trace) {
    if (e.at("ph") != "B") continue;
    auto row = names.find(e.at("pid").get<int>());
    if (row != names.end() && row->second == tensor) out.insert(e.at("name").get<std::string>());
  }
  return out;
}

// Every end has its begin, per row and phase, and nothing is left open.
void expect_balanced(const json& trace) {
  std::map<std::pair<int, std::string>, int> open;
  for (const json& e : trace) {
    const auto key = std::make_pair(e.at("pid").get<int>(), e.at("name").get<std::string>());
    if (e.at("ph") == "B") ++open[key];
    if (e.at("ph") == "E") {
      ASSERT_GT(open[key], 0) << "an end without a begin: " << e.dump();
      --open[key];
    }
  }
  for (const auto& [key, n] : open) EXPECT_EQ(n, 0) << "left open: " << key.second;
}

size_t cycle_markers(const json& trace) {
  size_t n = 0;
  for (const json& e : trace) n += e.at("ph") == "i" && e.at("name") == "CYCLE_START";
  return n;
}

void allreduce(Engine& e, const std::string& name, int rank) {
  std::vector<float> data(8, float(rank));
  expect_ok(submit(e, request(name, OpType::kAllreduce, DataType::kFloat32, {8}), data.data(),
                   data.data()));
}

void allgather(Engine& e, const std::string& name, int rank) {
  std::vector<int32_t> data(rank + 1, rank);
  expect_ok(submit(e, request(name, OpType::kAllgather, DataType::kInt32, {rank + 1}), data.data(),
                   nullptr));
}

TEST_F(EngineTimeline, StartStopAndStartAgainToASecondFile) {
  const std::string first = path("first.json"), second = path("second.json");
  run_ranks(2, [&](Engine& e, int rank) {
    // A cached name (steady state) before the timeline runs: after the start it must still show.
    for (int step = 0; step < 3; ++step) allreduce(e, "steady", rank);
    // Rank 1's path: only rank 0 writes a timeline.
    e.start_timeline(rank == 0 ? first : path("rank1.json"), /*mark_cycles=*/true);
    for (int step = 0; step < 3; ++step) allreduce(e, "steady", rank);
    allgather(e, "first.gather", rank);
    e.stop_timeline();
    e.stop_timeline();  // nothing runs: nothing to do
    e.start_timeline(rank == 0 ? second : path("rank1.json"), /*mark_cycles=*/false);
    allreduce(e, "second.reduce", rank);
    e.stop_timeline();
  });
  EXPECT_FALSE(fs::exists(path("rank1.json")));

  const json a = read_trace(first);
  EXPECT_TRUE(phases_of(a, "steady").count("NEGOTIATE_ALLREDUCE"));
  EXPECT_TRUE(phases_of(a, "steady").count("ALLREDUCE"));
  EXPECT_TRUE(phases_of(a, "first.gather").count("NEGOTIATE_ALLGATHER"));
  EXPECT_TRUE(phases_of(a, "first.gather").count("ALLGATHER"));
  EXPECT_TRUE(phases_of(a, "second.reduce").empty());
  EXPECT_GT(cycle_markers(a), 0u);
  expect_balanced(a);

  const json b = read_trace(second);
  EXPECT_TRUE(phases_of(b, "second.reduce").count("NEGOTIATE_ALLREDUCE"));
  EXPECT_TRUE(phases_of(b, "second.reduce").count("ALLREDUCE"));
  EXPECT_TRUE(phases_of(b, "first.gather").empty());
  EXPECT_EQ(cycle_markers(b), 0u);
  expect_balanced(b);
}

// An operation rank 0 submitted before the start is decided after it: its NEGOTIATE phase began
// on no timeline, so the new one must not end it.
TEST_F(EngineTimeline, OperationsInNegotiationAtTheStartLeaveNoUnmatchedEnd) {
  const std::string file = path("trace.json");
  std::latch started(1);
  run_ranks(2, [&](Engine& e, int rank) {
    std::vector<float> data(4, 1.0f);
    const auto q = request("early", OpType::kAllreduce, DataType::kFloat32, {4});
    if (rank == 0) {
      auto h = submit(e, q, data.data(), data.data());
      // Submitted after "early", so once it has run "early" was taken in too (in order).
      allreduce(e, "sync", rank);
      e.start_timeline(file, false);
      started.count_down();
      expect_ok(h);
    } else {
      allreduce(e, "sync", rank);
      started.wait();
      expect_ok(submit(e, q, data.data(), data.data()));
    }
    e.stop_timeline();
  });
  const json trace = read_trace(file);
  EXPECT_EQ(phases_of(trace, "early"), (std::set<std::string>{"QUEUE", "ALLREDUCE"}));
  expect_balanced(trace);
}

// KRUG_TIMELINE's file is closed, complete, when a start names another; a start naming the
// file being written goes on writing it (Horovod's behaviour for both).
TEST_F(EngineTimeline, StartWhileRunningSwitchesFilesOrContinuesTheSame) {
  const std::string from_env = path("env.json"), next = path("next.json");
  run_ranks(
      2,
      [&](Engine& e, int rank) {
        allreduce(e, "env.op", rank);
        e.start_timeline(next, false);
        allreduce(e, "next.op1", rank);
        e.start_timeline(next, true);  // the same file: no truncation
        allreduce(e, "next.op2", rank);
      },
      [&](Config& c) { c.timeline_path = from_env; });
  // run_ranks shut the engines down: that closes the running timeline too.
  const json env = read_trace(from_env);
  EXPECT_TRUE(phases_of(env, "env.op").count("ALLREDUCE"));
  EXPECT_TRUE(phases_of(env, "next.op1").empty());
  const json trace = read_trace(next);
  EXPECT_TRUE(phases_of(trace, "env.op").empty());
  EXPECT_TRUE(phases_of(trace, "next.op1").count("ALLREDUCE"));
  EXPECT_TRUE(phases_of(trace, "next.op2").count("ALLREDUCE"));
  EXPECT_GT(cycle_markers(trace), 0u) << "the second start's mark_cycles applies";
}

TEST_F(EngineTimeline, DynamicMeansNoFileUntilStarted) {
  const std::string file = path("later.json");
  run_ranks(
      1,
      [&](Engine& e, int rank) {
        allreduce(e, "before", rank);
        e.start_timeline(file, false);
        allreduce(e, "after", rank);
      },
      [](Config& c) { c.timeline_path = "DYNAMIC"; });
  EXPECT_FALSE(fs::exists("DYNAMIC"));
  const json trace = read_trace(file);
  EXPECT_TRUE(phases_of(trace, "before").empty());
  EXPECT_TRUE(phases_of(trace, "after").count("ALLREDUCE"));
}

TEST_F(EngineTimeline, UnwritableOrEmptyPathIsAnInvalidArgumentAndKeepsTheRunningOne) {
  const std::string file = path("kept.json");
  const std::string bad = path("no-such-dir/trace.json");
  run_ranks(1, [&](Engine& e, int rank) {
    e.start_timeline(file, false);
    try {
      e.start_timeline(bad, false);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find(bad), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("rank 0"), std::string::npos) << error.what();
    }
    EXPECT_THROW(e.start_timeline("", false), InvalidArgument);
    allreduce(e, "still.recorded", rank);
    e.stop_timeline();
  });
  EXPECT_TRUE(phases_of(read_trace(file), "still.recorded").count("ALLREDUCE"));
}

// Starts and stops from another thread while the ranks run collectives: every file is a
// complete trace, and no operation is disturbed.
TEST_F(EngineTimeline, StartAndStopFromAnotherThreadWhileOperationsRun) {
  std::atomic<int> files{0};
  run_ranks(2, [&](Engine& e, int rank) {
    std::atomic<bool> done{false};
    std::thread toggler;
    if (rank == 0)
      toggler = std::thread([&] {
        while (!done) {
          const int i = files++;
          e.start_timeline(path("t" + std::to_string(i % 4) + ".json"), i % 2 == 0);
          std::this_thread::yield();
          if (i % 3 == 0) e.stop_timeline();
        }
      });
    // Steps on the direct lane take a microsecond: 2000 of them may end before the toggler runs.
    while (files.load() == 0) std::this_thread::yield();
    for (int step = 0; step < 2000; ++step) {
      allreduce(e, "grad" + std::to_string(step % 7), rank);
      if (step % 100 == 0) allgather(e, "gather" + std::to_string(step), rank);
    }
    done = true;
    if (toggler.joinable()) toggler.join();
  });
  ASSERT_GT(files.load(), 0);
  for (int i = 0; i < std::min(files.load(), 4); ++i)
    read_trace(path("t" + std::to_string(i) + ".json"));
}

}  // namespace
}  // namespace krug::engine
