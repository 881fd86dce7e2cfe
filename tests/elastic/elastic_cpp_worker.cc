// An elastic worker on the framework-free C++ API (include/krug/elastic.h) for
// tests/elastic/test_elastic.py: its "model" is a vector every step adds the rank-averaged step
// number to, so after S steps every element must be exactly S (S + 1) / 2 whatever the number
// of ranks and however often the job was reset. A rollback that did not restore the state, or a
// step applied twice or skipped, changes the final value.
//
//   krugrun --host-discovery-script d.sh elastic_cpp_worker STEPS [STEP_MILLISECONDS]
#include <krug/elastic.h>
#include <krug/krug.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

class CounterState : public krug::elastic::State {
 public:
  int64_t step = 0;
  std::vector<double> model = std::vector<double>(1000, 0.0);

  void save() override {
    saved_step_ = step;
    saved_model_ = model;
    save_commit_count();
  }
  void restore() override {
    step = saved_step_;
    model = saved_model_;
    restore_commit_count();
  }
  void sync() override {
    krug::broadcast("counter.step", &step, krug::DataType::kInt64, {1}, 0);
    krug::broadcast("counter.model", model.data(), krug::DataType::kFloat64,
                    {static_cast<int64_t>(model.size())}, 0);
    save();
  }

 private:
  int64_t saved_step_ = 0;
  std::vector<double> saved_model_ = std::vector<double>(1000, 0.0);
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: elastic_cpp_worker STEPS [STEP_MILLISECONDS]\n");
    return 2;
  }
  const int64_t steps = std::atoll(argv[1]);
  const int step_ms = argc > 2 ? std::atoi(argv[2]) : 20;
  try {
    krug::init();
  } catch (const krug::elastic::WorkerRemoved& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 0;
  }
  CounterState state;
  const bool trained = krug::elastic::run(state, [&] {
    while (state.step < steps) {
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));  // the "compute"
      std::vector<double> grad(state.model.size(), static_cast<double>(state.step + 1));
      std::vector<double> avg(grad.size());
      krug::ReduceOptions average;
      average.op = krug::ReduceOp::kAverage;
      krug::allreduce("counter.grad", grad.data(), avg.data(), krug::DataType::kFloat64,
                      {static_cast<int64_t>(grad.size())}, average);
      for (size_t i = 0; i < avg.size(); ++i) state.model[i] += avg[i];
      ++state.step;
      state.commit();
      if (krug::rank() == 0)
        std::printf("step %lld committed\n", static_cast<long long>(state.step));
      std::fflush(stdout);
    }
  });
  if (!trained) return 0;  // the driver removed this worker
  const double expected = static_cast<double>(steps) * (steps + 1) / 2;
  for (double v : state.model)
    if (v != expected) {
      std::fprintf(stderr, "rank %d: model element %.1f, expected %.1f\n", krug::rank(), v,
                   expected);
      return 1;
    }
  if (krug::rank() == 0) std::printf("final value: %.1f (%d ranks)\n", expected, krug::size());
  krug::shutdown();
  return 0;
}
