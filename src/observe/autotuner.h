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
// Hierarchical allreduce is not tuned: turning it on or off changes how float sums are
// associated, and krug keeps that a function of the topology only (docs/architecture.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "observe/bayesian_optimizer.h"

namespace krug::observe {

struct TunedParameters {
  int64_t fusion_threshold_bytes;
  double cycle_time_ms;
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
  uint64_t seed = 1;
};

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

 private:
  Point to_unit(const TunedParameters& p) const;
  TunedParameters from_unit(const Point& x) const;
  void emit(const std::string& line) const;

  AutotuneOptions options_;
  Log log_;
  BayesianOptimizer optimizer_;
  TunedParameters current_;
  bool settled_ = false;
  int warmups_left_;
  int scored_ = 0;
  double best_score_ = 0;
  // The sample in progress.
  int steps_ = 0;
  int64_t bytes_ = 0;
  std::optional<std::chrono::steady_clock::time_point> sample_start_;
};

}  // namespace krug::observe
