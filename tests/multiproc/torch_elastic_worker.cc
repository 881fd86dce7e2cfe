// A rank of the LibTorch elastic state tests: `krugrun -np N krug_torch_elastic_worker <scenario>`.
//
// Uses only the public headers (krug/krug.h, krug/elastic.h, krug/torch.h). Scenarios train a
// small model with a BatchNorm layer (so there are buffers) under SGD with momentum and under
// Adam (so there is optimizer state), and check TorchState's save/restore/sync bitwise. Exit
// status 0 when every check held, 1 otherwise, 2 for a usage error; the last line of a passing
// rank is "rank R: <scenario> OK".
#include <krug/elastic.h>
#include <krug/krug.h>
#include <krug/torch.h>
#include <torch/torch.h>

#include "torch_worker_main.h"
#include "worker_checks.h"

#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using krug::torch::elastic::TorchState;
using torch::Tensor;

using krug_test::expect;
using krug_test::g_failures;
using krug_test::g_rank;
int g_size = 0;

// Bitwise: same layout and the same bytes (undefined counts as equal to undefined).
bool identical(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  return torch::equal(a.contiguous().flatten().view(torch::kUInt8),
                      b.contiguous().flatten().view(torch::kUInt8));
}

torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::BatchNorm1d(8),
                               torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        torch::nn::Sequential& model) {
  if (kind == "sgd")
    return std::make_unique<torch::optim::SGD>(model->parameters(),
                                               torch::optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) g.options().set_lr(lr);
}

// Batch k of `salt`'s data: 8 rows, fixed values.
std::pair<Tensor, Tensor> batch(int k, int salt) {
  auto x = torch::sin(torch::arange(48, torch::kFloat32).reshape({8, 6}) * 0.37f * (k + 1) + salt);
  return {x, torch::arange(8, torch::kInt64).remainder(3)};
}

Tensor loss_of(torch::nn::Sequential& model, int k, int salt) {
  auto [x, y] = batch(k, salt);
  return torch::nn::functional::cross_entropy(model->forward(x), y);
}

// Steps k = from .. to-1 through the DistributedOptimizer: every rank its own rows.
void train(torch::nn::Sequential& model, krug::torch::DistributedOptimizer& opt, int from, int to) {
  for (int k = from; k < to; ++k) {
    opt.zero_grad();
    loss_of(model, k, g_rank).backward();
    opt.step();
  }
}

// A parameter's key in the optimizer's state: torch 1.x keys it by the address of its
// TensorImpl as text (c10::guts::to_string, gone in 2.x), torch 2.x by the address itself.
// (A template, so that only the branch of this torch's key type is compiled.)
template <typename Optimizer>
auto state_key(Optimizer& opt, const Tensor& p) {
  using Key = typename std::decay_t<decltype(opt.state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << p.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// The optimizer's per-parameter state tensors, in parameter order (undefined: no state).
std::vector<Tensor> optimizer_tensors(torch::optim::Optimizer& opt) {
  std::vector<Tensor> out;
  for (auto& group : opt.param_groups())
    for (auto& p : group.params()) {
      auto it = opt.state().find(state_key(opt, p));
      if (it == opt.state().end()) {
        out.emplace_back();
        continue;
      }
      if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        out.push_back(s->momentum_buffer().clone());
      } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
        out.push_back(a->exp_avg().clone());
        out.push_back(a->exp_avg_sq().clone());
        out.push_back(torch::tensor(a->step(), torch::kInt64));
      }
    }
  return out;
}

// Everything TorchState keeps, copied.
struct Snapshot {
  std::vector<Tensor> model;  // parameters, then buffers
  std::vector<Tensor> optimizer;
  double lr = 0;
  std::map<std::string, int64_t> values;
  int64_t commits = 0;
};

Snapshot snapshot(torch::nn::Sequential& model, torch::optim::Optimizer& opt,
                  const TorchState& state) {
  Snapshot s;
  for (auto& p : model->parameters()) s.model.push_back(p.detach().clone());
  for (auto& b : model->buffers()) s.model.push_back(b.clone());
  s.optimizer = optimizer_tensors(opt);
  s.lr = opt.param_groups()[0].options().get_lr();
  s.values = state.values;
  s.commits = state.commits();
  return s;
}

bool same_tensors(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!identical(a[i], b[i])) return false;
  return true;
}

void expect_same(const Snapshot& got, const Snapshot& want, const std::string& what) {
  expect(same_tensors(got.model, want.model), what + ": parameters and buffers differ");
  expect(same_tensors(got.optimizer, want.optimizer), what + ": optimizer state differs");
  expect(got.lr == want.lr,
         what + ": learning rate " + std::to_string(got.lr) + ", want " + std::to_string(want.lr));
  expect(got.values == want.values, what + ": values differ");
  expect(got.commits == want.commits, what + ": commits() " + std::to_string(got.commits) +
                                          ", want " + std::to_string(want.commits));
}

// Every rank holds rank 0's bytes (allgather: another operation than the broadcasts of sync()).
void expect_identical_across_ranks(const std::vector<Tensor>& tensors, const std::string& what) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    expect(tensors[i].defined(), what + ": tensor " + std::to_string(i) + " undefined");
    if (!tensors[i].defined()) continue;
    auto bytes = tensors[i].contiguous().flatten().view(torch::kUInt8).unsqueeze(0);
    auto all = krug::torch::allgather(bytes, "cmp." + what + "." + std::to_string(i));
    for (int r = 1; r < g_size; ++r)
      expect(torch::equal(all[r], all[0]), what + ": tensor " + std::to_string(i) + " of rank " +
                                               std::to_string(r) + " differs from rank 0's");
  }
}

// ---- Scenarios

// save/restore roll back parameters, buffers, optimizer state and options, values and the commit
// count; training from a restored state replays the same steps bit for bit.
void save_restore(const std::string& kind) {
  auto model = make_model(7);
  auto opt = make_optimizer(kind, model);
  krug::torch::DistributedOptimizer dopt(*opt, model->named_parameters(), 1,
                                         krug::ReduceOp::kAverage, krug::kGlobalProcessSet,
                                         "sr." + kind + ".");
  TorchState state(*model, *opt);  // saved before any step: no optimizer state yet
  const Snapshot fresh = snapshot(model, *opt, state);
  std::vector<void*> storage;
  for (auto& p : model->parameters()) storage.push_back(p.data_ptr());

  train(model, dopt, 0, 3);
  const Snapshot three = snapshot(model, *opt, state);
  expect(!same_tensors(three.model, fresh.model), kind + ": training changed nothing");
  state.restore();
  expect(opt->state().empty(), kind + ": restore to a state without steps keeps optimizer state");
  expect_same(snapshot(model, *opt, state), fresh, kind + ": restore to the constructor's save");
  size_t i = 0;
  for (auto& p : model->parameters())
    expect(p.data_ptr() == storage[i++], kind + ": restore replaced a parameter's storage");
  train(model, dopt, 0, 3);
  expect_same(snapshot(model, *opt, state), three, kind + ": replay of steps 0..2");

  state.values = {{"epoch", 2}, {"batch", 3}};
  set_lr(*opt, 0.05);
  state.commit();
  const Snapshot committed = snapshot(model, *opt, state);
  expect(committed.commits == 1, kind + ": commits() after one commit");
  train(model, dopt, 3, 6);
  const Snapshot six = snapshot(model, *opt, state);
  expect(!same_tensors(six.optimizer, committed.optimizer), kind + ": steps changed no state");
  state.values["batch"] = 99;
  state.values["extra"] = 1;
  set_lr(*opt, 1.0);
  train(model, dopt, 6, 7);
  state.restore();
  expect_same(snapshot(model, *opt, state), committed, kind + ": restore to the commit");
  train(model, dopt, 3, 6);
  expect_same(snapshot(model, *opt, state), six, kind + ": replay of steps 3..5");
}

void scenario_save_restore() {
  save_restore("sgd");
  save_restore("adam");
}

// sync() makes every rank's model, optimizer and values rank 0's, leaves rank 0's alone and saves.
void sync(const std::string& kind) {
  auto model = make_model(100 + g_rank);
  auto opt = make_optimizer(kind, model);
  for (int k = 0; k <= g_rank; ++k) {  // local steps: every rank its own state
    opt->zero_grad();
    loss_of(model, k, 10 + g_rank).backward();
    opt->step();
  }
  set_lr(*opt, 0.01 * (g_rank + 1));
  TorchState state(*model, *opt);
  state.values = {{"epoch", g_rank}, {"batch", 10 + g_rank}, {"rank" + std::to_string(g_rank), 1}};
  const Snapshot mine = snapshot(model, *opt, state);

  state.sync();
  const Snapshot synced = snapshot(model, *opt, state);
  if (g_rank == 0) expect_same(synced, mine, kind + ": sync changed rank 0");
  expect_identical_across_ranks(synced.model, kind + ".model");
  expect_identical_across_ranks(synced.optimizer, kind + ".optimizer");
  expect(synced.lr == 0.01, kind + ": learning rate after sync " + std::to_string(synced.lr));
  const std::map<std::string, int64_t> rank0 = {{"epoch", 0}, {"batch", 10}, {"rank0", 1}};
  expect(synced.values == rank0, kind + ": values after sync are not rank 0's");

  // Data-parallel steps from the synced state keep the parameters and the optimizer state
  // identical (not the BatchNorm statistics: each rank's come from its own rows).
  krug::torch::DistributedOptimizer dopt(*opt, model->named_parameters(), 1,
                                         krug::ReduceOp::kAverage, krug::kGlobalProcessSet,
                                         "sync." + kind + ".");
  train(model, dopt, 0, 2);
  std::vector<Tensor> params;
  for (auto& p : model->parameters()) params.push_back(p.detach());
  expect_identical_across_ranks(params, kind + ".trained.parameters");
  expect_identical_across_ranks(optimizer_tensors(*opt), kind + ".trained.optimizer");

  // sync() saved: restore() returns to the synced state.
  state.values["epoch"] = 77;
  set_lr(*opt, 3.0);
  state.restore();
  expect_same(snapshot(model, *opt, state), synced, kind + ": restore after sync");
}

void scenario_sync() {
  sync("sgd");
  sync("adam");
}

// A TorchState whose next save() fails, as a commit interrupted by an error would.
class FailingSaveState : public TorchState {
 public:
  using TorchState::TorchState;
  bool fail_next_save = false;
  void save() override {
    if (fail_next_save) {
      fail_next_save = false;
      throw krug::Error("save failed on purpose");
    }
    TorchState::save();
  }
};

// commits() counts commits and rolls back with restore().
void scenario_commits() {
  auto model = make_model(3);
  auto opt = make_optimizer("sgd", model);
  krug::torch::DistributedOptimizer dopt(*opt, model->named_parameters(), 1,
                                         krug::ReduceOp::kAverage, krug::kGlobalProcessSet, "c.");
  FailingSaveState state(*model, *opt);
  expect(state.commits() == 0, "commits() before any commit");
  for (int k = 0; k < 3; ++k) {
    train(model, dopt, k, k + 1);
    state.values["batch"] = k + 1;
    state.commit();
    expect(state.commits() == k + 1, "commits() after commit " + std::to_string(k + 1));
  }
  const Snapshot third = snapshot(model, *opt, state);
  train(model, dopt, 3, 4);
  state.values["batch"] = 4;
  state.fail_next_save = true;
  bool threw = false;
  try {
    state.commit();
  } catch (const krug::Error&) {
    threw = true;
  }
  expect(threw, "a commit whose save() fails throws");
  expect(state.commits() == 4, "commits() counts the interrupted commit");
  state.restore();
  expect_same(snapshot(model, *opt, state), third, "restore after the interrupted commit");
  state.sync();
  expect(state.commits() == 3, "sync() keeps commits()");
}

// Outside elastic mode run() syncs from rank 0, calls the function once and lets errors through.
void scenario_run() {
  expect(!krug::elastic::enabled(), "elastic mode is off under plain krugrun");
  auto model = make_model(200 + g_rank);
  auto opt = make_optimizer("adam", model);
  TorchState state(*model, *opt);
  state.values = {{"epoch", 5 + g_rank}};
  int calls = 0;
  const bool finished = krug::elastic::run(state, [&] {
    ++calls;
    expect_identical_across_ranks(snapshot(model, *opt, state).model, "run.model");
    expect(state.values == std::map<std::string, int64_t>{{"epoch", 5}},
           "values inside run() are not rank 0's");
  });
  expect(finished, "run() returns true when the function returns");
  expect(calls == 1, "run() called the function " + std::to_string(calls) + " times");

  calls = 0;
  std::string error;
  try {
    krug::elastic::run(state, [&] {
      ++calls;
      throw krug::Error("train failed on purpose");
    });
  } catch (const krug::Error& e) {
    error = e.what();
  }
  expect(error == "train failed on purpose", "run() outside elastic mode let through: " + error);
  expect(calls == 1,
         "after an error run() called the function " + std::to_string(calls) + " times");
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::function<void()>> scenarios = {
      {"save_restore", scenario_save_restore},
      {"sync", scenario_sync},
      {"commits", scenario_commits},
      {"run", scenario_run},
  };
  return krug_test::run_torch_worker(argc, argv, "krug_torch_elastic_worker", scenarios, g_rank, g_size,
                                     g_failures);
}
