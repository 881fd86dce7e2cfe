// An elastic LibTorch worker for tests/elastic/test_elastic.py: linear regression trained with
// krug::torch::DistributedOptimizer (SGD with momentum) and committed in a
// krug::torch::elastic::TorchState. Each step's global batch is generated from the step number
// and split across the current ranks, so a run that is reset (fewer or more ranks) takes the
// same steps as an undisturbed one, up to float association; rank 0 prints the final weights'
// sum for the test to compare.
//
// Every step also makes unnamed LibTorch calls (an allreduce, an allgather and a broadcast with
// an empty name). Their names come from counters that every init() starts again, so after a
// round that adds a worker the survivors and the newcomer name them alike; were the counters
// to carry on over the reset, the newcomer's names would match no survivor's and the step would
// stall. A wrong result prints "unnamed ops: FAIL" and fails the worker.
//
//   krugrun --host-discovery-script d.sh elastic_torch_worker STEPS [STEP_MILLISECONDS
//       [HOLD_AT_STEP HOLD_FOR_WORKERS]]
//
// With HOLD_AT_STEP, the ranks wait after committing that step until the job has
// HOLD_FOR_WORKERS workers: a test that adds a host then sees the newcomer join however fast the
// steps run.
#include <krug/elastic.h>
#include <krug/krug.h>
#include <krug/torch.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

namespace {

constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3, 4 and 6 ranks
constexpr int64_t kFeatures = 16;

// The unnamed calls of one step; false (after saying why) when a result is wrong.
bool unnamed_ops_agree() {
  const int rank = krug::rank(), size = krug::size();
  krug::ReduceOptions sum;
  sum.op = krug::ReduceOp::kSum;
  const double count = krug::torch::allreduce(torch::ones({1}), "", sum).item<double>();
  const auto ranks = krug::torch::allgather(torch::full({1}, rank, torch::kInt64), "");
  auto root = torch::full({1}, rank == 0 ? 7 : -1, torch::kInt64);
  krug::torch::broadcast_(root, 0, "");
  if (count == size && torch::equal(ranks, torch::arange(size, torch::kInt64)) &&
      root.item<int64_t>() == 7)
    return true;
  std::ostringstream gathered;
  gathered << ranks.flatten();
  std::fprintf(stderr, "rank %d of %d: unnamed ops: FAIL: sum %g, allgather %s, broadcast %lld\n",
               rank, size, count, gathered.str().c_str(),
               static_cast<long long>(root.item<int64_t>()));
  return false;
}

// Waits until the job has `workers` workers. A new host raises HostsUpdatedInterrupt here on
// every rank; elastic::run re-forms the job and calls the training function again.
void hold_for(krug::elastic::State& state, int workers) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (krug::size() < workers) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "no %d workers after 120 s\n", workers);
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    state.check_host_updates();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: elastic_torch_worker STEPS [STEP_MILLISECONDS [HOLD_AT_STEP "
                 "HOLD_FOR_WORKERS]]\n");
    return 2;
  }
  const int64_t steps = std::atoll(argv[1]);
  const int step_ms = argc > 2 ? std::atoi(argv[2]) : 20;
  const int64_t hold_at = argc > 4 ? std::atoll(argv[3]) : -1;
  const int hold_workers = argc > 4 ? std::atoi(argv[4]) : 0;
  torch::manual_seed(7);
  try {
    krug::init();
  } catch (const krug::elastic::WorkerRemoved& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 0;
  }
  torch::set_num_threads(1);
  auto model = torch::nn::Linear(kFeatures, 1);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  krug::torch::DistributedOptimizer optimizer(sgd, model->named_parameters());
  krug::torch::elastic::TorchState state(*model, sgd);
  state.values["step"] = 0;
  const auto truth = torch::linspace(-1, 1, kFeatures).unsqueeze(1);

  const bool trained = krug::elastic::run(state, [&] {
    while (state.values["step"] < steps) {
      if (state.values["step"] == hold_at) hold_for(state, hold_workers);
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
      if (!unnamed_ops_agree()) std::exit(1);
      // The step's global batch, identical on every rank; this rank takes its slice.
      auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + state.values["step"]);
      const auto x = torch::randn({kGlobalBatch, kFeatures}, gen);
      const auto y = x.matmul(truth);
      const int64_t per_rank = kGlobalBatch / krug::size();
      const auto mine =
          torch::indexing::Slice(krug::rank() * per_rank, (krug::rank() + 1) * per_rank);
      optimizer.zero_grad();
      torch::mse_loss(model->forward(x.index({mine})), y.index({mine})).backward();
      optimizer.step();
      ++state.values["step"];
      state.commit();
      if (krug::rank() == 0)
        std::printf("step %lld committed\n", static_cast<long long>(state.values["step"]));
      std::fflush(stdout);
    }
  });
  if (!trained) return 0;
  if (krug::rank() == 0) {
    const double sum = model->weight.sum().item<double>() + model->bias.sum().item<double>();
    std::printf("final weight sum: %.9f after %lld steps (%d ranks)\n", sum,
                static_cast<long long>(state.values["step"]), krug::size());
  }
  krug::shutdown();
  return 0;
}
