#include "observe/autotuner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "krug/types.h"

namespace krug::observe {
namespace {

double unit_log(double v, double lo, double hi) {
  return std::clamp(std::log(v / lo) / std::log(hi / lo), 0.0, 1.0);
}
double from_unit_log(double u, double lo, double hi) {
  return lo * std::pow(hi / lo, u);
}

std::vector<int> space(const AutotuneOptions& options) {
  // Fusion threshold and cycle time continuous; hierarchical on/off when tuned.
  return options.tune_hierarchical ? std::vector<int>{0, 0, 2} : std::vector<int>{0, 0};
}

}  // namespace

std::string autotune_log_header() {
  return "sample,fusion_threshold_bytes,cycle_time_ms,hierarchical,bytes_per_second,best_so_far";
}

std::string autotune_log_line(const AutotuneSample& s) {
  return fmt::format("{},{},{},{},{:.0f},{}", s.warmup ? "warmup" : std::to_string(s.index),
                     s.parameters.fusion_threshold_bytes, s.parameters.cycle_time_ms,
                     s.parameters.hierarchical ? 1 : 0, s.bytes_per_second,
                     s.best_so_far ? "best" : "");
}

std::string autotune_settled_line(const TunedParameters& chosen, int samples) {
  return fmt::format("settled,{},{},{},,after {} samples", chosen.fusion_threshold_bytes,
                     chosen.cycle_time_ms, chosen.hierarchical ? 1 : 0, samples);
}

Autotuner::Autotuner(TunedParameters start, const AutotuneOptions& options, Log log)
    : options_(options),
      log_(std::move(log)),
      optimizer_(space(options), options.noise, options.seed),
      current_(start),
      warmups_left_(options.warmup_samples) {
  if (options_.min_fusion_bytes <= 0 || options_.max_fusion_bytes <= options_.min_fusion_bytes)
    throw Error(fmt::format("autotune: the fusion threshold range {}..{} bytes is empty",
                            options_.min_fusion_bytes, options_.max_fusion_bytes));
  if (!(options_.min_cycle_ms > 0) || options_.max_cycle_ms <= options_.min_cycle_ms)
    throw Error(fmt::format("autotune: the cycle time range {}..{} ms is empty",
                            options_.min_cycle_ms, options_.max_cycle_ms));
  if (options_.steps_per_sample < 1 || options_.max_samples < 1 || options_.warmup_samples < 0)
    throw Error(
        "autotune: steps per sample and max samples must be at least 1, warmup samples "
        "at least 0");
  emit(autotune_log_header());
}

void Autotuner::emit(const std::string& line) const {
  if (log_) log_(line);
}

void Autotuner::record(const AutotuneSample& sample) {
  samples_.push_back(sample);
  emit(autotune_log_line(sample));
}

Point Autotuner::to_unit(const TunedParameters& p) const {
  Point x{unit_log(static_cast<double>(p.fusion_threshold_bytes),
                   static_cast<double>(options_.min_fusion_bytes),
                   static_cast<double>(options_.max_fusion_bytes)),
          unit_log(p.cycle_time_ms, options_.min_cycle_ms, options_.max_cycle_ms)};
  if (options_.tune_hierarchical) x.push_back(p.hierarchical ? 1.0 : 0.0);
  return x;
}

TunedParameters Autotuner::from_unit(const Point& x) const {
  const double fusion = from_unit_log(x[0], static_cast<double>(options_.min_fusion_bytes),
                                      static_cast<double>(options_.max_fusion_bytes));
  const double cycle = from_unit_log(x[1], options_.min_cycle_ms, options_.max_cycle_ms);
  // Whole KiB and 0.01 ms: readable in the log, and as fine as either knob matters; clamped
  // again because rounding may step outside a range whose ends are not on that grid.
  TunedParameters p{
      std::clamp(static_cast<int64_t>(std::llround(fusion / 1024)) * 1024,
                 options_.min_fusion_bytes, options_.max_fusion_bytes),
      std::clamp(std::round(cycle * 100) / 100, options_.min_cycle_ms, options_.max_cycle_ms),
      current_.hierarchical};
  if (options_.tune_hierarchical) p.hierarchical = x[2] > 0.5;
  return p;
}

std::optional<TunedParameters> Autotuner::observe(int64_t bytes,
                                                  std::chrono::steady_clock::time_point now) {
  if (settled_) return std::nullopt;
  if (!sample_start_) {
    // The first cycle only opens the window: its own duration began before the parameters did.
    sample_start_ = now;
    return std::nullopt;
  }
  bytes_ += bytes;
  if (++steps_ < options_.steps_per_sample) return std::nullopt;
  const double seconds = std::chrono::duration<double>(now - *sample_start_).count();
  const double score = seconds > 0 ? static_cast<double>(bytes_) / seconds : 0;
  steps_ = 0;
  bytes_ = 0;
  sample_start_.reset();
  if (warmups_left_ > 0) {
    --warmups_left_;
    record({true, options_.warmup_samples - warmups_left_, current_, score, false});
    return std::nullopt;
  }
  optimizer_.add_sample(to_unit(current_), score);
  ++scored_;
  const bool best = score > best_score_;
  best_score_ = std::max(best_score_, score);
  record({false, scored_, current_, score, best});
  TunedParameters next;
  if (scored_ >= options_.max_samples) {
    settled_ = true;
    next = from_unit(optimizer_.best());
    emit(autotune_settled_line(next, scored_));
  } else {
    next = from_unit(optimizer_.next());
  }
  if (next == current_) return std::nullopt;
  current_ = next;
  return current_;
}

}  // namespace krug::observe
