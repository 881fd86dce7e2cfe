// krugrun --check-build and --version: the report's layout (horovodrun's), and that the
// command line answers both without a command to run.
#include "run/cli/build_report.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <variant>

#include "krug/krug.h"
#include "krug/version.h"
#include "run/cli/options.h"

namespace krug::run {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

BuildFeatures features(std::string version, std::string torch, std::string torch_problem,
                       bool mpi) {
  BuildFeatures f;
  f.version = std::move(version);
  f.torch_version = std::move(torch);
  f.torch_problem = std::move(torch_problem);
  f.mpi = mpi;
  return f;
}

TEST(BuildReport, ListsWhatWasBuiltWithVersions) {
  BuildFeatures f = features("1.2.3", "2.15.0", "", true);
  f.tensorflow_problem = "no TensorFlow here";
  f.jax_version = "0.10.2";
  const std::string r = build_report(f);
  EXPECT_TRUE(contains(r, "    [X] JAX (built against JAX 0.10.2)\n")) << r;
  EXPECT_TRUE(contains(r, "krug v1.2.3:\n\nAvailable Frameworks:\n")) << r;
  EXPECT_TRUE(contains(r, "    [X] PyTorch (built against torch 2.15.0)\n")) << r;
  EXPECT_TRUE(contains(r, "    [ ] TensorFlow (no TensorFlow here)\n")) << r;
  EXPECT_TRUE(contains(r, "Available Controllers:\n    [X] MPI\n    [X] Gloo\n")) << r;
  EXPECT_TRUE(contains(r, "Available Tensor Operations:\n    [ ] NCCL\n")) << r;
  EXPECT_TRUE(contains(r, "    [X] Shared memory (ranks of one host)\n")) << r;
  EXPECT_TRUE(contains(r, "Available Devices:\n    [ ] CUDA\n")) << r;
}

TEST(BuildReport, ListsCudaAndNcclWithVersionsOrWhyNot) {
  BuildFeatures f = features("1.2.3", "", "not wanted", false);
  f.cuda_version = "13.0";
  f.nccl_version = "2.28.9 (loaded: 2.28.9)";
  std::string r = build_report(f);
  EXPECT_TRUE(contains(r, "    [X] NCCL (2.28.9 (loaded: 2.28.9))\n")) << r;
  EXPECT_TRUE(contains(r, "    [X] CUDA (CUDA 13.0)\n")) << r;
  f = features("1.2.3", "", "not wanted", false);
  f.cuda_problem = "nvcc was not found";
  f.nccl_problem = "needs CUDA";
  r = build_report(f);
  EXPECT_TRUE(contains(r, "    [ ] NCCL (needs CUDA)\n")) << r;
  EXPECT_TRUE(contains(r, "    [ ] CUDA (nvcc was not found)\n")) << r;
}

TEST(BuildReport, SaysWhyABindingWasNotBuilt) {
  BuildFeatures f = features("1.2.3", "", "torch 1.12.1 is not supported", false);
  f.tensorflow_version = "2.21.0";
  const std::string r = build_report(f);
  EXPECT_TRUE(contains(r, "    [X] TensorFlow (built against TensorFlow 2.21.0)\n")) << r;
  EXPECT_TRUE(contains(r, "    [ ] PyTorch (torch 1.12.1 is not supported)\n")) << r;
  EXPECT_TRUE(contains(r, "    [ ] JAX\n")) << r;
  EXPECT_TRUE(contains(r, "Available Controllers:\n    [ ] MPI\n    [X] Gloo\n")) << r;
}

TEST(BuildReport, ThisBuildIsTheGeneratedConfiguration) {
  const BuildFeatures f = this_build();
  EXPECT_EQ(f.version, KRUG_VERSION);
  EXPECT_EQ(f.mpi, krug::mpi_built());
  EXPECT_EQ(f.cuda_version.empty(), !krug::cuda_built());
  EXPECT_EQ(f.nccl_version.empty(), !krug::nccl_built());
  EXPECT_EQ(krug::nccl_version_code() == 0, !krug::nccl_built());
  if (krug::nccl_built()) {  // "2.28.9 (loaded: ...)" is 22809, as nccl.h encodes it since 2.9
    int major = 0, minor = 0, patch = 0;
    ASSERT_EQ(std::sscanf(f.nccl_version.c_str(), "%d.%d.%d", &major, &minor, &patch), 3);
    EXPECT_EQ(krug::nccl_version_code(), major * 10000 + minor * 100 + patch) << f.nccl_version;
  }
  // A feature not built says why.
  EXPECT_NE(f.cuda_version.empty(), f.cuda_problem.empty());
  EXPECT_NE(f.nccl_version.empty(), f.nccl_problem.empty());
  // Exactly one of the two says what happened to the torch binding.
  EXPECT_NE(f.torch_version.empty(), f.torch_problem.empty());
  EXPECT_NE(f.tensorflow_version.empty(), f.tensorflow_problem.empty());
  EXPECT_NE(f.jax_version.empty(), f.jax_problem.empty());
  EXPECT_EQ(version_line(f), std::string("krugrun ") + KRUG_VERSION);
}

TEST(BuildReport, CommandLineAnswersWithoutACommand) {
  for (const char* flag : {"--check-build", "--version"}) {
    const char* argv[] = {"krugrun", flag};
    testing::internal::CaptureStdout();
    auto parsed = parse_command_line(2, argv);
    const std::string out = testing::internal::GetCapturedStdout();
    ASSERT_TRUE(std::holds_alternative<int>(parsed)) << flag;
    EXPECT_EQ(std::get<int>(parsed), 0) << flag;
    EXPECT_TRUE(contains(out, KRUG_VERSION)) << flag << ": " << out;
  }
}

}  // namespace
}  // namespace krug::run
