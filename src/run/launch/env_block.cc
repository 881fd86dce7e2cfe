#include "run/launch/env_block.h"

#include <algorithm>
#include <array>
#include <charconv>

#include "krug/types.h"

namespace krug::run {

std::string encode_env_block(const EnvEntries& env) {
  std::string body;
  for (const auto& [name, value] : env) {
    body += name;
    body += '=';
    body += value;
    body += '\0';
  }
  return std::to_string(body.size()) + "\n" + body;
}

size_t parse_env_block_header(std::string_view header) {
  size_t bytes = 0;
  auto [end, ec] = std::from_chars(header.data(), header.data() + header.size(), bytes);
  if (header.empty() || ec != std::errc() || end != header.data() + header.size())
    throw Error("bad environment header '" + std::string(header) + "' (expected a byte count)");
  if (bytes > kMaxEnvBlockBytes)
    throw Error("environment of " + std::to_string(bytes) + " bytes is larger than the " +
                std::to_string(kMaxEnvBlockBytes) + " accepted");
  return bytes;
}

EnvEntries decode_env_block_body(std::string_view body) {
  EnvEntries env;
  while (!body.empty()) {
    const size_t end = body.find('\0');
    if (end == std::string_view::npos) throw Error("environment entry without its terminator");
    const std::string_view entry = body.substr(0, end);
    const size_t eq = entry.find('=');
    if (eq == 0 || eq == std::string_view::npos)
      throw Error("bad environment entry '" + std::string(entry) + "'");
    env.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
    body.remove_prefix(end + 1);
  }
  return env;
}

bool carried_to_other_hosts(std::string_view name) {
  static constexpr std::array<std::string_view, 11> kThisLogin = {
      "HOME",  "USER",     "LOGNAME", "SHELL",   "PWD", "OLDPWD",
      "SHLVL", "HOSTNAME", "MAIL",    "DISPLAY", "_"};
  static constexpr std::array<std::string_view, 3> kThisLoginPrefixes = {"SSH_", "XDG_",
                                                                         "BASH_FUNC_"};
  if (std::find(kThisLogin.begin(), kThisLogin.end(), name) != kThisLogin.end()) return false;
  for (std::string_view prefix : kThisLoginPrefixes)
    if (name.starts_with(prefix)) return false;
  return !name.ends_with("CUDA_VISIBLE_DEVICES");
}

}  // namespace krug::run
