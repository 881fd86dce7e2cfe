// Elastic data-parallel training with krug's LibTorch C++ API on scikit-learn's digits data set:
// the elastic version of digits.cpp.
//
//   krugrun -np 2 build/examples/krug-example-elastic-digits-cpp [path/to/digits.csv.gz]
//   krugrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./hosts.sh
//       build/examples/krug-example-elastic-digits-cpp          (one command line)
//
// The model, the optimizer and two counters (values "epoch" and "batch") live in a
// krug::torch::elastic::TorchState, committed after every step; krug::elastic::run() calls
// train() again after a reset (a failed or added worker), from the last commit and with the new
// rank layout. Without the elastic driver, run() syncs once and calls train() once.
//
// Each epoch visits the training set in an order fixed by the epoch number (the same on every
// rank), cut into global batches of kGlobalBatch rows; of each global batch, rank r of size
// ranks trains on the r-th of size equal slices. So the steps are the same for any number of
// ranks, and after a reset the slice is computed again from the new rank and size and training
// goes on from values["batch"] of values["epoch"]. Rank 0 prints each epoch's training loss and
// held-out accuracy (computed over every rank's shard of the test set) and then
// "final accuracy: A". Exits 1 if A is below 0.95 or kGlobalBatch is not divisible by the
// number of ranks, 2 if the data cannot be read.
#include <krug/elastic.h>
#include <krug/krug.h>
#include <krug/torch.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "digits_common.h"

namespace {

constexpr int64_t kEpochs = 25;
constexpr int64_t kGlobalBatch = 64;  // split across ranks: the same steps for any rank count
constexpr double kLearningRate = 0.1;
constexpr uint64_t kSplitSeed = 20240601;

// Step decay, a function of the epoch alone so that a restart at any epoch sets it right.
double learning_rate(int64_t epoch) {
  if (epoch >= 21) return kLearningRate * 0.04;
  if (epoch >= 15) return kLearningRate * 0.2;
  return kLearningRate;
}

// The training and the held-out rows (indices into the data set), the same on every rank.
struct Split {
  std::vector<int64_t> train, test;
};

Split split(int64_t n) {
  const auto perm = digits::permutation(n, kSplitSeed);
  const int64_t n_train = n * 8 / 10;
  return {{perm.begin(), perm.begin() + n_train}, {perm.begin() + n_train, perm.end()}};
}

class Trainer {
 public:
  Trainer(const digits::DataSet& data, const Split& rows)
      : data_(data),
        rows_(rows),
        model_(std::make_shared<digits::Mlp>()),
        sgd_(model_->parameters(), torch::optim::SGDOptions(kLearningRate).momentum(0.9)),
        optimizer_(sgd_, model_->named_parameters()),
        state_(*model_, sgd_) {
    state_.values = {{"epoch", 0}, {"batch", 0}};
  }

  krug::torch::elastic::TorchState& state() { return state_; }
  double final_accuracy() const { return final_accuracy_; }

  // Called by krug::elastic::run(), again after every reset: everything that depends on the rank
  // layout is computed here.
  void train() {
    const int rank = krug::rank(), size = krug::size();
    if (kGlobalBatch % size != 0)
      throw std::runtime_error("the global batch of " + std::to_string(kGlobalBatch) +
                               " rows cannot be split evenly across " + std::to_string(size) +
                               " ranks");
    const int64_t batch = kGlobalBatch / size;
    const int64_t n_train = static_cast<int64_t>(rows_.train.size());
    const int64_t steps = n_train / kGlobalBatch;  // the last partial global batch is skipped
    if (rank == 0)
      std::printf(
          "elastic digits: %d rank(s), batch %lld per rank, %lld steps per epoch, from "
          "epoch %lld batch %lld (commit %lld)\n",
          size, static_cast<long long>(batch), static_cast<long long>(steps),
          static_cast<long long>(state_.values["epoch"] + 1),
          static_cast<long long>(state_.values["batch"]), static_cast<long long>(state_.commits()));

    for (int64_t epoch = state_.values["epoch"]; epoch < kEpochs; epoch = state_.values["epoch"]) {
      model_->train();
      for (auto& group : sgd_.param_groups()) group.options().set_lr(learning_rate(epoch));
      const auto order = digits::permutation(n_train, kSplitSeed + 1000 * (epoch + 1));
      double loss_sum = 0;
      int64_t loss_count = 0;
      for (int64_t s = state_.values["batch"]; s < steps; ++s) {
        // This rank's slice of global batch s.
        std::vector<int64_t> mine;
        for (int64_t i = s * kGlobalBatch + rank * batch; i < s * kGlobalBatch + (rank + 1) * batch;
             ++i)
          mine.push_back(rows_.train[order[i]]);
        const auto idx = digits::index_tensor(mine);
        optimizer_.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(
            model_->forward(data_.x.index_select(0, idx)), data_.y.index_select(0, idx));
        loss.backward();  // the gradient allreduces start here
        optimizer_.step();
        loss_sum += loss.item<double>();
        ++loss_count;
        state_.values["batch"] = s + 1;
        state_.commit();
      }
      // Every rank took the same steps since the last reset: average the loss over them.
      const double loss =
          krug::torch::allreduce(
              torch::tensor(loss_count ? loss_sum / loss_count : 0.0, torch::kFloat64),
              "elastic_digits.loss")
              .item<double>();
      const double accuracy = evaluate();
      if (rank == 0)
        std::printf("epoch %2lld  train loss %.4f  test accuracy %.4f\n",
                    static_cast<long long>(epoch + 1), loss, accuracy);
      state_.values["epoch"] = epoch + 1;
      state_.values["batch"] = 0;
      state_.commit();
    }
    // Evaluated here, not kept from the last epoch: a reset after the last commit lands here.
    final_accuracy_ = evaluate();
    if (rank == 0) {
      std::printf("final accuracy: %.4f (%d rank(s), %lld commits)\n", final_accuracy_, size,
                  static_cast<long long>(state_.commits()));
      std::fflush(stdout);
    }
  }

 private:
  // Held-out accuracy: correct predictions and rows of every rank's shard of the test set
  // (rows rank, rank + size, ...), summed over ranks.
  double evaluate() {
    const int rank = krug::rank(), size = krug::size();
    std::vector<int64_t> mine;
    for (size_t i = rank; i < rows_.test.size(); i += size) mine.push_back(rows_.test[i]);
    const auto idx = digits::index_tensor(mine);
    model_->eval();
    torch::NoGradGuard no_grad;
    const auto correct = model_->forward(data_.x.index_select(0, idx))
                             .argmax(1)
                             .eq(data_.y.index_select(0, idx))
                             .sum()
                             .to(torch::kFloat64);
    krug::ReduceOptions sum;
    sum.op = krug::ReduceOp::kSum;
    const auto counts = krug::torch::allreduce(
        torch::stack({correct, torch::tensor(static_cast<double>(mine.size()), torch::kFloat64)}),
        "elastic_digits.eval", sum);
    return counts[0].item<double>() / counts[1].item<double>();
  }

  const digits::DataSet& data_;
  const Split& rows_;
  std::shared_ptr<digits::Mlp> model_;
  torch::optim::SGD sgd_;
  krug::torch::DistributedOptimizer optimizer_;  // hooks on model_'s parameters
  krug::torch::elastic::TorchState state_;
  double final_accuracy_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);  // one core per rank: ranks are the parallelism here
    krug::init();
    const std::string path = argc > 1 ? argv[1] : digits::kDefaultPath;
    digits::DataSet data;
    try {
      data = digits::load_digits(path);
    } catch (const digits::LoadError& e) {
      std::fprintf(stderr, "rank %d: %s\n", krug::rank(), e.what());
      return 2;
    }
    const Split rows = split(data.x.size(0));
    // Different initial weights on every rank: run()'s first sync makes them rank 0's.
    torch::manual_seed(1000 + krug::rank());
    Trainer trainer(data, rows);
    if (!krug::elastic::run(trainer.state(), [&] { trainer.train(); })) {
      return 0;  // the driver took this worker out of the job
    }
    const int rank = krug::rank();
    krug::shutdown();
    if (trainer.final_accuracy() < 0.95) {
      std::fprintf(stderr, "rank %d: test accuracy %.4f is below 0.95\n", rank,
                   trainer.final_accuracy());
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic digits: %s\n", e.what());
    return 1;
  }
}
