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
double from_unit_log(double u, double lo, double hi) { return lo * std::pow(hi / lo, u); }

}  // namespace

Autotuner::Autotuner(TunedParameters start, const AutotuneOptions& options, Log log)
    : options_(options),
      log_(std::move(log)),
      optimizer_(2, options.noise, options.seed),
      current_(start),
      warmups_left_(options.warmup_samples) {
  if (options_.min_fusion_bytes <= 0 || options_.max_fusion_bytes <= options_.min_fusion_bytes)
    throw Error(fmt::format("autotune: the fusion threshold range {}..{} bytes is empty",
                            options_.min_fusion_bytes, options_.max_fusion_bytes));
  if (!(options_.min_cycle_ms > 0) || options_.max_cycle_ms <= options_.min_cycle_ms)
    throw Error(fmt::format("autotune: the cycle time range {}..{} ms is empty",
                            options_.min_cycle_ms, options_.max_cycle_ms));
  if (options_.steps_per_sample < 1 || options_.max_samples < 1 || options_.warmup_samples < 0)
    throw Error("autotune: steps per sample and max samples must be at least 1, warmup samples "
                "at least 0");
  emit("sample,fusion_threshold_bytes,cycle_time_ms,bytes_per_second,best_so_far");
}

void Autotuner::emit(const std::string& line) const {
  if (log_) log_(line);
}

Point Autotuner::to_unit(const TunedParameters& p) const {
  return {unit_log(static_cast<double>(p.fusion_threshold_bytes),
                   static_cast<double>(options_.min_fusion_bytes),
                   static_cast<double>(options_.max_fusion_bytes)),
          unit_log(p.cycle_time_ms, options_.min_cycle_ms, options_.max_cycle_ms)};
}

TunedParameters Autotuner::from_unit(const Point& x) const {
  const double fusion = from_unit_log(x[0], static_cast<double>(options_.min_fusion_bytes),
                                      static_cast<double>(options_.max_fusion_bytes));
  // Whole KiB and 0.01 ms: readable in the log, and as fine as either knob matters.
  return {std::max<int64_t>(1024, static_cast<int64_t>(std::llround(fusion / 1024)) * 1024),
          std::round(from_unit_log(x[1], options_.min_cycle_ms, options_.max_cycle_ms) * 100) /
              100};
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
    emit(fmt::format("warmup,{},{},{:.0f},", current_.fusion_threshold_bytes,
                     current_.cycle_time_ms, score));
    return std::nullopt;
  }
  optimizer_.add_sample(to_unit(current_), score);
  ++scored_;
  const bool best = score > best_score_;
  best_score_ = std::max(best_score_, score);
  emit(fmt::format("{},{},{},{:.0f},{}", scored_, current_.fusion_threshold_bytes,
                   current_.cycle_time_ms, score, best ? "best" : ""));
  TunedParameters next;
  if (scored_ >= options_.max_samples) {
    settled_ = true;
    next = from_unit(optimizer_.best());
    emit(fmt::format("settled,{},{},,after {} samples", next.fusion_threshold_bytes,
                     next.cycle_time_ms, scored_));
  } else {
    next = from_unit(optimizer_.next());
  }
  if (next == current_) return std::nullopt;
  current_ = next;
  return current_;
}

}  // namespace krug::observe
