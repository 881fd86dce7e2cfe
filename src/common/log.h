// Minimal leveled logging to stderr: "[krug <level> rank R] message". The level comes from
// KRUG_LOG_LEVEL through the engine; the sink is process-wide but immutable after set_level.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace krug::log {

enum class Level { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

// Parses "trace".."fatal" (case-insensitive); throws krug::Error otherwise.
Level parse_level(std::string_view s);
// "trace", "debug", "info", "warning", "error" or "fatal".
std::string_view level_name(Level level);
Level level();
void set_level(Level level);
void write(Level level, int rank, std::string_view message);

template <typename... Args>
void at(Level lvl, int rank, fmt::format_string<Args...> f, Args&&... args) {
  if (lvl >= level()) write(lvl, rank, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace krug::log
