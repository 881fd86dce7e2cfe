// What counts as an environment variable name, for every place krugrun takes one (-x, the job
// spec's env and forward_env). Its own file so that the job spec's parser links without the
// command line's.
#pragma once

#include <string_view>

namespace krug::run {

// True for an environment variable name: letters, digits and '_', not starting with a digit.
bool is_env_name(std::string_view name);

}  // namespace krug::run
