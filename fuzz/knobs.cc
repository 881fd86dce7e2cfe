// Knob parsing on untrusted values: the engine's KRUG_* / HOROVOD_* variables (load_config,
// common/config.h) and krugrun's knob flags (knob_value, run/cli/knob_flags.h). The input is an
// environment, one NAME=value per line; a line whose NAME is a flag's key (fusion_threshold_mb)
// is that flag's text. Each value is accepted or throws krug::Error; every accepted duration
// converts to the clock's own (nanoseconds), as the engine's deadlines convert it.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "common/config.h"
#include "common/knob_table.h"
#include "krug/types.h"
#include "run/cli/knob_flags.h"

namespace {

std::map<std::string, std::string> environment(std::string_view text) {
  std::map<std::string, std::string> env;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const size_t eq = line.find('=');
    if (eq != std::string_view::npos)
      env.emplace(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
  }
  return env;
}

void check_durations(const krug::Config& config) {
  for (const auto& knob : krug::knobs::table())
    std::visit(
        [&](auto member) {
          using T = std::decay_t<decltype(config.*member)>;
          if constexpr (krug::knobs::is_duration<T>)
            (void)std::chrono::duration_cast<std::chrono::steady_clock::duration>(config.*member);
        },
        knob.field);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto env = environment(std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    // KRUG_HOSTNAME is set so that load_config does not ask the system for it.
    check_durations(krug::load_config([&](const char* name) -> const char* {
      if (auto it = env.find(name); it != env.end()) return it->second.c_str();
      return std::string_view(name) == "KRUG_HOSTNAME" ? "fuzz" : nullptr;
    }));
  } catch (const krug::Error&) {
  }
  for (const auto& flag : krug::run::knob_flags()) {
    auto it = env.find(std::string(flag.key));
    if (it == env.end()) continue;
    try {
      (void)krug::run::knob_value(flag, it->second);
    } catch (const krug::Error&) {
    }
  }
  return 0;
}
