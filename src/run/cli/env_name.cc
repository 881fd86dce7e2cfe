#include "run/cli/env_name.h"

#include <cctype>

namespace krug::run {

bool is_env_name(std::string_view name) {
  bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
  for (char c : name) valid = valid && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  return valid;
}

}  // namespace krug::run
