#include "run/cli/horovod_config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <string_view>
#include <vector>

#include "krug/types.h"
#include "run/cli/knob_flags.h"
#include "run/cli/yaml_text.h"

namespace krug::run {
namespace {

// What one key of a section does with its value (a scalar node), where `at` names it.
using Apply = std::function<void(const YAML::Node& value, const std::string& at, HorovodConfig&)>;

struct Key {
  std::string_view name;
  Apply apply;
};

struct Section {
  std::string_view name;
  std::vector<Key> keys;
};

std::string where(const std::string& path, const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  return m.is_null() ? path : fmt::format("{}:{}:{}", path, m.line + 1, m.column + 1);
}

std::string scalar(const YAML::Node& n, const std::string& at) {
  if (!n.IsScalar()) throw Error(fmt::format("krugrun: {}: expected a value", at));
  return n.Scalar();
}

// A mapping's key: a name (YAML also allows a null, a list or a mapping as a key).
std::string key_name(const YAML::Node& key, const std::string& path) {
  if (!key.IsScalar())
    throw Error(fmt::format("krugrun: {}: expected a name as the key", where(path, key)));
  return key.Scalar();
}

bool boolean(const YAML::Node& n, const std::string& at) {
  bool v = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v))
    throw Error(fmt::format("krugrun: {}: expected true or false", at));
  return v;
}

// A key with the checks and formatting of krugrun's flag `flag_key` (knob_flags.h).
Key knob(std::string_view name, std::string_view flag_key) {
  return {name, [flag_key](const YAML::Node& v, const std::string& at, HorovodConfig& c) {
            for (const KnobFlag& flag : knob_flags()) {
              if (flag.key != flag_key) continue;
              try {
                c.knob_env[std::string(flag.env)] = knob_value(flag, scalar(v, at));
              } catch (const Error& e) {
                throw Error(fmt::format("krugrun: {}: {}", at, e.what()));
              }
              return;
            }
            throw Error(fmt::format("krugrun: {}: no flag {} (a krugrun bug)", at, flag_key));
          }};
}

// A true/false key setting `env` to 1/0 (`inverted`: to 0/1).
Key flag(std::string_view name, std::string env, bool inverted = false) {
  return {name, [env, inverted](const YAML::Node& v, const std::string& at, HorovodConfig& c) {
            c.knob_env[env] = boolean(v, at) != inverted ? "1" : "0";
          }};
}

// A key krug has no use for (an MPI, NCCL-stream or oneCCL setting, or log timestamps): read,
// checked for a value, and ignored, since it changes no result.
Key no_effect(std::string_view name) {
  return {name, [](const YAML::Node& v, const std::string& at, HorovodConfig&) { scalar(v, at); }};
}

const std::vector<Section>& sections() {
  static const std::vector<Section> table = {
      {"params",
       {knob("fusion_threshold_mb", "fusion_threshold_mb"), knob("cycle_time_ms", "cycle_time_ms"),
        knob("cache_capacity", "cache_capacity"),
        flag("hierarchical_allreduce", "KRUG_HIERARCHICAL_ALLREDUCE"),
        no_effect("hierarchical_allgather")}},
      {"autotune",
       {flag("enabled", "KRUG_AUTOTUNE"), knob("log_file", "autotune_log_file"),
        knob("warmup_samples", "autotune_warmup_samples"),
        knob("steps_per_sample", "autotune_steps_per_sample"),
        knob("bayes_opt_max_samples", "autotune_bayes_opt_max_samples"),
        knob("gaussian_process_noise", "autotune_gaussian_process_noise")}},
      {"timeline",
       {knob("filename", "timeline_filename"), flag("mark_cycles", "KRUG_TIMELINE_MARK_CYCLES")}},
      {"stall_check",
       {flag("enabled", "KRUG_STALL_CHECK_DISABLE", /*inverted=*/true),
        knob("warning_time_seconds", "stall_check_seconds"),
        knob("shutdown_time_seconds", "stall_shutdown_seconds")}},
      {"library_options",
       {knob("gloo_timeout_seconds", "timeout_seconds"), no_effect("mpi_threads_disable"),
        no_effect("num_nccl_streams"), no_effect("ccl_bgt_affinity")}},
      {"logging", {knob("level", "log_level"), no_effect("with_timestamp")}},
  };
  return table;
}

std::string names_of(const std::vector<Key>& keys) {
  std::string out;
  for (const Key& k : keys) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

void read_section(const Section& section, const YAML::Node& body, const std::string& path,
                  HorovodConfig& c) {
  if (body.IsNull()) return;
  if (!body.IsMap())
    throw Error(
        fmt::format("krugrun: {}: {}: expected a mapping", where(path, body), section.name));
  for (const auto& entry : body) {
    const std::string key = key_name(entry.first, path);
    const std::string at = fmt::format("{}: {}.{}", where(path, entry.first), section.name, key);
    auto it = std::find_if(section.keys.begin(), section.keys.end(),
                           [&](const Key& k) { return k.name == key; });
    if (it == section.keys.end())
      throw Error(fmt::format("krugrun: {}: unknown key (keys of {}: {})", at, section.name,
                              names_of(section.keys)));
    it->apply(entry.second, at, c);
  }
}

}  // namespace

HorovodConfig parse_horovod_config(const std::string& text, const std::string& path) {
  const YAML::Node root = parse_yaml(text, path);
  HorovodConfig c;
  if (root.IsNull()) return c;
  if (!root.IsMap())
    throw Error(
        fmt::format("krugrun: {}: expected a mapping of sections (params, autotune, "
                    "timeline, stall_check, library_options, logging, controller)",
                    path));
  for (const auto& entry : root) {
    const std::string name = key_name(entry.first, path);
    const std::string at = fmt::format("{}: {}", where(path, entry.first), name);
    if (name == "controller") {
      const std::string value = scalar(entry.second, at);
      if (value != "gloo" && value != "mpi")
        throw Error(fmt::format("krugrun: {}: '{}' is not gloo or mpi", at, value));
      c.use_mpi = value == "mpi";
      continue;
    }
    auto it = std::find_if(sections().begin(), sections().end(),
                           [&](const Section& s) { return s.name == name; });
    if (it == sections().end())
      throw Error(
          fmt::format("krugrun: {}: unknown section (horovodrun's are params, autotune, "
                      "timeline, stall_check, library_options, logging, controller)",
                      at));
    read_section(*it, entry.second, path, c);
  }
  return c;
}

HorovodConfig load_horovod_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("krugrun: cannot read the config file " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_horovod_config(text.str(), path);
}

}  // namespace krug::run
