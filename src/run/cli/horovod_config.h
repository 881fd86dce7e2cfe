// horovodrun's --config-file: a YAML file of sections (params, autotune, timeline, stall_check,
// library_options, logging, controller) whose keys are horovodrun's flags. krugrun reads it into
// the same KRUG_* variables its own flags set, so a Horovod job's settings file works as it is.
// krug's own job spec (--config, run/cli/job_spec.h) is a different, flat format that also lists
// hosts and steps.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace krug::run {

struct HorovodConfig {
  std::map<std::string, std::string> knob_env;  // KRUG_* variable -> value
  std::optional<bool> use_mpi;                  // controller: mpi (true) or gloo (false)
};

// Reads and checks the file. Throws krug::Error naming file:line:col and the key for an
// unreadable or malformed file, an unknown section or key, and a value of the wrong type or out
// of range (the checks of the matching flag).
HorovodConfig load_horovod_config(const std::string& path);

// The same, from text (`path` is used in messages only).
HorovodConfig parse_horovod_config(const std::string& text, const std::string& path);

}  // namespace krug::run
