// What the multi-process test workers share: the rank they report as, a count of failed checks
// (the worker's exit status), and a check that prints the first failures and goes on, so one
// run shows every wrong value.
#pragma once

#include <iostream>
#include <string>

namespace krug_test {

// One worker per process, so these are the process's own; main() sets the rank.
inline int g_rank = -1;
inline int g_failures = 0;

inline std::string who() {
  return "rank " + std::to_string(g_rank);
}

inline void report(const std::string& message) {
  ++g_failures;
  if (g_failures <= 40) std::cerr << who() << ": FAIL: " << message << std::endl;
  if (g_failures == 41) std::cerr << who() << ": FAIL: (further failures not shown)" << std::endl;
}

inline void expect(bool ok, const std::string& message) {
  if (!ok) report(message);
}

}  // namespace krug_test
