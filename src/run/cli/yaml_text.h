// YAML as krugrun's settings files read it (the job spec, horovodrun's settings file).
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace krug::run {

// Parses `text`, read from `path`. Throws krug::Error naming path:line:column when it is not
// valid YAML.
YAML::Node parse_yaml(const std::string& text, const std::string& path);

}  // namespace krug::run
