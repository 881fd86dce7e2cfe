#include "common/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <type_traits>

#include "common/knob_table.h"
#include "common/strict_parse.h"

namespace krug {
namespace {

using knobs::Knob;

// A knob's value as found in the environment, with the variable it came from (KRUG_* or a
// HOROVOD_* alias) so errors name what the user actually set.
struct Setting {
  std::string_view var;
  std::string value;
  bool from_alias = false;
};
// Canonical knob name -> variable the value was read from, for cross-knob checks.
using Sources = std::map<std::string_view, std::string_view>;

std::optional<Setting> lookup(const Knob& knob, const GetEnv& getenv) {
  if (const char* value = getenv(std::string(knob.name).c_str())) return Setting{knob.name, value};
  for (std::string_view alias : knob.aliases)
    if (const char* value = getenv(std::string(alias).c_str())) return Setting{alias, value, true};
  return std::nullopt;
}

[[noreturn]] void reject(const Knob& knob, const Setting& setting) {
  throw Error(fmt::format("{}='{}' is invalid: expected {}", setting.var, setting.value,
                          knobs::accepted_text(knob, setting.from_alias)));
}

// An enum knob's value in krug's spelling: one of its choices, or where its aliases take
// Horovod's own values, the choice the alias's value means.
std::string choice(const Knob& knob, const Setting& setting) {
  const std::string lower = to_lower(setting.value);
  if (setting.from_alias && !knob.alias_values.empty()) {
    for (const knobs::AliasValue& v : knob.alias_values)
      if (lower == v.horovod) return std::string(v.krug);
    reject(knob, setting);
  }
  if (std::find(knob.choices.begin(), knob.choices.end(), lower) == knob.choices.end())
    reject(knob, setting);
  return lower;
}

// Deadlines add a knob's duration to the steady clock, which counts int64 nanoseconds: a longer
// one (about 292 years) would overflow it, so it is refused rather than wrapped.
template <typename Duration>
void check_fits_clock(const Setting& setting, Duration d) {
  const double nanoseconds = std::chrono::duration<double, std::nano>(d).count();
  if (nanoseconds >= static_cast<double>(std::numeric_limits<int64_t>::max()))
    throw Error(fmt::format("{}='{}' is invalid: longer than a clock can count (292 years)",
                            setting.var, setting.value));
}

// Parses `setting` according to the type of the Config member it lands in.
void assign(const Knob& knob, const Setting& setting, Config& config) {
  std::visit(
      [&](auto member) {
        using T = std::decay_t<decltype(config.*member)>;
        if constexpr (std::is_same_v<T, bool>) {
          auto value = parse_bool_strict(setting.value);
          if (!value) reject(knob, setting);
          config.*member = *value;
        } else if constexpr (std::is_same_v<T, std::optional<bool>>) {
          if (to_lower(setting.value) == "auto") {
            config.*member = std::nullopt;
            return;
          }
          auto value = parse_bool_strict(setting.value);
          if (!value) reject(knob, setting);
          config.*member = *value;
        } else if constexpr (std::is_same_v<T, std::string>) {
          config.*member = knob.choices.empty() ? setting.value : choice(knob, setting);
        } else if constexpr (std::is_same_v<T, DataPlane>) {
          auto plane = parse_data_plane(to_lower(setting.value));
          if (!plane) reject(knob, setting);
          config.*member = *plane;
        } else if constexpr (knobs::is_duration<T>) {
          // A number in the knob's unit (T's period): an integer where T counts whole units.
          if constexpr (std::is_integral_v<typename T::rep>) {
            auto value = parse_int64_strict(setting.value);
            if (!value || !knobs::in_bounds(static_cast<double>(*value), knob.bounds))
              reject(knob, setting);
            check_fits_clock(setting, std::chrono::duration<double, typename T::period>(*value));
            config.*member = T(*value);
          } else {
            auto value = parse_double_strict(setting.value);
            if (!value || !knobs::in_bounds(*value, knob.bounds)) reject(knob, setting);
            check_fits_clock(setting, T(*value));
            config.*member = T(*value);
          }
        } else if constexpr (std::is_integral_v<T>) {
          auto value = parse_int64_strict(setting.value);
          if (!value || *value < std::numeric_limits<T>::min() ||
              *value > std::numeric_limits<T>::max() ||
              !knobs::in_bounds(static_cast<double>(*value), knob.bounds))
            reject(knob, setting);
          config.*member = static_cast<T>(*value);
        } else {
          auto value = parse_double_strict(setting.value);
          if (!value || !knobs::in_bounds(*value, knob.bounds)) reject(knob, setting);
          config.*member = *value;
        }
      },
      knob.field);
}

// rank < size, checked only when both were set.
void check_rank_below_size(const Sources& sources, std::string_view rank_knob, int rank,
                           std::string_view size_knob, int size) {
  if (rank < 0 || size < 0 || rank < size) return;
  throw Error(fmt::format("{}={} is invalid: it must be less than {}={}", sources.at(rank_knob),
                          rank, sources.at(size_knob), size));
}

std::string local_hostname() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return {};
  return buffer;
}

GetEnv or_process_environment(const GetEnv& getenv) {
  return getenv ? getenv : GetEnv([](const char* name) { return std::getenv(name); });
}

// Reads `knob` into `config` if it is set, noting where it came from in `sources`.
void read(const Knob& knob, const GetEnv& getenv, Config& config, Sources& sources) {
  auto setting = lookup(knob, getenv);
  if (!setting) return;
  assign(knob, *setting, config);
  sources[knob.name] = setting->var;
}

// Gloo's and MPI's transports carry bytes in the clear: asking for them and for encryption
// together is a contradiction to report, not to resolve silently.
void check_encryption(const Sources& sources, const Config& config) {
  if (!config.encrypt) return;
  if (config.data_plane != DataPlane::kGloo && config.data_plane != DataPlane::kMpi) return;
  throw Error(fmt::format(
      "KRUG_ENCRYPT=1 and {}={}: that plane sends data in the clear; unset it (or set it to "
      "tcp) so that krug's own planes, which encrypt, carry the job",
      sources.count("KRUG_CPU_OPERATIONS") ? sources.at("KRUG_CPU_OPERATIONS")
                                           : std::string_view("KRUG_CPU_OPERATIONS"),
      data_plane_name(config.data_plane)));
}

}  // namespace

std::string_view data_plane_name(DataPlane plane) {
  switch (plane) {
    case DataPlane::kShm:
      return "shm";
    case DataPlane::kGloo:
      return "gloo";
    case DataPlane::kTcp:
      return "tcp";
    case DataPlane::kMpi:
      return "mpi";
    case DataPlane::kAuto:
      break;
  }
  return "";
}

std::optional<DataPlane> parse_data_plane(std::string_view name) {
  for (DataPlane plane : {DataPlane::kShm, DataPlane::kTcp, DataPlane::kGloo, DataPlane::kMpi})
    if (name == data_plane_name(plane)) return plane;
  return std::nullopt;
}

Config load_config(const GetEnv& getenv) {
  const GetEnv env = or_process_environment(getenv);
  Config config;
  Sources sources;
  for (const Knob& knob : knobs::table()) read(knob, env, config, sources);
  check_rank_below_size(sources, "KRUG_RANK", config.rank, "KRUG_SIZE", config.size);
  check_rank_below_size(sources, "KRUG_LOCAL_RANK", config.local_rank, "KRUG_LOCAL_SIZE",
                        config.local_size);
  check_rank_below_size(sources, "KRUG_CROSS_RANK", config.cross_rank, "KRUG_CROSS_SIZE",
                        config.cross_size);
  if (config.hostname.empty()) config.hostname = local_hostname();
  check_encryption(sources, config);
  return config;
}

Config load_knobs(std::initializer_list<std::string_view> names, const GetEnv& getenv) {
  const GetEnv env = or_process_environment(getenv);
  Config config;
  Sources sources;
  for (const Knob& knob : knobs::table())
    if (std::find(names.begin(), names.end(), knob.name) != names.end())
      read(knob, env, config, sources);
  return config;
}

std::vector<KnobDoc> knob_docs() {
  std::vector<KnobDoc> docs;
  for (const Knob& knob : knobs::table()) {
    KnobDoc doc{.name = std::string(knob.name),
                .aliases = {knob.aliases.begin(), knob.aliases.end()},
                .type = std::string(knob.unit),
                .default_value = knobs::default_text(knob),
                .doc = std::string(knob.doc)};
    if (!knob.choices.empty())
      doc.doc += fmt::format(" One of: {}.", fmt::join(knob.choices, ", "));
    docs.push_back(std::move(doc));
  }
  return docs;
}

}  // namespace krug
