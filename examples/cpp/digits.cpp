// Data-parallel training with krug's LibTorch C++ API on scikit-learn's bundled digits data set
// (1797 8x8 images of handwritten digits, 64 pixel values 0..16 and a label per CSV row).
//
//   krugrun -np 4 build/examples/krug-example-digits-cpp [path/to/digits.csv.gz]
//
// Every rank loads the whole file, shuffles it with the same seed and splits it 80/20 into a
// training and a held-out test set (identical on every rank), then trains on its own shard of
// the training set (rows rank, rank + size, ...). The model starts from rank 0's weights
// (broadcast_parameters) and krug::torch::DistributedOptimizer averages the gradients across
// ranks during backward, so every rank takes the same steps as one process would on the global
// batch. Each epoch, rank 0 prints the training loss and the held-out accuracy, both computed
// over every rank's shard and combined with allreduce. Exits 1 if the final held-out accuracy is
// below 0.95, 2 if the data cannot be read.
#include <krug/krug.h>
#include <krug/torch.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "digits_common.h"

namespace {

constexpr int kEpochs = 25;
constexpr int64_t kGlobalBatch = 64;  // split across ranks: the same steps for any rank count
constexpr double kLearningRate = 0.1;
constexpr uint64_t kSplitSeed = 20240601;

using digits::DataSet;
using digits::index_tensor;
using digits::kDefaultPath;
using digits::LoadError;
using digits::load_digits;
using digits::Mlp;
using digits::permutation;

int run(int argc, char** argv) {
  const int rank = krug::rank();
  const int size = krug::size();
  const std::string path = argc > 1 ? argv[1] : kDefaultPath;

  DataSet all;
  try {
    all = load_digits(path);
  } catch (const LoadError& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 2;
  }
  const int64_t n = all.x.size(0);
  const int64_t n_train = n * 8 / 10;
  const auto perm = permutation(n, kSplitSeed);
  const std::vector<int64_t> train_idx(perm.begin(), perm.begin() + n_train);
  const std::vector<int64_t> test_idx(perm.begin() + n_train, perm.end());

  // This rank's shards: rows rank, rank + size, ... of the training and the test set.
  std::vector<int64_t> my_train, my_test;
  for (size_t i = rank; i < train_idx.size(); i += size) my_train.push_back(train_idx[i]);
  for (size_t i = rank; i < test_idx.size(); i += size) my_test.push_back(test_idx[i]);
  const torch::Tensor train_x = all.x.index_select(0, index_tensor(my_train));
  const torch::Tensor train_y = all.y.index_select(0, index_tensor(my_train));
  const torch::Tensor test_x = all.x.index_select(0, index_tensor(my_test));
  const torch::Tensor test_y = all.y.index_select(0, index_tensor(my_test));

  // Every rank must take the same number of steps (each step is a set of allreduces): the
  // smallest shard decides; the rows beyond it on larger shards are reached by the per-epoch
  // shuffle.
  const int64_t batch = std::max<int64_t>(1, kGlobalBatch / size);
  const int64_t min_shard = n_train / size;
  const int64_t steps = (min_shard + batch - 1) / batch;
  if (rank == 0)
    std::printf("digits: %lld rows (%lld train, %lld test), %d rank(s), %lld rows per rank, batch "
                "%lld per rank, %lld steps per epoch\n",
                static_cast<long long>(n), static_cast<long long>(n_train),
                static_cast<long long>(n - n_train), size, static_cast<long long>(min_shard),
                static_cast<long long>(batch), static_cast<long long>(steps));

  torch::manual_seed(1000 + rank);  // different on every rank: broadcast_parameters fixes that
  auto model = std::make_shared<Mlp>();
  krug::torch::broadcast_parameters(*model, /*root_rank=*/0);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(kLearningRate).momentum(0.9));
  krug::torch::DistributedOptimizer optimizer(sgd, model->named_parameters());

  double accuracy = 0;
  for (int epoch = 1; epoch <= kEpochs; ++epoch) {
    model->train();
    // Step decay: a smaller learning rate for the last epochs settles the weights.
    if (epoch == 16 || epoch == 22)
      for (auto& group : sgd.param_groups())
        static_cast<torch::optim::SGDOptions&>(group.options()).lr(
            static_cast<torch::optim::SGDOptions&>(group.options()).lr() * 0.2);
    const auto order = permutation(train_x.size(0), kSplitSeed + 1000 * epoch + rank);
    double loss_sum = 0;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t begin = s * batch;
      const int64_t end = std::min(begin + batch, min_shard);
      const auto rows = index_tensor(std::vector<int64_t>(order.begin() + begin, order.begin() + end));
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(train_x.index_select(0, rows)),
                                                       train_y.index_select(0, rows));
      loss.backward();  // the gradient allreduces start here, parameter by parameter
      optimizer.step();
      loss_sum += loss.item<double>();
    }

    // Loss: average over ranks. Accuracy: correct predictions and rows summed over ranks.
    model->eval();
    torch::NoGradGuard no_grad;
    const auto correct = model->forward(test_x).argmax(1).eq(test_y).sum().to(torch::kFloat64);
    krug::ReduceOptions sum;
    sum.op = krug::ReduceOp::kSum;
    const auto counts = krug::torch::allreduce(
        torch::stack({correct, torch::tensor(static_cast<double>(test_x.size(0)), torch::kFloat64)}),
        "digits.eval", sum);
    accuracy = counts[0].item<double>() / counts[1].item<double>();
    const double loss = krug::torch::allreduce(torch::tensor(loss_sum / steps, torch::kFloat64),
                                               "digits.loss")
                            .item<double>();
    if (rank == 0)
      std::printf("epoch %2d  train loss %.4f  test accuracy %.4f\n", epoch, loss, accuracy);
  }
  if (rank == 0) {
    std::printf("final test accuracy: %.4f (%d rank(s))\n", accuracy, size);
    std::fflush(stdout);
  }
  if (accuracy < 0.95) {
    std::fprintf(stderr, "rank %d: test accuracy %.4f is below 0.95\n", rank, accuracy);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);  // one core per rank: ranks are the parallelism here
    krug::init();
    const int code = run(argc, argv);
    krug::shutdown();
    return code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "digits: %s\n", e.what());
    return 1;
  }
}
