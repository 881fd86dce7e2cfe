// krug::torch::elastic::TorchState (include/krug/torch.h) with real ranks:
// `krugrun -np N krug_torch_elastic_worker <scenario>` for N = 2, 3, and the elastic digits
// example with 2 ranks outside elastic mode. The worker checks every value itself and prints
// "rank R: <scenario> OK" last; these tests assert krugrun's exit code and those lines.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "krugrun_process.h"

namespace {

using namespace std::chrono_literals;
using krug::testing::final_accuracy;
using krug::testing::JobResult;
using krug::testing::run_job;

constexpr auto kRunTimeout = 180s;

JobResult krugrun(int np, const std::vector<std::string>& program) {
  return run_job(KRUGRUN_PATH, np, program, kRunTimeout);
}

void expect_passes(int np, const std::string& scenario) {
  JobResult run = krugrun(np, {KRUG_TORCH_ELASTIC_WORKER_PATH, scenario});
  EXPECT_NE(run.code, -1) << scenario << " -np " << np << " did not finish\n" << run->output();
  EXPECT_EQ(run.code, 0) << scenario << " -np " << np << "\n" << run->output();
  for (int r = 0; r < np; ++r)
    EXPECT_TRUE(run->rank_printed(r, "rank " + std::to_string(r) + ": " + scenario + " OK"))
        << "rank " << r << " did not report success\n"
        << run->output();
}

class TorchState : public ::testing::TestWithParam<int> {};

TEST_P(TorchState, SaveRestoreRollsBackModelAndOptimizer) {
  expect_passes(GetParam(), "save_restore");
}
TEST_P(TorchState, SyncMakesEveryRankRankZeros) {
  expect_passes(GetParam(), "sync");
}
TEST_P(TorchState, CommitsRollBackWithTheState) {
  expect_passes(GetParam(), "commits");
}
TEST_P(TorchState, RunOutsideElasticModeSyncsThenTrainsOnce) {
  expect_passes(GetParam(), "run");
}

INSTANTIATE_TEST_SUITE_P(Np, TorchState, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "np" + std::to_string(info.param);
                         });

// Without the elastic driver the example trains like digits.cpp (it also checks 95% itself).
TEST(ElasticDigitsExample, TwoRanksWithoutElasticModeReachNinetyFivePercent) {
  JobResult run = krugrun(2, {KRUG_ELASTIC_DIGITS_EXAMPLE_PATH});
  ASSERT_EQ(run.code, 0) << run->output();
  const std::regex final_line(R"(\[0\]<stdout>:final accuracy: ([0-9.]+))");
  const double accuracy = final_accuracy(run, final_line);
  ASSERT_GE(accuracy, 0.0) << "no final accuracy line\n" << run->output();
  std::cout << "elastic digits, 2 ranks: held-out accuracy " << accuracy << std::endl;
  EXPECT_GE(accuracy, 0.95) << run->output();
}

}  // namespace
