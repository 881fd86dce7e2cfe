// The autotuner: tunes the engine's two knobs, the fusion threshold and the cycle time, online,
// on the bytes per second that real steps move.
//
// A pure state machine (time is passed in): the coordinator's engine reports every cycle that
// executed collectives; a sample is `steps_per_sample` such cycles, scored by bytes over wall
// time (compute between steps included, so the score is the job's real throughput). The first
// `warmup_samples` are discarded (caches, allocators and the response cache settle), then each
// sample is fed to a Bayesian optimizer (observe/bayesian_optimizer.h) that picks the next
// parameters, until `max_samples` have been scored; the best parameters are then fixed.
//
// Hierarchical allreduce is tuned only with `tune_hierarchical` (off by default): turning it on
// or off changes how float sums are associated, and krug keeps that a function of the topology
// only (docs/architecture.md), so the engine leaves it fixed and the log just records it.
//
// Robustness against noisy machines (step times vary by tens of percent): a sample spans many
// cycles and is scored as their total bytes over their total time (a ratio of sums, so the
// cycles of a step, which are not alike, are weighed as the job weighs them); the Gaussian
// process has a noise term; and the settled choice is the sampled point of highest posterior
// mean, which a single lucky sample cannot win on its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "observe/bayesian_optimizer.h"

namespace krug::observe {

struct TunedParameters {
  int64_t fusion_threshold_bytes;
  double cycle_time_ms;
  bool hierarchical = false;  // hierarchical allreduce in force (tuned with tune_hierarchical)
  bool operator==(const TunedParameters&) const = default;
};

struct AutotuneOptions {
  int64_t min_fusion_bytes = int64_t{1} << 20;
  int64_t max_fusion_bytes = int64_t{256} << 20;
  double min_cycle_ms = 0.2;
  double max_cycle_ms = 20.0;
  int warmup_samples = 3;
  int steps_per_sample = 10;
  int max_samples = 20;
  double noise = 0.8;  // observation noise variance, relative to the spread of the scores
  bool tune_hierarchical = false;
  uint64_t seed = 1;
};

// One measured sample, as the log shows it.
struct AutotuneSample {
  bool warmup;  // discarded, not given to the optimizer
  int index;    // 1, 2, ... for scored samples; 1, 2, ... among warmups for warmups
  TunedParameters parameters;
  double bytes_per_second;
  bool best_so_far;  // the highest score yet (never for a warmup)
};

// The log, CSV: a header, one line per sample, then one line for the settled choice.
std::string autotune_log_header();
std::string autotune_log_line(const AutotuneSample& sample);
std::string autotune_settled_line(const TunedParameters& chosen, int samples);

class Autotuner {
 public:
  // `log` receives one line per event: a header, each sample, the settled choice.
  using Log = std::function<void(const std::string& line)>;
  Autotuner(TunedParameters start, const AutotuneOptions& options, Log log = {});

  // A cycle that executed collectives moving `bytes`, ending at `now`. Returns the parameters
  // to apply from now on when they change.
  std::optional<TunedParameters> observe(int64_t bytes, std::chrono::steady_clock::time_point now);

  const TunedParameters& current() const { return current_; }
  bool settled() const { return settled_; }
  int scored_samples() const { return scored_; }
  // Every sample so far, warmups included (at most warmup_samples + max_samples).
  const std::vector<AutotuneSample>& samples() const { return samples_; }

 private:
  Point to_unit(const TunedParameters& p) const;
  TunedParameters from_unit(const Point& x) const;
  void emit(const std::string& line) const;
  void record(const AutotuneSample& sample);

  AutotuneOptions options_;
  Log log_;
  BayesianOptimizer optimizer_;
  TunedParameters current_;
  bool settled_ = false;
  int warmups_left_;
  int scored_ = 0;
  double best_score_ = 0;
  std::vector<AutotuneSample> samples_;
  // The sample in progress.
  int steps_ = 0;
  int64_t bytes_ = 0;
  std::optional<std::chrono::steady_clock::time_point> sample_start_;
};

}  // namespace krug::observe
