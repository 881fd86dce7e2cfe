// A rank of the LibTorch C++ API tests: `krugrun -np N krug_torch_cpp_worker <scenario>`.
//
// Uses only the public headers (krug/krug.h, krug/torch.h). Each scenario computes what every
// rank must see (small integers for the collectives, a single-process reference training for the
// optimizer), checks it and prints one line per failed check. Exit status 0 when everything held,
// 1 otherwise, 2 for a usage error; the last line of a passing rank is "rank R: <scenario> OK".
#include <krug/krug.h>
#include <krug/torch.h>
#include <torch/torch.h>

#include "torch_worker_main.h"
#include "worker_checks.h"

#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using krug_test::expect;
using krug_test::g_failures;
using krug_test::g_rank;
int g_size = 0;

std::string str(const torch::Tensor& t) {
  std::ostringstream os;
  os << t.to(torch::kDouble).flatten();
  std::string s = os.str();
  for (auto& c : s)
    if (c == '\n') c = ' ';
  return s;
}

void expect_equal(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  const bool ok = got.sizes() == want.sizes() && got.scalar_type() == want.scalar_type() &&
                  torch::equal(got, want);
  expect(ok, what + ": expected " + std::string(c10::toString(want.scalar_type())) + " " +
                 str(want) + ", got " + std::string(c10::toString(got.scalar_type())) + " " +
                 str(got));
}

const std::vector<torch::ScalarType> kAllTypes = {
    torch::kUInt8,    torch::kInt8,     torch::kInt16,   torch::kInt32,   torch::kInt64,
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    torch::kUInt16,   torch::kUInt32,   torch::kUInt64,
#endif
    torch::kFloat16,  torch::kBFloat16, torch::kFloat32, torch::kFloat64, torch::kBool};

// Rank r's value at element i: small integers, exact in every dtype (bool: parity).
torch::Tensor values(int r, torch::ScalarType type, std::vector<int64_t> shape = {2, 3}) {
  const int64_t n = c10::multiply_integers(shape);
  auto v = torch::arange(n, torch::kDouble).add(1).mul(r + 1).remainder(7).reshape(shape);
  if (type == torch::kBool) return v.remainder(2).eq(1);
  return v.to(type);
}

// ---- Scenarios

void scenario_ops() {
  krug::ReduceOptions sum, max, min;
  sum.op = krug::ReduceOp::kSum;
  max.op = krug::ReduceOp::kMax;
  min.op = krug::ReduceOp::kMin;
  for (auto type : kAllTypes) {
    const std::string tn = c10::toString(type);
    const auto mine = values(g_rank, type);
    // Expected results, from every rank's values (computed locally).
    auto e_sum = torch::zeros({2, 3}, torch::kDouble);
    auto e_max = values(0, type).to(torch::kDouble);
    auto e_min = e_max.clone();
    for (int r = 0; r < g_size; ++r) {
      auto v = values(r, type).to(torch::kDouble);
      e_sum += v;
      e_max = torch::maximum(e_max, v);
      e_min = torch::minimum(e_min, v);
    }
    auto as_type = [&](const torch::Tensor& d) {
      return type == torch::kBool ? d.ne(0) : d.to(type);
    };
    // Out of place: the input is unchanged.
    auto in = mine.clone();
    expect_equal(krug::torch::allreduce(in, "ops.sum." + tn, sum), as_type(e_sum), "sum " + tn);
    expect_equal(in, mine, "allreduce input left unchanged " + tn);
    expect_equal(krug::torch::allreduce(mine, "ops.max." + tn, max), as_type(e_max), "max " + tn);
    // In place.
    auto t = mine.clone();
    auto& same = krug::torch::allreduce_(t, "ops.min." + tn, min);
    expect(&same == &t, "allreduce_ returns its argument");
    expect_equal(t, as_type(e_min), "min in place " + tn);
    if (torch::isFloatingType(type)) {
      // Average: the sum is a multiple of the size for these inputs? Not always; compare with
      // the float64 average rounded to the type.
      auto avg = krug::torch::allreduce(mine, "ops.avg." + tn);
      expect(torch::allclose(avg.to(torch::kDouble), e_sum / g_size, 1e-2, 1e-2),
             "average " + tn + ": expected " + str(e_sum / g_size) + ", got " + str(avg));
    }

    // Allgather: rank r sends r + 1 rows of [.., 2].
    auto rows = values(g_rank, type, {g_rank + 1, 2});
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < g_size; ++r) parts.push_back(values(r, type, {r + 1, 2}));
    expect_equal(krug::torch::allgather(rows, "ops.gather." + tn), torch::cat(parts),
                 "allgather " + tn);

    // Broadcast from the last rank: out of place leaves the input alone, in place overwrites.
    const int root = g_size - 1;
    auto b = mine.clone();
    expect_equal(krug::torch::broadcast(b, root, "ops.bcast." + tn), values(root, type),
                 "broadcast " + tn);
    expect_equal(b, mine, "broadcast input left unchanged " + tn);
    krug::torch::broadcast_(b, root, "ops.bcast_.." + tn);
    expect_equal(b, values(root, type), "broadcast_ " + tn);
  }

  // Non-contiguous tensors, in place and out of place.
  {
    auto base = values(g_rank, torch::kFloat32, {3, 4});
    auto e = torch::zeros({3, 4}, torch::kFloat32);
    for (int r = 0; r < g_size; ++r) e += values(r, torch::kFloat32, {3, 4});
    auto tr = base.clone().t();  // [4, 3], not contiguous
    expect(!tr.is_contiguous(), "transpose is not contiguous");
    expect_equal(krug::torch::allreduce(tr, "ops.nc", sum), e.t().contiguous(), "non-contiguous");
    krug::torch::allreduce_(tr, "ops.nc_", sum);
    expect_equal(tr.contiguous(), e.t().contiguous(), "non-contiguous in place");
    auto col = values(g_rank, torch::kFloat64, {4, 3}).t();  // broadcast in place, strided
    krug::torch::broadcast_(col, 0, "ops.nc_bcast");
    expect_equal(col.contiguous(), values(0, torch::kFloat64, {4, 3}).t().contiguous(),
                 "non-contiguous broadcast_");
  }

  // Many asynchronous allreduces in flight, out of place and in place, then unnamed calls.
  {
    std::vector<krug::torch::TensorHandle> hs;
    std::vector<torch::Tensor> inplace;
    for (int k = 0; k < 20; ++k) {
      hs.push_back(krug::torch::allreduce_async(torch::full({k + 1}, g_rank + k, torch::kFloat64),
                                                "ops.async." + std::to_string(k), sum));
      inplace.push_back(torch::full({5}, g_rank * 2.0, torch::kFloat32));
      hs.push_back(krug::torch::allreduce_async_(inplace.back(), "ops.async_." + std::to_string(k),
                                                 sum));
    }
    const double rank_sum = g_size * (g_size - 1) / 2.0;
    for (int k = 0; k < 20; ++k) {
      auto got = hs[2 * k].wait();
      expect_equal(got, torch::full({k + 1}, rank_sum + g_size * k, torch::kFloat64), "async");
      expect(hs[2 * k].poll() && hs[2 * k].error().empty(), "async handle done without error");
      hs[2 * k + 1].wait();
      expect_equal(inplace[k], torch::full({5}, 2.0 * rank_sum, torch::kFloat32), "async in place");
    }
    for (int k = 0; k < 3; ++k)
      expect_equal(krug::torch::allreduce(torch::ones({2}), "", sum), torch::full({2}, g_size * 1.0f),
                   "unnamed allreduce");
  }
}

struct Small : torch::nn::Module {
  Small() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 3));
    unused = register_parameter("unused", torch::ones({2}));
    register_buffer("steps", torch::zeros({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor unused;
};

std::shared_ptr<Small> make_model(uint64_t seed) {
  torch::manual_seed(seed);
  auto m = std::make_shared<Small>();
  m->to(torch::kFloat64);
  return m;
}

// Every rank holds the same values: allgather each parameter and compare the rows bitwise.
void expect_identical_across_ranks(torch::nn::Module& m, const std::string& what) {
  for (const auto& item : m.named_parameters()) {
    auto flat = item.value().detach().flatten().unsqueeze(0);
    auto all = krug::torch::allgather(flat, "identical." + what + "." + item.key());
    for (int r = 0; r < g_size; ++r)
      expect(torch::equal(all[r], flat[0]),
             what + ": parameter " + item.key() + " differs between rank " + std::to_string(r) +
                 " and rank " + std::to_string(g_rank));
  }
}

void scenario_broadcast_parameters() {
  auto reference = make_model(100);  // what rank 0 starts from
  auto model = make_model(100 + g_rank);
  if (g_size > 1)
    expect(!torch::equal(model->fc1->weight, reference->fc1->weight) || g_rank == 0,
           "models start different");
  model->named_buffers()["steps"].fill_(g_rank + 5);
  krug::torch::broadcast_parameters(*model, 0);
  for (const auto& item : reference->named_parameters())
    expect_equal(model->named_parameters()[item.key()].detach(), item.value().detach(),
                 "broadcast_parameters(module) " + item.key());
  expect_equal(model->named_buffers()["steps"], torch::full({1}, 5.0, torch::kFloat64),
               "broadcast_parameters buffer");
  expect_identical_across_ranks(*model, "bcast_module");
  // The list form, from the last rank; parameters still require grad afterwards.
  auto other = make_model(200 + g_rank);
  auto root_model = make_model(200 + g_size - 1);
  krug::torch::broadcast_parameters(other->parameters(), g_size - 1);
  const auto want = root_model->parameters();
  const auto got = other->parameters();
  for (size_t i = 0; i < want.size(); ++i) {
    expect_equal(got[i].detach(), want[i].detach(), "broadcast_parameters(list) " + std::to_string(i));
    expect(got[i].requires_grad(), "parameter still requires grad");
  }
  // The named form.
  auto named = make_model(300 + g_rank);
  krug::torch::broadcast_parameters(named->named_parameters(), 0);
  expect_equal(named->fc2->bias.detach(), make_model(300)->fc2->bias.detach(),
               "broadcast_parameters(named)");
}

// Batch k of the global data: identical on every rank (its own generator and seed).
std::pair<torch::Tensor, torch::Tensor> global_batch(int k, int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + k);
  auto x = torch::randn({rows, 5}, gen, torch::TensorOptions().dtype(torch::kFloat64));
  auto y = torch::randint(0, 3, {rows}, gen, torch::TensorOptions().dtype(torch::kInt64));
  return {x, y};
}

// DistributedOptimizer with `passes` backward passes per step on this rank's `per_rank` rows
// must match plain SGD on the whole global batch in one process.
void optimizer_matches_reference(int passes, const std::string& tag) {
  constexpr int kSteps = 5;
  const int64_t per_rank = 4;
  const int64_t global = per_rank * g_size;
  auto reference = make_model(100);
  torch::optim::SGD ref_sgd(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto model = make_model(100 + g_rank);
  krug::torch::broadcast_parameters(*model, 0);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  krug::torch::DistributedOptimizer opt(sgd, model->named_parameters(), passes,
                                        krug::ReduceOp::kAverage, krug::kGlobalProcessSet,
                                        tag + ".");
  expect(opt.backward_passes_per_step() == passes, "backward_passes_per_step()");
  for (int k = 0; k < kSteps; ++k) {
    auto [x, y] = global_batch(k, global);
    ref_sgd.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    ref_sgd.step();

    opt.zero_grad();
    const int64_t chunk = per_rank / passes;
    for (int p = 0; p < passes; ++p) {
      const int64_t begin = g_rank * per_rank + p * chunk;
      torch::nn::functional::cross_entropy(model->forward(x.slice(0, begin, begin + chunk)),
                                           y.slice(0, begin, begin + chunk))
          .backward();
    }
    opt.step();
  }
  for (const auto& item : reference->named_parameters()) {
    auto got = model->named_parameters()[item.key()].detach();
    auto want = item.value().detach();
    const double diff = (got - want).abs().max().item<double>();
    expect(diff < 1e-12, tag + ": parameter " + item.key() + " differs from the single-process "
                             "reference by " + std::to_string(diff));
  }
  // The unused parameter got zero gradients: unchanged.
  expect_equal(model->unused.detach(), torch::ones({2}, torch::kFloat64), tag + ": unused parameter");
  expect_identical_across_ranks(*model, tag);

  // More backward passes than announced before step() is an error, raised from backward.
  bool threw = false;
  auto [x, y] = global_batch(99, global);
  opt.zero_grad();
  try {
    for (int p = 0; p <= passes; ++p)
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  } catch (const std::exception& e) {
    threw = std::string(e.what()).find("backward_passes_per_step") != std::string::npos;
    if (!threw) std::cout << "unexpected error: " << e.what() << std::endl;
  }
  expect(threw, tag + ": too many backward passes must throw");
  opt.synchronize();  // drains what the hooks started: the job goes on
  bool zero_grad_threw = false;
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();  // starts allreduces
  if (passes == 1) {
    try {
      opt.zero_grad();
    } catch (const krug::Error&) {
      zero_grad_threw = true;
    }
    expect(zero_grad_threw, tag + ": zero_grad() with allreduces in flight must throw");
  }
  opt.synchronize();
}

void scenario_optimizer() {
  optimizer_matches_reference(1, "opt1");
}

void scenario_passes2() {
  optimizer_matches_reference(2, "opt2");
}

// The last rank's tensors have another shape: every rank gets krug::Error naming the tensor.
void scenario_mismatch() {
  const bool odd = g_rank == g_size - 1;
  try {
    krug::torch::allreduce(torch::ones({odd ? 4 : 3}), "mm.t");
    expect(false, "mismatched allreduce did not throw");
  } catch (const krug::Error& e) {
    const std::string m = e.what();
    std::cout << "allreduce error: " << m << std::endl;
    expect(m.find("Mismatched shapes") != std::string::npos && m.find("mm.t") != std::string::npos,
           "error message: " + m);
  }
  try {
    krug::torch::allgather(torch::ones({2, odd ? 3 : 2}), "mm.g");
    expect(false, "mismatched allgather did not throw");
  } catch (const krug::Error& e) {
    std::cout << "allgather error: " << e.what() << std::endl;
  }
  // DistributedOptimizer: the last rank's layer has 3 outputs, the others' 2.
  torch::manual_seed(1);
  auto layer = torch::nn::Linear(4, odd ? 3 : 2);
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.1));
  krug::torch::DistributedOptimizer opt(sgd, layer->named_parameters(), 1, krug::ReduceOp::kAverage,
                                        krug::kGlobalProcessSet, "mm.opt.");
  const auto before = layer->weight.detach().clone();
  layer->forward(torch::ones({1, 4})).sum().backward();
  try {
    opt.step();
    expect(false, "DistributedOptimizer::step() with mismatched shapes did not throw");
  } catch (const krug::Error& e) {
    const std::string m = e.what();
    std::cout << "optimizer error: " << m << std::endl;
    const bool names_tensor = m.find("mm.opt.weight") != std::string::npos ||
                              m.find("mm.opt.bias") != std::string::npos;
    expect(m.find("Mismatched shapes") != std::string::npos && names_tensor,
           "optimizer error message: " + m);
  }
  expect_equal(layer->weight.detach(), before, "no step after a failed synchronize");
  // The job goes on.
  krug::ReduceOptions sum;
  sum.op = krug::ReduceOp::kSum;
  expect_equal(krug::torch::allreduce(torch::ones({2}), "mm.after", sum),
               torch::full({2}, 1.0f * g_size), "allreduce after the errors");
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::function<void()>> scenarios = {
      {"ops", scenario_ops},
      {"broadcast_parameters", scenario_broadcast_parameters},
      {"optimizer", scenario_optimizer},
      {"passes2", scenario_passes2},
      {"mismatch", scenario_mismatch},
  };
  return krug_test::run_torch_worker(argc, argv, "krug_torch_cpp_worker", scenarios, g_rank, g_size,
                                     g_failures);
}
