// Chrome trace ("Trace Event Format") writer for the engine timeline.
//
// One row per tensor name, phases as duration events (NEGOTIATE, QUEUE,
// MEMCPY_IN_FUSION_BUFFER, the collective, MEMCPY_OUT_FUSION_BUFFER) and cycle markers as
// instant events. Writes happen on a background thread so the engine never waits on disk; the
// file is a valid JSON array after the destructor runs (and loads in chrome://tracing and
// Perfetto, which also accept a truncated array if the process dies).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

namespace krug::observe {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  // Creates/truncates `path`; throws krug::Error naming the path if it cannot be opened.
  explicit Timeline(const std::string& path);
  ~Timeline();  // flushes and closes the JSON array
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Thread-safe. `args_json` is an optional JSON object text ("{\"bytes\":4}").
  void begin(std::string_view tensor, std::string_view phase, Clock::time_point t,
             std::string_view args_json = {});
  void end(std::string_view tensor, std::string_view phase, Clock::time_point t);
  void instant(std::string_view tensor, std::string_view name, Clock::time_point t);
  void mark_cycle(Clock::time_point t);
  void flush();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace krug::observe
