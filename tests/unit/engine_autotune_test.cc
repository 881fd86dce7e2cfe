// The autotuner inside the engine: ranks as threads run real steps with KRUG_AUTOTUNE on; the
// coordinator samples, logs every sample, settles within the budget, and every rank ends up
// applying the same fusion threshold and cycle time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace krug::engine {
namespace {

using controller::OpType;
using namespace testing;

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(EngineAutotune, SettlesWithinTheBudgetAndEveryRankAppliesTheSameParameters) {
  const std::string log =
      (std::filesystem::temp_directory_path() / ("krug-autotune-" + std::to_string(::getpid()) +
                                                 ".csv"))
          .string();
  constexpr int kRanks = 3, kSteps = 400;
  std::vector<std::pair<int64_t, double>> applied(kRanks);
  run_ranks(
      kRanks,
      [&](Engine& e, int rank) {
        std::vector<float> grads(4 * 1000);
        for (int step = 0; step < kSteps; ++step) {
          // A step: four gradients submitted together, as a backward pass would.
          std::vector<std::shared_ptr<HandleState>> handles;
          for (int t = 0; t < 4; ++t) {
            std::fill(grads.begin() + t * 1000, grads.begin() + (t + 1) * 1000, float(rank + t));
            handles.push_back(submit(e, request("grad." + std::to_string(t), OpType::kAllreduce,
                                                DataType::kFloat32, {1000}),
                                     grads.data() + t * 1000, grads.data() + t * 1000));
          }
          for (auto& h : handles) expect_ok(h);
          ASSERT_EQ(grads[2000], float(2 * kRanks + kRanks * (kRanks - 1) / 2));
        }
        applied[rank] = e.tuned_parameters();
      },
      [&](Config& c) {
        c.autotune = true;
        c.autotune_log = log;
        c.autotune_warmup_samples = 1;
        c.autotune_steps_per_sample = 3;
        c.autotune_max_samples = 6;
      });
  const auto lines = read_lines(log);
  std::filesystem::remove(log);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.front(), "sample,fusion_threshold_bytes,cycle_time_ms,hierarchical,bytes_per_second,best_so_far");
  int warmups = 0, samples = 0, settled = 0;
  for (const auto& l : lines) {
    warmups += l.rfind("warmup,", 0) == 0;
    samples += std::isdigit(static_cast<unsigned char>(l[0])) != 0;
    settled += l.rfind("settled,", 0) == 0;
  }
  EXPECT_EQ(warmups, 1);
  EXPECT_EQ(samples, 6);
  ASSERT_EQ(settled, 1);
  // The settled line names the parameters every rank applies at the end.
  const std::string expected = "settled," + std::to_string(applied[0].first) + ",";
  EXPECT_EQ(lines.back().rfind(expected, 0), 0u) << lines.back();
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(applied[r], applied[0]) << "rank " << r;
  EXPECT_GE(applied[0].first, int64_t{1} << 20);
  EXPECT_LE(applied[0].first, int64_t{256} << 20);
  EXPECT_GE(applied[0].second, 0.2);
  EXPECT_LE(applied[0].second, 20.0);
}

TEST(EngineAutotune, OffByDefaultTheConfiguredKnobsStay) {
  run_ranks(2, [](Engine& e, int) {
    std::vector<float> x(10, 1.0f);
    for (int i = 0; i < 50; ++i)
      expect_ok(submit(e, request("x", OpType::kAllreduce, DataType::kFloat32, {10}), x.data(),
                       x.data()));
    EXPECT_EQ(e.tuned_parameters(), (std::pair<int64_t, double>{e.config().fusion_threshold_bytes,
                                                                 e.config().cycle_time.count()}));
    EXPECT_EQ(e.tuned_parameters().first, 128 * 1024 * 1024);
  });
}

}  // namespace
}  // namespace krug::engine
