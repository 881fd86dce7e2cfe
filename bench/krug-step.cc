// krug-step: the time of one "training step" of allreduces through krug's public C++ API, which
// measures negotiation and fusion rather than bandwidth.
//
//   krugrun -np 2 build/bench/krug-step --tensors 100 --tensor-bytes 1K   # 100 x 1 KiB
//   krugrun -np 2 build/bench/krug-step --tensors 1 --tensor-bytes 4K     # one 4 KiB op
//   krugrun -np 2 build/bench/krug-step --shapes bench/resnet50_gradients.txt
//
// A step submits every tensor with allreduce_async (float32, sum, out of place; each tensor has
// its own name, the same in every step, as a framework's gradients do) and then waits for all
// of them. --sync runs them one synchronous allreduce after the other instead. Timing is
// krug-bench's (bench/common/bench_util.h): the average step of the slowest rank. After timing,
// one more step checks every output element (rank r contributes r + 1).
#include <krug/krug.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "common/krug_main.h"

namespace {

constexpr const char* kUsage =
    "usage: krugrun -np N krug-step [--tensors N --tensor-bytes SIZE | --shapes FILE]\n"
    "                               [--sync] [--iters N] [--warmup N] [--target-seconds S]\n"
    "                               [--percentiles]\n"
    "\n"
    "  --tensors N          tensors per step (default 100)\n"
    "  --tensor-bytes SIZE  bytes of each tensor, float32 (default 1K)\n"
    "  --shapes FILE        the tensors of a gradient list instead (bench/resnet50_gradients.txt)\n"
    "  --sync               one synchronous allreduce after the other (default: submit all\n"
    "                       asynchronously, then wait for all)\n"
    "  --iters N            timed steps (default: enough for --target-seconds, at least 3)\n"
    "  --warmup N           untimed steps before the estimate (default 1)\n"
    "  --target-seconds S   timed seconds when --iters is not given (default 0.5)\n"
    "  --percentiles        then time as many steps one by one: the median, 90th and 99th\n"
    "                       percentile and the longest step of the slowest rank\n";

bench::Timing step_timing() {
  bench::Timing t;
  t.target_seconds = 0.5;
  return t;
}

struct Options {
  bench::StepTensors step;
  bool sync = false;
  bench::Timing timing = step_timing();
};

Options parse_args(int argc, char** argv) {
  Options o;
  bench::Flags flags(argc, argv, kUsage);
  for (std::string flag; flags.next(&flag);) {
    if (flag == "--sync" || flag == "--percentiles") {
      (flag == "--sync" ? o.sync : o.timing.percentiles) = true;
      continue;
    }
    if (!bench::parse_common_flag(flag, flags.value(flag), o.timing, &o.step))
      throw bench::UsageError("unknown option '" + flag + "'");
  }
  if (o.step.tensors < 1) throw bench::UsageError("--tensors must be at least 1");
  if (o.step.tensor_bytes < 4) throw bench::UsageError("--tensor-bytes must be at least 4");
  if (o.timing.iters && *o.timing.iters < 1) throw bench::UsageError("--iters must be >= 1");
  return o;
}

double slowest(double v) {
  krug::ReduceOptions o;
  o.op = krug::ReduceOp::kMax;
  krug::allreduce("krug-step/max", &v, &v, krug::DataType::kFloat64, {1}, o);
  return v;
}

class Step {
 public:
  Step(std::vector<bench::TensorSpec> tensors, bool sync)
      : tensors_(std::move(tensors)), sync_(sync) {
    options_.op = krug::ReduceOp::kSum;
    for (const auto& t : tensors_) {
      inputs_.emplace_back(static_cast<size_t>(t.elements), static_cast<float>(krug::rank() + 1));
      outputs_.emplace_back(static_cast<size_t>(t.elements), 0.0f);
      // Made once, as a training loop keeps its gradients' names: the step times krug's calls.
      names_.push_back("krug-step/" + t.name);
      shapes_.push_back({t.elements});
    }
    handles_.resize(tensors_.size());
  }

  void once() {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (sync_) {
        krug::allreduce(names_[i], inputs_[i].data(), outputs_[i].data(), krug::DataType::kFloat32,
                        shapes_[i], options_);
      } else {
        handles_[i] = krug::allreduce_async(names_[i], inputs_[i].data(), outputs_[i].data(),
                                            krug::DataType::kFloat32, shapes_[i], options_);
      }
    }
    if (!sync_)
      for (auto& h : handles_) h.wait();
  }

  // One more step on poisoned outputs; wrong elements of this rank.
  int64_t verify() {
    for (auto& out : outputs_) std::fill(out.begin(), out.end(), 0.0f);
    once();
    const int n = krug::size();
    const float expected = static_cast<float>(n * (n + 1) / 2);
    int64_t wrong = 0;
    for (const auto& out : outputs_)
      wrong += bench::count_not_equal(out.data(), static_cast<int64_t>(out.size()), expected);
    return wrong;
  }

 private:
  std::vector<bench::TensorSpec> tensors_;
  bool sync_;
  krug::ReduceOptions options_;
  std::vector<std::vector<float>> inputs_, outputs_;
  std::vector<std::string> names_;
  std::vector<krug::Shape> shapes_;
  std::vector<krug::Handle> handles_;
};

int run(const Options& o) {
  auto tensors = o.step.list();
  const int64_t count = static_cast<int64_t>(tensors.size());
  const int64_t bytes = 4 * bench::total_elements(tensors);
  const bool print = krug::rank() == 0;
  if (print) {
    const std::string what = o.step.describe(count);
    bench::print_step_header("krug-step", what, krug::size(),
                             o.sync ? "synchronous allreduce one after the other"
                                    : "allreduce_async for every tensor, then wait for all");
  }
  Step step(std::move(tensors), o.sync);
  auto timed = bench::time_operation(
      o.timing, [&] { step.once(); }, slowest, [] { krug::barrier(); });
  double wrong_here = static_cast<double>(step.verify());
  krug::ReduceOptions sum;
  sum.op = krug::ReduceOp::kSum;
  krug::allreduce("krug-step/wrong", &wrong_here, &wrong_here, krug::DataType::kFloat64, {1}, sum);
  const auto wrong = static_cast<int64_t>(wrong_here);
  if (print) bench::print_step_row(count, bytes, timed, wrong);
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = bench::parse_or_exit("krug-step", kUsage, parse_args, argc, argv);
  return bench::run_on_krug("krug-step", [&] { return run(o); });
}
