// net::require_open_files: a job too large for this host's open-file limit fails at start with
// the limit and the fix, instead of "Too many open files" from accept() half-way through.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <string>

#include "krug/types.h"
#include "net/limits.h"

namespace krug::net {
namespace {

// Lowers this process's limits for good: run in a death test's child only. Exits 0 when both
// functions behave, else a code saying which check failed.
void check_limits_in_child() {
  const rlimit low{64, 256};
  if (setrlimit(RLIMIT_NOFILE, &low) != 0) std::exit(3);
  if (raise_open_file_limit() != 256) std::exit(4);
  require_open_files(200, "nothing");  // within the raised limit: no error
  try {
    require_open_files(5000, "rank 0's control plane (a connection per rank, 4096 ranks)");
    std::exit(5);
  } catch (const Error& e) {
    const std::string m = e.what();
    const bool says_all = m.find("rank 0's control plane") != std::string::npos &&
                          m.find("5000") != std::string::npos &&
                          m.find("only 256") != std::string::npos &&
                          m.find("ulimit") != std::string::npos;
    std::exit(says_all ? 0 : 6);
  }
}

TEST(OpenFiles, RaisesTheSoftLimitToTheHardOneAndNamesAShortfall) {
  EXPECT_EXIT(check_limits_in_child(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace krug::net
