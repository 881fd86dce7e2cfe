// The environment krugrun hands a remote rank's wrapper (`krugrun __remote-exec`): sent on the
// wrapper's stdin through ssh, not on its command line, where any user of either host could read
// it (the job secret included) in a process listing.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace krug::run {

using EnvEntries = std::vector<std::pair<std::string, std::string>>;

// Largest block a wrapper accepts; krugrun refuses to send a larger one.
inline constexpr size_t kMaxEnvBlockBytes = size_t{8} << 20;

// A header line with the body's byte count, then the body: NAME=value entries, each ended by a
// NUL (which no name or value can hold).
std::string encode_env_block(const EnvEntries& env);

// The byte count of a header line (without its newline); throws krug::Error when it is not a
// count of at most kMaxEnvBlockBytes.
size_t parse_env_block_header(std::string_view header);

// The entries of a body; throws krug::Error on a malformed entry.
EnvEntries decode_env_block_body(std::string_view body);

// Whether a variable of krugrun's environment belongs on another host too. Like horovodrun,
// krugrun carries the whole environment (PATH, LD_LIBRARY_PATH, NCCL_*, the script's own
// settings), except what describes this login or this host's devices: HOME, USER, LOGNAME,
// SHELL, PWD, OLDPWD, SHLVL, HOSTNAME, MAIL, DISPLAY, `_`, SSH_*, XDG_*, exported shell
// functions (BASH_FUNC_*) and *CUDA_VISIBLE_DEVICES.
bool carried_to_other_hosts(std::string_view name);

}  // namespace krug::run
