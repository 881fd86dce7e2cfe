// The autotuner's parts without an engine: the Gaussian process, expected improvement, the
// optimizer on known functions, and the sampling state machine with a synthetic clock.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "krug/types.h"
#include "observe/autotuner.h"
#include "observe/bayesian_optimizer.h"

namespace krug::observe {
namespace {

using namespace std::chrono_literals;

TEST(GaussianProcess, InterpolatesItsSamplesAndIsUnsureFarFromThem) {
  GaussianProcess gp(1e-4);
  const std::vector<Point> x{{0.1}, {0.4}, {0.9}};
  const std::vector<double> y{3.0, -1.0, 2.0};
  gp.fit(x, y);
  for (size_t i = 0; i < x.size(); ++i) {
    const auto p = gp.predict(x[i]);
    EXPECT_NEAR(p.mean, y[i], 0.05) << i;
    EXPECT_LT(p.variance, 0.05) << i;
  }
  EXPECT_GT(gp.predict({0.65}).variance, 10 * gp.predict({0.4}).variance);
}

TEST(ExpectedImprovement, GrowsWithMeanAndUncertainty) {
  EXPECT_NEAR(expected_improvement(1.0, 0.0, 2.0, 0.0), 0.0, 1e-12);  // certain and worse
  EXPECT_NEAR(expected_improvement(3.0, 0.0, 2.0, 0.0), 1.0, 1e-12);  // certain and better
  EXPECT_GT(expected_improvement(1.0, 1.0, 2.0, 0.0), 0.0);          // unsure: worth a look
  EXPECT_GT(expected_improvement(2.0, 1.0, 2.0, 0.0), expected_improvement(1.0, 1.0, 2.0, 0.0));
  EXPECT_GT(expected_improvement(1.0, 4.0, 2.0, 0.0), expected_improvement(1.0, 1.0, 2.0, 0.0));
}

TEST(ExpectedImprovement, IsNearZeroAtTheSampledMaximumAndPositiveWhereTheModelIsUnsure) {
  GaussianProcess gp(1e-6);
  const std::vector<Point> x{{0.0}, {0.2}, {0.5}, {0.55}, {0.6}};
  std::vector<double> y;
  for (const auto& p : x) y.push_back(std::sin(3 * p[0]));  // largest sampled at 0.5
  gp.fit(x, y);
  const double best = gp.predict({0.5}).mean;
  EXPECT_NEAR(best, std::sin(1.5), 1e-3);
  const auto at = [&](double v) {
    const auto p = gp.predict({v});
    return expected_improvement(p.mean, p.variance, best, 0.0);
  };
  EXPECT_LT(at(0.5), 1e-3);
  EXPECT_GT(at(0.9), 10 * at(0.5));  // unsampled, where the model cannot rule out a higher value
  EXPECT_LT(at(0.0), at(0.9));       // sampled and low
}

// A peaked function on the unit square, maximum 1 at (0.7, 0.3).
double peak(const Point& p) {
  return std::exp(-(std::pow(p[0] - 0.7, 2) + std::pow(p[1] - 0.3, 2)) / 0.05);
}

double optimize(uint64_t seed, int budget, double noise_sd) {
  BayesianOptimizer bo(2, noise_sd > 0 ? 0.1 : 1e-4, seed);
  std::mt19937_64 rng(seed + 99);
  std::normal_distribution<double> noise(0, noise_sd);
  for (int i = 0; i < budget; ++i) {
    const Point x = bo.next();
    bo.add_sample(x, peak(x) + (noise_sd > 0 ? noise(rng) : 0));
  }
  return peak(bo.best());
}

double random_search(uint64_t seed, int budget) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  double best = 0;
  for (int i = 0; i < budget; ++i) best = std::max(best, peak({u(rng), u(rng)}));
  return best;
}

TEST(BayesianOptimizer, FindsThePeakAndBeatsRandomSearchWithTheSameBudget) {
  double bo_total = 0, random_total = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const double found = optimize(seed, 20, 0.0);
    EXPECT_GT(found, 0.8) << "seed " << seed;
    bo_total += found;
    random_total += random_search(seed, 20);
  }
  EXPECT_GT(bo_total, random_total);
}

TEST(BayesianOptimizer, StillLandsNearThePeakWithNoisySamples) {
  double total = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) total += optimize(seed, 25, 0.1);
  EXPECT_GT(total / 8, 0.6);
}

TEST(BayesianOptimizer, IsDeterministicForASeed) {
  BayesianOptimizer a(2, 0.1, 7), b(2, 0.1, 7);
  for (int i = 0; i < 8; ++i) {
    const Point pa = a.next(), pb = b.next();
    ASSERT_EQ(pa, pb) << i;
    a.add_sample(pa, peak(pa));
    b.add_sample(pb, peak(pb));
  }
}

TEST(BayesianOptimizer, SearchesEachLevelOfADiscreteDimension) {
  // The peak on both levels of a switch, 40% lower on one: whichever level is better, the
  // optimizer must find the peak there.
  int found = 0;
  for (double good : {0.0, 1.0})
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      auto objective = [&](const Point& p) { return peak(p) * (p[2] == good ? 1.0 : 0.6); };
      BayesianOptimizer bo({0, 0, 2}, 1e-4, seed);
      for (int i = 0; i < 20; ++i) {
        const Point x = bo.next();
        ASSERT_TRUE(x[2] == 0.0 || x[2] == 1.0) << x[2];
        bo.add_sample(x, objective(x));
      }
      const Point best = bo.best();
      found += best[2] == good && peak(best) > 0.8;
    }
  EXPECT_GE(found, 9);
}

TEST(BayesianOptimizer, RejectsBadSpacesAndPoints) {
  EXPECT_THROW(BayesianOptimizer(0, 0.1, 1), krug::Error);
  EXPECT_THROW(BayesianOptimizer(2, 0.0, 1), krug::Error);
  EXPECT_THROW(BayesianOptimizer(std::vector<int>{0, 1}, 0.1, 1), krug::Error);
  BayesianOptimizer bo(2, 0.1, 1);
  EXPECT_THROW(bo.add_sample({0.5}, 1.0), krug::Error);
  EXPECT_THROW(bo.add_sample({0.5, 1.5}, 1.0), krug::Error);
  EXPECT_THROW(bo.add_sample({0.5, 0.5}, std::nan("")), krug::Error);
  EXPECT_THROW(bo.best(), krug::Error);
}

// Throughput of a synthetic job: best at 32 MiB fusion and 2 ms cycles (log distance).
double synthetic_throughput(const TunedParameters& p) {
  const double f = std::log2(static_cast<double>(p.fusion_threshold_bytes) / (32 << 20));
  const double c = std::log2(p.cycle_time_ms / 2.0);
  return 1e9 * std::exp(-(f * f + c * c) / 8);
}

// Drives the tuner like the engine: `steps_per_sample` cycles per sample, each moving a fixed
// number of bytes in a time given by the current parameters' throughput.
struct TuningRun {
  std::vector<std::string> log;
  std::vector<TunedParameters> applied;
  TunedParameters final{};
  int cycles = 0;
};

TuningRun drive(const AutotuneOptions& options, int max_cycles) {
  TuningRun run;
  Autotuner tuner({64 << 20, 5.0}, options, [&](const std::string& l) { run.log.push_back(l); });
  auto now = std::chrono::steady_clock::time_point{};
  const int64_t bytes = 100 << 20;
  for (; run.cycles < max_cycles && !tuner.settled(); ++run.cycles) {
    now += std::chrono::nanoseconds(
        static_cast<int64_t>(1e9 * static_cast<double>(bytes) / synthetic_throughput(tuner.current())));
    if (auto changed = tuner.observe(bytes, now)) run.applied.push_back(*changed);
  }
  run.final = tuner.current();
  return run;
}

TEST(Autotuner, SettlesWithinTheSampleBudgetNearTheBestParameters) {
  AutotuneOptions options;
  options.warmup_samples = 2;
  options.steps_per_sample = 5;
  options.max_samples = 20;
  const TuningRun run = drive(options, 10000);
  // (2 warmup + 20 scored samples) x (5 cycles + 1 opening the window)
  EXPECT_EQ(run.cycles, 22 * 6);
  ASSERT_FALSE(run.log.empty());
  EXPECT_EQ(run.log.front(), "sample,fusion_threshold_bytes,cycle_time_ms,bytes_per_second,best_so_far");
  int warmups = 0, samples = 0;
  for (const auto& l : run.log) {
    warmups += l.rfind("warmup,", 0) == 0;
    samples += !l.empty() && std::isdigit(static_cast<unsigned char>(l[0]));
  }
  EXPECT_EQ(warmups, 2);
  EXPECT_EQ(samples, 20);
  EXPECT_EQ(run.log.back().rfind("settled,", 0), 0u) << run.log.back();
  EXPECT_GT(synthetic_throughput(run.final), 0.7 * 1e9)
      << run.final.fusion_threshold_bytes << " bytes, " << run.final.cycle_time_ms << " ms";
  for (const auto& p : run.applied) {
    EXPECT_GE(p.fusion_threshold_bytes, options.min_fusion_bytes);
    EXPECT_LE(p.fusion_threshold_bytes, options.max_fusion_bytes);
    EXPECT_GE(p.cycle_time_ms, options.min_cycle_ms);
    EXPECT_LE(p.cycle_time_ms, options.max_cycle_ms);
  }
  EXPECT_GE(run.applied.size(), 10u) << "it should explore";
}

TEST(Autotuner, KeepsItsChoiceOnceSettled) {
  AutotuneOptions options;
  options.warmup_samples = 0;
  options.steps_per_sample = 1;
  options.max_samples = 4;
  Autotuner tuner({1 << 20, 1.0}, options);
  auto now = std::chrono::steady_clock::time_point{};
  for (int i = 0; i < 8; ++i) tuner.observe(1 << 20, now += 1ms);
  ASSERT_TRUE(tuner.settled());
  const TunedParameters chosen = tuner.current();
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(tuner.observe(1 << 20, now += 1ms).has_value());
  EXPECT_EQ(tuner.current(), chosen);
}

TEST(Autotuner, RejectsEmptyRanges) {
  AutotuneOptions options;
  options.max_fusion_bytes = options.min_fusion_bytes;
  EXPECT_THROW(Autotuner({1 << 20, 1.0}, options), krug::Error);
  options = {};
  options.max_samples = 0;
  EXPECT_THROW(Autotuner({1 << 20, 1.0}, options), krug::Error);
}

}  // namespace
}  // namespace krug::observe
