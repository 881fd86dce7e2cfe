// The LibTorch C++ API (include/krug/torch.h) with real ranks:
// `krugrun -np N krug_torch_cpp_worker <scenario>` for N = 1, 2, 3, and the digits example with
// 2 ranks. The worker checks every value itself and prints "rank R: <scenario> OK" last; these
// tests assert krugrun's exit code and those lines (and the example's accuracy line).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "krugrun_process.h"

#include <chrono>
#include <memory>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr auto kRunTimeout = 180s;

using namespace krug::testing;

JobResult krugrun(int np, const std::vector<std::string>& program) {
  return run_job(KRUGRUN_PATH, np, program, kRunTimeout);
}

JobResult expect_passes(int np, const std::string& scenario) {
  JobResult run = krugrun(np, {KRUG_TORCH_WORKER_PATH, scenario});
  EXPECT_NE(run.code, -1) << scenario << " -np " << np << " did not finish\n" << run->output();
  EXPECT_EQ(run.code, 0) << scenario << " -np " << np << "\n" << run->output();
  for (int r = 0; r < np; ++r)
    EXPECT_TRUE(run->rank_printed(r, "rank " + std::to_string(r) + ": " + scenario + " OK"))
        << "rank " << r << " did not report success\n" << run->output();
  return run;
}

class TorchCpp : public ::testing::TestWithParam<int> {};

TEST_P(TorchCpp, CollectivesOnEveryDtype) { expect_passes(GetParam(), "ops"); }
TEST_P(TorchCpp, BroadcastParametersMakesModelsIdentical) {
  expect_passes(GetParam(), "broadcast_parameters");
}
TEST_P(TorchCpp, DistributedOptimizerMatchesSingleProcessTraining) {
  expect_passes(GetParam(), "optimizer");
}
TEST_P(TorchCpp, TwoBackwardPassesPerStepMatchTheDoubledBatch) {
  expect_passes(GetParam(), "passes2");
}

INSTANTIATE_TEST_SUITE_P(Np, TorchCpp, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "np" + std::to_string(info.param);
                         });

class TorchCppMultiRank : public ::testing::TestWithParam<int> {};

// Every rank gets krug::Error (from allreduce, allgather and DistributedOptimizer::step()) naming
// the tensor and the odd rank, and the job goes on.
TEST_P(TorchCppMultiRank, MismatchedShapesThrowOnEveryRank) {
  const int np = GetParam();
  JobResult run = expect_passes(np, "mismatch");
  const std::string odd = "rank " + std::to_string(np - 1);
  for (int r = 0; r < np; ++r)
    for (const char* op : {"allreduce error:", "allgather error:", "optimizer error:"}) {
      EXPECT_TRUE(run->rank_printed(r, op)) << "rank " << r << " " << op << "\n" << run->output();
    }
  for (int r = 0; r < np; ++r)
    EXPECT_TRUE(run->rank_printed(r, odd)) << "rank " << r << "'s errors do not name " << odd << "\n"
                                          << run->output();
}

INSTANTIATE_TEST_SUITE_P(Np, TorchCppMultiRank, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "np" + std::to_string(info.param);
                         });

// The example trains to at least 95% held-out accuracy with 2 ranks (it also checks that itself).
TEST(DigitsExample, TwoRanksReachNinetyFivePercent) {
  JobResult run = krugrun(2, {KRUG_DIGITS_EXAMPLE_PATH});
  ASSERT_EQ(run.code, 0) << run->output();
  const std::regex final_line(R"(\[0\]<stdout>:final test accuracy: ([0-9.]+) \(2 rank\(s\)\))");
  const double accuracy = final_accuracy(run, final_line);
  ASSERT_GE(accuracy, 0.0) << "no final accuracy line\n" << run->output();
  std::cout << "digits, 2 ranks: held-out accuracy " << accuracy << std::endl;
  EXPECT_GE(accuracy, 0.95) << run->output();
}

}  // namespace
