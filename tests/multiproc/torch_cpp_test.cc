// The LibTorch C++ API (include/krug/torch.h) with real ranks:
// `krugrun -np N krug_torch_cpp_worker <scenario>` for N = 1, 2, 3, and the digits example with
// 2 ranks. The worker checks every value itself and prints "rank R: <scenario> OK" last; these
// tests assert krugrun's exit code and those lines (and the example's accuracy line).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
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

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `krugrun -np N <program> <args>` with stdout and stderr captured in files.
struct JobResult {
  int code = -1;  // krugrun's exit code; -1 when it ran past kRunTimeout (it was killed)
  std::string out, err;
  std::string output() const {
    std::string all = "--- stdout ---\n" + out + "--- stderr ---\n" + err;
    return all.size() > 12000 ? "...\n" + all.substr(all.size() - 12000) : all;
  }
  bool rank_printed(int r, const std::string& text) const {
    const std::string prefix = "[" + std::to_string(r) + "]<stdout>:";
    std::stringstream ss(out);
    for (std::string line; std::getline(ss, line);)
      if (line.rfind(prefix, 0) == 0 && line.find(text) != std::string::npos) return true;
    return false;
  }
};

JobResult krugrun(int np, const std::vector<std::string>& program) {
  std::random_device rd;
  const fs::path dir = fs::temp_directory_path() /
                       ("krugtorch" + std::to_string(::getpid()) + "x" + std::to_string(rd()));
  fs::create_directories(dir);
  std::vector<std::string> args{KRUGRUN_PATH, "-np", std::to_string(np)};
  args.insert(args.end(), program.begin(), program.end());
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    int out = ::open((dir / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = ::open((dir / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(KRUGRUN_PATH, argv.data());
    ::_exit(126);
  }
  JobResult run;
  for (;;) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      run.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (std::chrono::steady_clock::now() - start > kRunTimeout) {
      ::kill(pid, SIGKILL);  // the ranks die with it (PR_SET_PDEATHSIG)
      ::waitpid(pid, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(20ms);  // test code: polling a child is simplest
  }
  run.out = read_file(dir / "out");
  run.err = read_file(dir / "err");
  std::error_code ec;
  fs::remove_all(dir, ec);
  return run;
}

JobResult expect_passes(int np, const std::string& scenario) {
  JobResult run = krugrun(np, {KRUG_TORCH_WORKER_PATH, scenario});
  EXPECT_NE(run.code, -1) << scenario << " -np " << np << " did not finish\n" << run.output();
  EXPECT_EQ(run.code, 0) << scenario << " -np " << np << "\n" << run.output();
  for (int r = 0; r < np; ++r)
    EXPECT_TRUE(run.rank_printed(r, "rank " + std::to_string(r) + ": " + scenario + " OK"))
        << "rank " << r << " did not report success\n" << run.output();
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
      EXPECT_TRUE(run.rank_printed(r, op)) << "rank " << r << " " << op << "\n" << run.output();
    }
  for (int r = 0; r < np; ++r)
    EXPECT_TRUE(run.rank_printed(r, odd)) << "rank " << r << "'s errors do not name " << odd << "\n"
                                          << run.output();
}

INSTANTIATE_TEST_SUITE_P(Np, TorchCppMultiRank, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "np" + std::to_string(info.param);
                         });

// The example trains to at least 95% held-out accuracy with 2 ranks (it also checks that itself).
TEST(DigitsExample, TwoRanksReachNinetyFivePercent) {
  JobResult run = krugrun(2, {KRUG_DIGITS_EXAMPLE_PATH});
  ASSERT_EQ(run.code, 0) << run.output();
  std::smatch m;
  const std::regex final_line(R"(\[0\]<stdout>:final test accuracy: ([0-9.]+) \(2 rank\(s\)\))");
  ASSERT_TRUE(std::regex_search(run.out, m, final_line)) << run.output();
  const double accuracy = std::stod(m[1]);
  std::cout << "digits, 2 ranks: held-out accuracy " << accuracy << std::endl;
  EXPECT_GE(accuracy, 0.95) << run.output();
}

}  // namespace
