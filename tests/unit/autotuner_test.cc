// The autotuner's parts without an engine: the Gaussian process, expected improvement, the
// optimizer on known functions, and the sampling state machine with a synthetic clock.
#include "observe/autotuner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "krug/types.h"
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
  EXPECT_GT(expected_improvement(1.0, 1.0, 2.0, 0.0), 0.0);           // unsure: worth a look
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
// number of bytes in a time given by the current parameters' throughput, stretched by `noise`
// (a factor per cycle; 1 for none).
struct TuningRun {
  std::vector<std::string> log;
  std::vector<TunedParameters> applied;
  std::vector<AutotuneSample> samples;
  TunedParameters final{};
  int cycles = 0;
};

TuningRun drive(
    const AutotuneOptions& options, int max_cycles,
    const std::function<double(const TunedParameters&)>& throughput = synthetic_throughput,
    const std::function<double()>& noise = [] { return 1.0; }) {
  TuningRun run;
  Autotuner tuner({64 << 20, 5.0}, options, [&](const std::string& l) { run.log.push_back(l); });
  auto now = std::chrono::steady_clock::time_point{};
  const int64_t bytes = 100 << 20;
  for (; run.cycles < max_cycles && !tuner.settled(); ++run.cycles) {
    const double seconds = static_cast<double>(bytes) / throughput(tuner.current()) * noise();
    now += std::chrono::nanoseconds(static_cast<int64_t>(1e9 * seconds));
    if (auto changed = tuner.observe(bytes, now)) run.applied.push_back(*changed);
  }
  run.samples = tuner.samples();
  run.final = tuner.current();
  return run;
}

// A noisy machine: each sample's cycles run up to 40% faster or slower (another job on the
// host), each cycle another 40% either way, and one cycle in 20 stalls for 5x its time.
std::function<double()> noisy_machine(uint64_t seed, int cycles_per_sample) {
  auto rng = std::make_shared<std::mt19937_64>(seed);
  auto state = std::make_shared<std::pair<int, double>>(0, 1.0);  // cycle count, sample factor
  return [=] {
    std::uniform_real_distribution<double> u(-0.4, 0.4), p(0, 1);
    if (state->first++ % cycles_per_sample == 0) state->second = 1 + u(*rng);
    return state->second * (1 + u(*rng)) * (p(*rng) < 0.05 ? 5.0 : 1.0);
  };
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
  EXPECT_EQ(run.log.front(), autotune_log_header());
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

TEST(Autotuner, LogLinesHaveOneColumnPerFieldAndAFinalSettledLine) {
  EXPECT_EQ(autotune_log_header(),
            "sample,fusion_threshold_bytes,cycle_time_ms,hierarchical,bytes_per_second,"
            "best_so_far");
  EXPECT_EQ(autotune_log_line({false, 7, {33554432, 2.5, true}, 1.23456789e9, true}),
            "7,33554432,2.5,1,1234567890,best");
  EXPECT_EQ(autotune_log_line({false, 8, {1048576, 0.2, false}, 5e8, false}),
            "8,1048576,0.2,0,500000000,");
  EXPECT_EQ(autotune_log_line({true, 1, {1048576, 0.2, false}, 5e8, false}),
            "warmup,1048576,0.2,0,500000000,");
  EXPECT_EQ(autotune_settled_line({2097152, 1.25, false}, 20),
            "settled,2097152,1.25,0,,after 20 samples");
}

TEST(Autotuner, DiscardsWarmupThenSwitchesToTheOptimizersPointAfterEverySample) {
  AutotuneOptions options;
  options.warmup_samples = 3;
  options.steps_per_sample = 4;
  options.max_samples = 12;
  const TuningRun run = drive(options, 10000);
  ASSERT_EQ(run.samples.size(), 15u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(run.samples[i].warmup);
    EXPECT_FALSE(run.samples[i].best_so_far);
    EXPECT_EQ(run.samples[i].parameters, (TunedParameters{64 << 20, 5.0}))
        << "warmup keeps the start";
  }
  // Every line after the header is a sample's, in order, and then the settled line.
  ASSERT_EQ(run.log.size(), 1 + 15 + 1u);
  for (size_t i = 0; i < run.samples.size(); ++i)
    EXPECT_EQ(run.log[i + 1], autotune_log_line(run.samples[i]));
  // Each scored sample after the first measures the parameters the previous one switched to.
  size_t switched = 0;
  for (int i = 4; i < 15; ++i) {
    EXPECT_EQ(run.samples[i].index, i - 2);
    if (run.samples[i].parameters != run.samples[i - 1].parameters) {
      ASSERT_LT(switched, run.applied.size());
      EXPECT_EQ(run.samples[i].parameters, run.applied[switched++]) << i;
    }
  }
  EXPECT_GE(switched, 9u) << "it should move after (nearly) every sample";
  // best_so_far marks exactly the running maxima.
  double best = 0;
  for (const auto& s : run.samples) {
    if (s.warmup) continue;
    EXPECT_EQ(s.best_so_far, s.bytes_per_second > best) << s.index;
    best = std::max(best, s.bytes_per_second);
  }
}

TEST(Autotuner, IsDeterministicForASeed) {
  AutotuneOptions options;
  options.warmup_samples = 1;
  options.steps_per_sample = 3;
  options.max_samples = 10;
  const TuningRun a = drive(options, 10000, synthetic_throughput, noisy_machine(5, 3));
  const TuningRun b = drive(options, 10000, synthetic_throughput, noisy_machine(5, 3));
  EXPECT_EQ(a.log, b.log);
  options.seed = 2;
  EXPECT_NE(drive(options, 10000, synthetic_throughput, noisy_machine(5, 3)).log, a.log);
}

TEST(Autotuner, SettlesNearTheOptimumOnANoisyMachine) {
  AutotuneOptions options;
  options.warmup_samples = 2;
  options.steps_per_sample = 10;
  options.max_samples = 20;
  int near = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    options.seed = seed;
    const TuningRun run =
        drive(options, 10000, synthetic_throughput, noisy_machine(seed * 7919, 11));
    ASSERT_EQ(run.samples.size(), 22u);
    ASSERT_EQ(run.log.back().rfind("settled,", 0), 0u);
    // Within 30% of the best throughput: log2 distance < 1.7 from (32 MiB, 2 ms).
    near += synthetic_throughput(run.final) > 0.7e9;
  }
  EXPECT_GE(near, 7);
}

TEST(Autotuner, TunesHierarchicalOnlyWhenAsked) {
  // Hierarchical allreduce 40% faster than flat, whatever the other knobs.
  auto throughput = [](const TunedParameters& p) {
    return synthetic_throughput(p) * (p.hierarchical ? 1.0 : 0.6);
  };
  AutotuneOptions options;
  options.warmup_samples = 0;
  options.steps_per_sample = 2;
  options.max_samples = 20;
  const TuningRun fixed = drive(options, 10000, throughput);
  for (const auto& s : fixed.samples) EXPECT_FALSE(s.parameters.hierarchical);
  EXPECT_FALSE(fixed.final.hierarchical);
  options.tune_hierarchical = true;
  int chose = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    options.seed = seed;
    const TuningRun tuned = drive(options, 10000, throughput);
    chose += tuned.final.hierarchical && throughput(tuned.final) > 0.7e9;
  }
  EXPECT_GE(chose, 3);
}

TEST(Autotuner, KeepsEveryChoiceInsideRangesOffTheRoundingGrid) {
  AutotuneOptions options;
  options.min_fusion_bytes = 1500;  // not whole KiB: rounds down to 1024
  options.max_fusion_bytes = 1000000;
  options.min_cycle_ms = 0.104;  // not whole hundredths: rounds down to 0.1
  options.max_cycle_ms = 0.996;
  options.warmup_samples = 0;
  options.steps_per_sample = 1;
  options.max_samples = 25;
  // Best at the corners of the box, where rounding would step outside.
  const TuningRun run = drive(options, 10000, [](const TunedParameters& p) {
    return 1e9 / (static_cast<double>(p.fusion_threshold_bytes) * p.cycle_time_ms);
  });
  ASSERT_FALSE(run.applied.empty());
  for (const auto& p : run.applied) {
    EXPECT_GE(p.fusion_threshold_bytes, 1500);
    EXPECT_LE(p.fusion_threshold_bytes, 1000000);
    EXPECT_GE(p.cycle_time_ms, 0.104);
    EXPECT_LE(p.cycle_time_ms, 0.996);
  }
}

}  // namespace
}  // namespace krug::observe
