#include "engine/autotune_observer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace krug::engine {

AutotuneObserver::AutotuneObserver(const Config& config, bool hierarchical, EngineKnobs& knobs)
    : knobs_(knobs) {
  observe::AutotuneOptions options;
  options.warmup_samples = static_cast<int>(config.autotune_warmup_samples);
  options.steps_per_sample = static_cast<int>(config.autotune_steps_per_sample);
  options.max_samples = static_cast<int>(config.autotune_max_samples);
  options.noise = config.autotune_gp_noise;
  if (!config.autotune_log.empty()) {
    log_.open(config.autotune_log, std::ios::out | std::ios::trunc);
    if (!log_)
      throw Error(fmt::format("KRUG_AUTOTUNE_LOG: cannot write {}: {}", config.autotune_log,
                              std::strerror(errno)));
  }
  // Start inside the ranges: a fusion threshold of 0 (fusion off) starts from the smallest.
  const observe::TunedParameters start{
      std::clamp(config.fusion_threshold_bytes, options.min_fusion_bytes, options.max_fusion_bytes),
      std::clamp(config.cycle_time.count(), options.min_cycle_ms, options.max_cycle_ms),
      hierarchical};
  const int rank = config.rank;
  autotuner_ =
      std::make_unique<observe::Autotuner>(start, options, [this, rank](const std::string& line) {
        if (log_.is_open()) log_ << line << std::endl;
        if (line.rfind("settled,", 0) == 0) log::at(log::Level::kInfo, rank, "autotune: {}", line);
      });
  knobs_.retune(start.fusion_threshold_bytes, start.cycle_time_ms);
}

void AutotuneObserver::on_executed(int64_t bytes, Clock::time_point now) {
  if (bytes <= 0) return;
  if (auto tuned = autotuner_->observe(bytes, now))
    knobs_.retune(tuned->fusion_threshold_bytes, tuned->cycle_time_ms);
}

}  // namespace krug::engine
