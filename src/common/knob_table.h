// The declarative knob table behind config.h: one row per knob says its variable name, Horovod
// alias, unit, where it lands in Config, what values are accepted and what it does. Loading
// (config.cc) and the generated docs both read this table and nothing else.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/config.h"

namespace krug::knobs {

// Where a knob's value goes; the member's type decides how the text is parsed.
// std::optional<bool> is a boolean that may also be "auto" (nullopt); a duration is a number in
// its own unit (the knob's unit names it).
using Field =
    std::variant<int64_t Config::*, int Config::*, double Config::*, bool Config::*,
                 std::optional<bool> Config::*, std::string Config::*, Seconds Config::*,
                 Milliseconds Config::*, std::chrono::microseconds Config::*, DataPlane Config::*>;

template <typename T>
inline constexpr bool is_duration = false;
template <typename Rep, typename Period>
inline constexpr bool is_duration<std::chrono::duration<Rep, Period>> = true;

// Accepted numeric range, checked after parsing (numbers only).
struct Bounds {
  double min = -std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  double max = std::numeric_limits<double>::infinity();
};

// Whether `value` is inside `bounds`, and the bounds in words (" >= 0", " from 0 to 65535").
bool in_bounds(double value, const Bounds& bounds);
std::string bounds_text(const Bounds& bounds);

// A Horovod spelling of an enum knob's value, read from its aliases: "mpi" -> "host".
struct AliasValue {
  std::string_view horovod;  // lower case
  std::string_view krug;     // one of the knob's choices
};

struct Knob {
  std::string_view name;                  // KRUG_FUSION_THRESHOLD
  std::vector<std::string_view> aliases;  // HOROVOD_FUSION_THRESHOLD; the first set wins
  std::string_view unit;  // "bytes", "milliseconds", "bool", ... (shown in docs and errors)
  Field field;
  Bounds bounds = {};
  std::vector<std::string_view> choices = {};  // non-empty: an enum (string field), lower case
  // Non-empty: the aliases accept these values only (Horovod's, which differ from krug's).
  std::vector<AliasValue> alias_values = {};
  std::string_view default_text = {};  // overrides the default shown from Config{}
  std::string_view doc = {};
};

const std::vector<Knob>& table();

// The default as shown to users: default_text, else the value in a default Config.
std::string default_text(const Knob& knob);
// What the knob accepts, in words: "an integer >= 0 (bytes)"; `from_alias`: what its aliases
// accept, where that differs (alias_values).
std::string accepted_text(const Knob& knob, bool from_alias = false);

}  // namespace krug::knobs
