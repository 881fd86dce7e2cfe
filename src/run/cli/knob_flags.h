// krugrun's knob flags (--fusion-threshold-mb, --cycle-time-ms, ...), declared once for both
// places that set them: the command line (options.cc) and the job spec file (job_spec.cc).
// Each turns into one KRUG_* variable in every rank's environment.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace krug::run {

struct KnobFlag {
  enum class Kind {
    kMebibytes,  // a whole number of MiB, written to the variable in bytes
    kInteger,    // a whole number
    kNumber,     // a decimal number
    kText,       // any text (a path)
    kLogLevel,   // trace|debug|info|warning|error|fatal
  };
  std::string_view key;  // job spec key; the flag is "--" + key with '_' written as '-'
  std::string_view env;  // the KRUG_* variable it sets
  Kind kind;
  double min = 0;           // numbers: the smallest value allowed ...
  bool min_allowed = true;  // ... and whether `min` itself is allowed
  std::string_view help;
  std::string_view horovodrun_flag = {};  // horovodrun's name, where it differs
};

// Every knob flag, in the order --help lists them.
std::span<const KnobFlag> knob_flags();

// "--fusion-threshold-mb" for the key "fusion_threshold_mb".
std::string flag_name(std::string_view key);

// Checks `text` against the flag's kind and bounds and returns the variable's value, formatted
// exactly as for the command-line flag ("32" MiB -> "33554432"; "2.50" ms -> "2.5"). Throws
// krug::Error saying what is wrong with the value (callers add where it came from).
std::string knob_value(const KnobFlag& flag, std::string_view text);

// A decimal number and nothing else, at least `min` (greater than `min` unless `min_allowed`):
// the check of every number krugrun takes (knob flags, --start-timeout and its kin, the job spec
// file). Throws krug::Error saying what is wrong ("'x' is not a number", "0 must be greater
// than 0"); callers add where the text came from.
double parse_number_at_least(std::string_view text, double min, bool min_allowed);

}  // namespace krug::run
