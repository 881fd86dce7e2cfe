#include "run/cli/yaml_text.h"

#include <fmt/format.h>

#include "krug/types.h"

namespace krug::run {

YAML::Node parse_yaml(const std::string& text, const std::string& path) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(fmt::format("krugrun: {}:{}:{}: not valid YAML: {}", path, e.mark.line + 1,
                            e.mark.column + 1, e.msg));
  }
}

}  // namespace krug::run
