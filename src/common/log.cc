#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "krug/types.h"

namespace krug::log {
namespace {
// The only process-wide mutable value in krug besides the engine pointer: logging must work
// before and between engines, and an atomic level is all it holds.
std::atomic<Level>& current() {
  static std::atomic<Level> level{Level::kWarning};
  return level;
}
constexpr std::string_view kNames[] = {"trace", "debug", "info", "warning", "error", "fatal"};
}  // namespace

Level parse_level(std::string_view s) {
  std::string lower(s);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (int i = 0; i < 6; ++i)
    if (lower == kNames[i]) return static_cast<Level>(i);
  if (lower == "warn") return Level::kWarning;
  throw Error("invalid log level '" + std::string(s) +
              "': use one of trace, debug, info, warning, error, fatal");
}

std::string_view level_name(Level lvl) {
  return kNames[static_cast<int>(lvl)];
}

Level level() { return current().load(std::memory_order_relaxed); }
void set_level(Level lvl) { current().store(lvl, std::memory_order_relaxed); }

void write(Level lvl, int rank, std::string_view message) {
  std::string line = rank >= 0 ? fmt::format("[krug {} rank {}] {}\n", kNames[int(lvl)], rank, message)
                               : fmt::format("[krug {}] {}\n", kNames[int(lvl)], message);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace krug::log
