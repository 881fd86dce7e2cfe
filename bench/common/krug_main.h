// The body of main() for the benchmarks that run on krug (krug-bench, krug-step): initialize,
// run, shut down, and turn an exception into a message naming the tool and the rank.
#pragma once

#include <krug/krug.h>

#include <cstdio>
#include <exception>

namespace bench {

template <class Run>
int run_on_krug(const char* tool, Run&& run) {
  try {
    krug::init();
    int rc = run();
    krug::shutdown();
    return rc;
  } catch (const std::exception& e) {
    int rank = -1;
    try {
      if (krug::is_initialized()) rank = krug::rank();
    } catch (...) {
      // The rank is only for the message; the first error is the one to report.
    }
    std::fprintf(stderr, "%s: rank %d: %s\n", tool, rank, e.what());
    return 1;
  }
}

}  // namespace bench
