// Reading a job spec file: YAML (yaml-cpp) checked strictly, every error naming file:line:col
// and the key, because a typo in a launch file should stop the launch, not be ignored.
#include "run/cli/job_spec.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string_view>

#include "common/strict_parse.h"
#include "krug/types.h"
#include "run/cli/env_name.h"
#include "run/cli/knob_flags.h"
#include "run/cli/yaml_text.h"

namespace krug::run {
namespace {

constexpr std::string_view kKeys =
    "np, workers, hostfile, env, forward_env, output_filename, verbose, prefix, autotune, "
    "hierarchical_allreduce, start_timeout, ssh_port, ssh_identity_file, ssh_config_file, "
    "network_interface, run";

std::string_view kind_of(const YAML::Node& n) {
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  if (n.IsNull()) return "nothing";
  return "a scalar";
}

// Reads one mapping; every failure names path:line:col and the key ("workers.count").
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const YAML::Mark& at, std::string_view key, std::string_view what) const {
    throw Error(fmt::format("krugrun: {}: {}: {}", where(at), key, what));
  }
  [[noreturn]] void fail(const YAML::Node& at, std::string_view key, std::string_view what) const {
    fail(at.Mark(), key, what);
  }

  std::string where(const YAML::Mark& m) const {
    if (m.is_null()) return path_;
    return fmt::format("{}:{}:{}", path_, m.line + 1, m.column + 1);
  }

  std::string text(const YAML::Node& n, std::string_view key, std::string_view expected) const {
    if (!n.IsScalar()) fail(n, key, fmt::format("expected {}, got {}", expected, kind_of(n)));
    return n.Scalar();
  }

  std::string nonempty_text(const YAML::Node& n, std::string_view key) const {
    std::string s = text(n, key, "a string");
    if (s.empty()) fail(n, key, "must not be empty");
    return s;
  }

  int integer(const YAML::Node& n, std::string_view key, int min, int max = INT32_MAX) const {
    std::string s = text(n, key, "a whole number");
    const std::optional<int64_t> v = parse_int64_strict(s);
    if (!v) fail(n, key, fmt::format("'{}' is not a whole number", s));
    if (*v < min || *v > max) fail(n, key, fmt::format("{} is not in {}..{}", *v, min, max));
    return static_cast<int>(*v);
  }

  double positive_number(const YAML::Node& n, std::string_view key) const {
    try {
      return parse_number_at_least(text(n, key, "a number"), 0, false);
    } catch (const Error& e) {
      fail(n, key, e.what());
    }
  }

  bool boolean(const YAML::Node& n, std::string_view key) const {
    std::string s = text(n, key, "true or false");
    bool v = false;
    if (!YAML::convert<bool>::decode(n, v))
      fail(n, key, fmt::format("'{}' is not true or false", s));
    return v;
  }

  std::string existing_file(const YAML::Node& n, std::string_view key) const {
    std::string s = nonempty_text(n, key);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(s, ec))
      fail(n, key,
           fmt::format("'{}' is not a file (paths are relative to the directory krugrun "
                       "runs in)",
                       s));
    return s;
  }

  std::string variable_name(const YAML::Node& n, std::string_view key) const {
    std::string s = text(n, key, "a variable name");
    if (!is_env_name(s)) fail(n, key, fmt::format("'{}' is not a variable name", s));
    return s;
  }

  // Calls `on_entry(key, key node, value node)` for each entry of a mapping, rejecting
  // repeated keys (yaml-cpp keeps both silently).
  void each_entry(const YAML::Node& map, std::string_view name,
                  const std::function<void(const std::string&, const YAML::Node&,
                                           const YAML::Node&)>& on_entry) const {
    if (!map.IsMap()) fail(map, name, fmt::format("expected a mapping, got {}", kind_of(map)));
    std::set<std::string> seen;
    for (const auto& entry : map) {
      std::string key = text(entry.first, name, "a key");
      if (!seen.insert(key).second) fail(entry.first, key, "given twice");
      on_entry(key, entry.first, entry.second);
    }
  }

 private:
  std::string path_;
};

// A list of scalars; `run:` and `forward_env:` also accept a single string.
std::vector<YAML::Node> list_items(const Reader& r, const YAML::Node& n, std::string_view key,
                                   bool allow_single) {
  if (allow_single && n.IsScalar()) return {n};
  if (!n.IsSequence()) r.fail(n, key, fmt::format("expected a list, got {}", kind_of(n)));
  return {n.begin(), n.end()};
}

struct WorkerEntries {
  std::vector<HostSlots> hosts;
  std::vector<bool> explicit_slots;
};

// workers.hosts: a list of "host" / "host:slots" entries, or one -H style string.
WorkerEntries read_worker_hosts(const Reader& r, const YAML::Node& n) {
  std::string joined;
  for (const auto& item : list_items(r, n, "workers.hosts", true)) {
    std::string entry = r.nonempty_text(item, "workers.hosts");
    joined += (joined.empty() ? "" : ",") + entry;
  }
  if (joined.empty()) r.fail(n, "workers.hosts", "the list is empty");
  WorkerEntries out;
  try {
    out.hosts = parse_hosts(joined);
  } catch (const Error& e) {
    // parse_hosts speaks of -H; here the list is the file's.
    std::string what = e.what(), prefix = "krugrun: bad -H '" + joined + "': ";
    r.fail(n, "workers.hosts", what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what);
  }
  std::stringstream pieces(joined);
  for (std::string piece; std::getline(pieces, piece, ',');)
    out.explicit_slots.push_back(piece.find(':') != std::string::npos);
  return out;
}

void read_workers(const Reader& r, const YAML::Node& workers, JobSpec& spec) {
  WorkerEntries entries;
  YAML::Mark count_at;
  r.each_entry(workers, "workers",
               [&](const std::string& key, const YAML::Node& k, const YAML::Node& v) {
                 if (key == "hosts") {
                   entries = read_worker_hosts(r, v);
                 } else if (key == "count") {
                   spec.worker_count = r.integer(v, "workers.count", 1);
                   count_at = v.Mark();
                 } else if (key == "processes_per_worker") {
                   spec.processes_per_worker = r.integer(v, "workers.processes_per_worker", 1);
                 } else {
                   r.fail(k, "workers",
                          fmt::format("unknown key '{}'; known keys: hosts, count, "
                                      "processes_per_worker",
                                      key));
                 }
               });
  for (size_t i = 0; i < entries.hosts.size(); ++i)
    if (!entries.explicit_slots[i] && spec.processes_per_worker)
      entries.hosts[i].slots = *spec.processes_per_worker;
  if (spec.worker_count && !entries.hosts.empty() &&
      *spec.worker_count > static_cast<int>(entries.hosts.size()))
    r.fail(count_at, "workers.count",
           fmt::format("{} workers asked for, but workers.hosts lists {}", *spec.worker_count,
                       entries.hosts.size()));
  spec.hosts = std::move(entries.hosts);
}

void read_env(const Reader& r, const YAML::Node& env, JobSpec& spec) {
  r.each_entry(env, "env", [&](const std::string& name, const YAML::Node& k, const YAML::Node& v) {
    if (!is_env_name(name)) r.fail(k, "env", fmt::format("'{}' is not a variable name", name));
    if (v.IsNull()) r.fail(k, "env." + name, "has no value (write NAME: \"\" for an empty one)");
    spec.env.emplace_back(name, r.text(v, "env." + name, "a value"));
  });
}

using Handler = std::function<void(const Reader&, const YAML::Node&, JobSpec&)>;

// A key that sets a boolean knob ("1" or "0"), as a switch on the command line does.
Handler switch_key(const char* key, const char* env) {
  return [key, env](const Reader& r, const YAML::Node& v, JobSpec& s) {
    s.knob_env[env] = r.boolean(v, key) ? "1" : "0";
  };
}

const std::map<std::string, Handler, std::less<>>& handlers() {
  static const std::map<std::string, Handler, std::less<>> table = {
      {"np",
       [](const Reader& r, const YAML::Node& v, JobSpec& s) { s.np = r.integer(v, "np", 1); }},
      {"workers", read_workers},
      {"hostfile", [](const Reader& r, const YAML::Node& v,
                      JobSpec& s) { s.hostfile = r.existing_file(v, "hostfile"); }},
      {"env", read_env},
      {"forward_env",
       [](const Reader& r, const YAML::Node& v, JobSpec& s) {
         for (const auto& item : list_items(r, v, "forward_env", true))
           s.forward_env.push_back(r.variable_name(item, "forward_env"));
       }},
      {"output_filename",
       [](const Reader& r, const YAML::Node& v, JobSpec& s) {
         s.output_filename = r.nonempty_text(v, "output_filename");
       }},
      {"verbose", [](const Reader& r, const YAML::Node& v,
                     JobSpec& s) { s.verbose = r.boolean(v, "verbose"); }},
      {"prefix",
       [](const Reader& r, const YAML::Node& v, JobSpec& s) { s.prefix = r.boolean(v, "prefix"); }},
      // The switches --autotune and --[no-]hierarchical-allreduce, as true or false.
      {"autotune", switch_key("autotune", "KRUG_AUTOTUNE")},
      {"hierarchical_allreduce",
       switch_key("hierarchical_allreduce", "KRUG_HIERARCHICAL_ALLREDUCE")},
      {"start_timeout",
       [](const Reader& r, const YAML::Node& v, JobSpec& s) {
         s.start_timeout = r.positive_number(v, "start_timeout");
       }},
      {"ssh_port", [](const Reader& r, const YAML::Node& v,
                      JobSpec& s) { s.ssh_port = r.integer(v, "ssh_port", 1, 65535); }},
      {"ssh_identity_file",
       [](const Reader& r, const YAML::Node& v, JobSpec& s) {
         s.ssh_identity_file = r.existing_file(v, "ssh_identity_file");
       }},
      {"ssh_config_file",
       [](const Reader& r, const YAML::Node& v, JobSpec& s) {
         s.ssh_config_file = r.existing_file(v, "ssh_config_file");
       }},
      {"network_interface",
       [](const Reader& r, const YAML::Node& v, JobSpec& s) {
         s.network_interface = r.nonempty_text(v, "network_interface");
       }},
      {"run",
       [](const Reader& r, const YAML::Node& v, JobSpec& s) {
         for (const auto& item : list_items(r, v, "run", true)) {
           std::string step = r.text(item, "run", "a command line");
           if (step.find_first_not_of(" \t\n") == std::string::npos)
             r.fail(item, "run", "a step is empty");
           s.run.push_back(step);
         }
         if (s.run.empty()) r.fail(v, "run", "the list of steps is empty");
       }},
  };
  return table;
}

const KnobFlag* find_knob(std::string_view key) {
  for (const auto& k : knob_flags())
    if (k.key == key) return &k;
  return nullptr;
}

// Levenshtein distance, for "did you mean" on a misspelt key.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

std::string unknown_key_message(std::string_view key) {
  std::vector<std::string> keys;
  for (const auto& h : handlers()) keys.push_back(h.first);
  for (const auto& k : knob_flags()) keys.emplace_back(k.key);
  std::string best;
  size_t best_distance = 3;  // suggest only close spellings
  for (const auto& k : keys)
    if (size_t d = edit_distance(key, k); d < best_distance) best = k, best_distance = d;
  if (!best.empty()) return fmt::format("unknown key; did you mean '{}'?", best);
  std::string list(kKeys);
  for (const auto& k : knob_flags()) list += fmt::format(", {}", k.key);
  return "unknown key; known keys: " + list;
}

void read_entry(const Reader& r, const std::string& key, const YAML::Node& k, const YAML::Node& v,
                JobSpec& spec) {
  auto it = handlers().find(key);
  if (it != handlers().end()) return it->second(r, v, spec);
  if (const KnobFlag* knob = find_knob(key)) {
    std::string text = r.text(v, key, "a value");
    try {
      spec.knob_env[std::string(knob->env)] = knob_value(*knob, text);
    } catch (const Error& e) {
      r.fail(v, key, e.what());
    }
    return;
  }
  r.fail(k, key, unknown_key_message(key));
}

}  // namespace

JobSpec parse_job_spec(const std::string& text, const std::string& path) {
  const YAML::Node root = parse_yaml(text, path);
  if (root.IsNull())
    throw Error(
        fmt::format("krugrun: {}: the job spec is empty; it needs at least "
                    "`run:` with the command(s) to run",
                    path));
  Reader r(path);
  if (!root.IsMap())
    throw Error(
        fmt::format("krugrun: {}: expected a mapping of settings (np: 4, run: ...), got "
                    "{}",
                    r.where(root.Mark()), kind_of(root)));
  JobSpec spec;
  spec.path = path;
  YAML::Mark hostfile_at;
  r.each_entry(root, "job spec",
               [&](const std::string& key, const YAML::Node& k, const YAML::Node& v) {
                 read_entry(r, key, k, v, spec);
                 if (key == "hostfile") hostfile_at = k.Mark();
               });
  if (spec.hostfile && !spec.hosts.empty())
    r.fail(hostfile_at, "hostfile", "give the hosts in workers.hosts or in a hostfile, not both");
  if (spec.hostfile && spec.processes_per_worker)
    r.fail(hostfile_at, "hostfile",
           "workers.processes_per_worker cannot be used with a hostfile: its lines give the slots");
  if (spec.run.empty())
    throw Error(
        fmt::format("krugrun: {}: no `run:` steps; add e.g. run: [\"python3 train.py\"]", path));
  return spec;
}

JobSpec load_job_spec(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw Error(
        fmt::format("krugrun: cannot read the job spec {}: {}", path, std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  return parse_job_spec(text.str(), path);
}

std::vector<std::vector<std::string>> step_commands(const JobSpec& spec) {
  std::vector<std::vector<std::string>> steps;
  for (const auto& line : spec.run) steps.push_back({"/bin/sh", "-c", line});
  return steps;
}

}  // namespace krug::run
