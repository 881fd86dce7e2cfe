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
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr const char* kDefaultPath =
    "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
constexpr int kFeatures = 64;
constexpr int kClasses = 10;
constexpr int kEpochs = 25;
constexpr int64_t kGlobalBatch = 64;  // split across ranks: the same steps for any rank count
constexpr double kLearningRate = 0.1;
constexpr uint64_t kSplitSeed = 20240601;

struct DataSet {
  torch::Tensor x;  // [n, 64] float32 in [0, 1]
  torch::Tensor y;  // [n] int64
};

struct LoadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads the gzip-compressed CSV with zlib: 64 pixel values (0..16) then the label per line.
DataSet load_digits(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f)
    throw LoadError("cannot open " + path +
                    "; it comes with scikit-learn: apt-get install python3-sklearn, or pass the "
                    "path of digits.csv.gz as the first argument");
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  std::string line;
  char buf[4096];
  int line_no = 0;
  while (gzgets(f, buf, sizeof buf)) {
    line = buf;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    ++line_no;
    if (line.empty()) continue;
    std::vector<double> values;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) {
      try {
        values.push_back(std::stod(cell));
      } catch (const std::exception&) {
        gzclose(f);
        throw LoadError(path + ":" + std::to_string(line_no) + ": not a number: '" + cell + "'");
      }
    }
    if (values.size() != kFeatures + 1) {
      gzclose(f);
      throw LoadError(path + ":" + std::to_string(line_no) + ": expected " +
                      std::to_string(kFeatures + 1) + " values, got " +
                      std::to_string(values.size()));
    }
    for (int i = 0; i < kFeatures; ++i) pixels.push_back(static_cast<float>(values[i] / 16.0));
    const auto label = static_cast<int64_t>(values[kFeatures]);
    if (label < 0 || label >= kClasses) {
      gzclose(f);
      throw LoadError(path + ":" + std::to_string(line_no) + ": label out of range");
    }
    labels.push_back(label);
  }
  int err = Z_OK;
  const char* msg = gzerror(f, &err);
  const bool failed = err != Z_OK && err != Z_STREAM_END;
  const std::string zmsg = msg ? msg : "";
  gzclose(f);
  if (failed) throw LoadError("reading " + path + ": " + zmsg);
  if (labels.empty()) throw LoadError(path + ": no rows");
  const auto n = static_cast<int64_t>(labels.size());
  return {torch::from_blob(pixels.data(), {n, kFeatures}, torch::kFloat32).clone(),
          torch::from_blob(labels.data(), {n}, torch::kInt64).clone()};
}

// Fisher-Yates with a fixed-seed mt19937_64 (whose output the standard fixes): the same
// permutation on every rank and every platform, unlike std::shuffle's unspecified algorithm.
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  std::mt19937_64 gen(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[gen() % static_cast<uint64_t>(i + 1)]);
  return p;
}

torch::Tensor index_tensor(const std::vector<int64_t>& idx) {
  return torch::tensor(idx, torch::kInt64);
}

struct Mlp : torch::nn::Module {
  Mlp() : fc1(register_module("fc1", torch::nn::Linear(kFeatures, 128))),
          fc2(register_module("fc2", torch::nn::Linear(128, kClasses))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

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
