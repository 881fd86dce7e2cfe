// krug::torch::elastic::TorchState (include/krug/torch.h): a LibTorch model and its optimizer
// as elastic training state.
//
// Parameters and buffers are kept as tensors (copied into the same saved tensors on every
// commit, no allocation in the steady state); the optimizer and `values` are kept serialized,
// because an optimizer's per-parameter state has a type only the optimizer knows (SGD's momentum
// buffer, Adam's moments and step), and its own save()/load() is the one generic way to deep-copy
// it. The same bytes are what sync() broadcasts from rank 0.
#include <fmt/format.h>

#include <sstream>

#include "krug/torch.h"

namespace krug::torch::elastic {
namespace {

using at::Tensor;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
namespace ser = ::torch::serialize;

// Every parameter and defined buffer, recursively, in the module's order. The prefixes keep a
// parameter and a buffer of the same dotted name apart.
NamedTensors model_tensors(::torch::nn::Module& model) {
  NamedTensors out;
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    out.emplace_back("param." + item.key(), item.value());
  for (const auto& item : model.named_buffers(/*recurse=*/true))
    if (item.value().defined()) out.emplace_back("buffer." + item.key(), item.value());
  return out;
}

bool same_layout(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type();
}

std::string group_key(size_t i) {
  return fmt::format("group.{}", i);
}

std::string serialize_rest(const ::torch::optim::Optimizer& optimizer,
                           const std::map<std::string, int64_t>& values) {
  ser::OutputArchive archive;
  ser::OutputArchive optimizer_archive;
  optimizer.save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  // Optimizer::load() of LibTorch 1.13 reads the groups' options but does not apply them, so
  // the learning rate and the rest are written (and applied) per group here.
  const auto& groups = optimizer.param_groups();
  archive.write("groups", c10::IValue(static_cast<int64_t>(groups.size())));
  for (size_t i = 0; i < groups.size(); ++i) {
    ser::OutputArchive options;
    groups[i].options().serialize(options);
    archive.write(group_key(i), options);
  }
  c10::Dict<std::string, int64_t> dict;
  for (const auto& [key, value] : values) dict.insert(key, value);
  archive.write("values", c10::IValue(dict));
  std::ostringstream bytes;
  archive.save_to(bytes);
  return std::move(bytes).str();
}

void load_rest(const std::string& bytes, ::torch::optim::Optimizer& optimizer,
               std::map<std::string, int64_t>& values) {
  ser::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  c10::IValue groups;
  archive.read("groups", groups);
  auto& mine = optimizer.param_groups();
  if (groups.toInt() != static_cast<int64_t>(mine.size()))
    throw Error(
        fmt::format("TorchState: the saved optimizer has {} parameter group(s), this one {}",
                    groups.toInt(), mine.size()));
  ser::InputArchive optimizer_archive;
  archive.read("optimizer", optimizer_archive);
  // load() only adds entries: a parameter that had no state when saved (no step yet) must lose
  // the state it has now.
  optimizer.state().clear();
  optimizer.load(optimizer_archive);
  for (size_t i = 0; i < mine.size(); ++i) {
    ser::InputArchive options;
    archive.read(group_key(i), options);
    mine[i].options().serialize(options);
  }
  c10::IValue dict;
  archive.read("values", dict);
  values.clear();
  for (const auto& item : dict.toGenericDict())
    values[item.key().toStringRef()] = item.value().toInt();
}

}  // namespace

TorchState::TorchState(::torch::nn::Module& model, ::torch::optim::Optimizer& optimizer)
    : model_(model), optimizer_(optimizer) {
  TorchState::save();  // not virtual here: a subclass is not constructed yet
}

void TorchState::save() {
  ::torch::NoGradGuard no_grad;
  const NamedTensors now = model_tensors(model_);
  bool reuse = now.size() == saved_tensors_.size();
  for (size_t i = 0; reuse && i < now.size(); ++i)
    reuse = now[i].first == saved_tensors_[i].first &&
            same_layout(now[i].second, saved_tensors_[i].second);
  if (reuse) {
    for (size_t i = 0; i < now.size(); ++i) saved_tensors_[i].second.copy_(now[i].second);
  } else {
    saved_tensors_.clear();
    for (const auto& [name, t] : now) saved_tensors_.emplace_back(name, t.detach().clone());
  }
  saved_rest_ = serialize_rest(optimizer_, values);
  save_commit_count();
}

void TorchState::restore() {
  ::torch::NoGradGuard no_grad;
  const NamedTensors now = model_tensors(model_);
  // Check everything before writing anything: a mismatch leaves the model as it was.
  if (now.size() != saved_tensors_.size())
    throw Error(
        fmt::format("TorchState::restore: the model has {} parameters and buffers, {} "
                    "were saved",
                    now.size(), saved_tensors_.size()));
  for (size_t i = 0; i < now.size(); ++i)
    if (now[i].first != saved_tensors_[i].first ||
        !same_layout(now[i].second, saved_tensors_[i].second))
      throw Error(fmt::format("TorchState::restore: '{}' does not match the saved '{}'",
                              now[i].first, saved_tensors_[i].first));
  for (size_t i = 0; i < now.size(); ++i) {
    Tensor target = now[i].second.detach();  // same storage: the optimizer's tensors stay valid
    target.copy_(saved_tensors_[i].second);
  }
  load_rest(saved_rest_, optimizer_, values);
  restore_commit_count();
}

void TorchState::sync() {
  broadcast_parameters(model_, /*root_rank=*/0);
  std::string bytes;
  if (krug::rank() == 0) bytes = serialize_rest(optimizer_, values);
  int64_t size = static_cast<int64_t>(bytes.size());
  krug::broadcast("krug.elastic.torch_state.size", &size, DataType::kInt64, {1}, 0);
  bytes.resize(static_cast<size_t>(size));
  krug::broadcast("krug.elastic.torch_state.bytes", bytes.data(), DataType::kUInt8, {size}, 0);
  if (krug::rank() != 0) load_rest(bytes, optimizer_, values);
  save();
}

}  // namespace krug::torch::elastic
