// krugrun --check-build and --version: the report's layout (horovodrun's), and that the
// command line answers both without a command to run.
#include "run/build_report.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "krug/krug.h"
#include "krug/version.h"
#include "run/options.h"

namespace krug::run {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(BuildReport, ListsWhatWasBuiltWithVersions) {
  const std::string r = build_report({"1.2.3", "2.15.0", "", true, "", "no TensorFlow here"});
  EXPECT_TRUE(contains(r, "krug v1.2.3:\n\nAvailable Frameworks:\n")) << r;
  EXPECT_TRUE(contains(r, "    [X] PyTorch (built against torch 2.15.0)\n")) << r;
  EXPECT_TRUE(contains(r, "    [ ] TensorFlow (no TensorFlow here)\n")) << r;
  EXPECT_TRUE(contains(r, "Available Controllers:\n    [X] MPI\n    [X] Gloo\n")) << r;
  EXPECT_TRUE(contains(r, "Available Tensor Operations:\n    [ ] NCCL\n")) << r;
  EXPECT_TRUE(contains(r, "    [X] Shared memory (ranks of one host)\n")) << r;
}

TEST(BuildReport, SaysWhyABindingWasNotBuilt) {
  const std::string r =
      build_report({"1.2.3", "", "torch 1.12.1 is not supported", false, "2.21.0", ""});
  EXPECT_TRUE(contains(r, "    [X] TensorFlow (built against TensorFlow 2.21.0)\n")) << r;
  EXPECT_TRUE(contains(r, "    [ ] PyTorch (torch 1.12.1 is not supported)\n")) << r;
  EXPECT_TRUE(contains(r, "Available Controllers:\n    [ ] MPI\n    [X] Gloo\n")) << r;
}

TEST(BuildReport, ThisBuildIsTheGeneratedConfiguration) {
  const BuildFeatures f = this_build();
  EXPECT_EQ(f.version, KRUG_VERSION);
  EXPECT_EQ(f.mpi, krug::mpi_built());
  // Exactly one of the two says what happened to the torch binding.
  EXPECT_NE(f.torch_version.empty(), f.torch_problem.empty());
  EXPECT_NE(f.tensorflow_version.empty(), f.tensorflow_problem.empty());
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
