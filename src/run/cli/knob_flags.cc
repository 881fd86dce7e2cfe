#include "run/cli/knob_flags.h"

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <optional>

#include "common/log.h"
#include "common/strict_parse.h"
#include "krug/types.h"

namespace krug::run {
namespace {

using Kind = KnobFlag::Kind;

constexpr std::array kFlags{
    KnobFlag{"fusion_threshold_mb", "KRUG_FUSION_THRESHOLD", Kind::kMebibytes, 0, true,
             "KRUG_FUSION_THRESHOLD in MiB"},
    KnobFlag{"cycle_time_ms", "KRUG_CYCLE_TIME", Kind::kNumber, 0, false, "KRUG_CYCLE_TIME"},
    KnobFlag{"timeline_filename", "KRUG_TIMELINE", Kind::kText, 0, true, "KRUG_TIMELINE"},
    KnobFlag{"timeout_seconds", "KRUG_TIMEOUT_SECONDS", Kind::kNumber, 0, false,
             "KRUG_TIMEOUT_SECONDS", "--gloo-timeout-seconds"},
    KnobFlag{"log_level", "KRUG_LOG_LEVEL", Kind::kLogLevel, 0, true,
             "KRUG_LOG_LEVEL: trace|debug|info|warning|error|fatal"},
    KnobFlag{"stall_check_seconds", "KRUG_STALL_CHECK_TIME_SECONDS", Kind::kNumber, 0, true,
             "KRUG_STALL_CHECK_TIME_SECONDS", "--stall-check-warning-time-seconds"},
    KnobFlag{"stall_shutdown_seconds", "KRUG_STALL_SHUTDOWN_TIME_SECONDS", Kind::kNumber, 0, true,
             "KRUG_STALL_SHUTDOWN_TIME_SECONDS", "--stall-check-shutdown-time-seconds"},
    KnobFlag{"cache_capacity", "KRUG_CACHE_CAPACITY", Kind::kInteger, 0, true,
             "KRUG_CACHE_CAPACITY (0 disables)"},
    KnobFlag{"autotune_log_file", "KRUG_AUTOTUNE_LOG", Kind::kText, 0, true,
             "KRUG_AUTOTUNE_LOG: CSV of every autotuning sample (rank 0 writes it)"},
    KnobFlag{"autotune_warmup_samples", "KRUG_AUTOTUNE_WARMUP_SAMPLES", Kind::kInteger, 0, true,
             "KRUG_AUTOTUNE_WARMUP_SAMPLES"},
    KnobFlag{"autotune_steps_per_sample", "KRUG_AUTOTUNE_STEPS_PER_SAMPLE", Kind::kInteger, 1, true,
             "KRUG_AUTOTUNE_STEPS_PER_SAMPLE"},
    KnobFlag{"autotune_bayes_opt_max_samples", "KRUG_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
             Kind::kInteger, 1, true, "KRUG_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"},
    KnobFlag{"autotune_gaussian_process_noise", "KRUG_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
             Kind::kNumber, 0, false, "KRUG_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"},
};

void check_bound(std::string_view text, double v, double min, bool min_allowed) {
  if (min_allowed ? v < min : v <= min)
    throw Error(
        fmt::format("{} must be {} {}", text, min_allowed ? "at least" : "greater than", min));
}

int64_t parse_integer(const KnobFlag& flag, std::string_view text) {
  const std::optional<int64_t> v = parse_int64_strict(text);
  if (!v) throw Error(fmt::format("'{}' is not a whole number", text));
  check_bound(text, static_cast<double>(*v), flag.min, flag.min_allowed);
  return *v;
}

}  // namespace

std::span<const KnobFlag> knob_flags() {
  return kFlags;
}

std::string flag_name(std::string_view key) {
  std::string name = "--";
  for (char c : key) name += c == '_' ? '-' : c;
  return name;
}

std::string knob_value(const KnobFlag& flag, std::string_view text) {
  switch (flag.kind) {
    case Kind::kMebibytes: {
      int64_t mb = parse_integer(flag, text);
      if (mb > INT64_MAX / (1024 * 1024)) throw Error(fmt::format("{} MiB is too large", text));
      return std::to_string(mb * 1024 * 1024);
    }
    case Kind::kInteger:
      return std::to_string(parse_integer(flag, text));
    case Kind::kNumber:
      return fmt::format("{}", parse_number_at_least(text, flag.min, flag.min_allowed));
    case Kind::kLogLevel:  // the engine's spelling: "WARN" -> "warning"
      return std::string(log::level_name(log::parse_level(text)));
    case Kind::kText:
      return std::string(text);
  }
  throw Error("unknown knob kind");  // unreachable: every kind is handled above
}

double parse_number_at_least(std::string_view text, double min, bool min_allowed) {
  const std::optional<double> v = parse_double_strict(text);
  if (!v) throw Error(fmt::format("'{}' is not a number", text));
  check_bound(text, *v, min, min_allowed);
  return *v;
}

}  // namespace krug::run
