// krug::torch::elastic::TorchState (include/krug/torch.h).
#include <fmt/format.h>

#include <sstream>

#include "krug/torch.h"

namespace krug::torch::elastic {
namespace {

std::string serialize(::torch::optim::Optimizer& optimizer) {
  ::torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void deserialize(::torch::optim::Optimizer& optimizer, const std::string& bytes) {
  ::torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  optimizer.load(archive);
}

std::string encode(const std::map<std::string, int64_t>& values) {
  std::string out;
  for (const auto& [k, v] : values) out += fmt::format("{}={}\n", k, v);
  return out;
}

std::map<std::string, int64_t> decode(const std::string& text) {
  std::map<std::string, int64_t> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.rfind('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = std::stoll(line.substr(eq + 1));
  }
  return out;
}

// Rank 0's bytes on every rank: the length first, so the others can size their buffer.
std::string broadcast_bytes(const std::string& name, std::string bytes) {
  int64_t n = static_cast<int64_t>(bytes.size());
  krug::broadcast(name + ".size", &n, DataType::kInt64, {1}, 0);
  bytes.resize(static_cast<size_t>(n));
  krug::broadcast(name, bytes.data(), DataType::kUInt8, {n}, 0);
  return bytes;
}

}  // namespace

TorchState::TorchState(::torch::nn::Module& model, ::torch::optim::Optimizer& optimizer)
    : model_(model), optimizer_(optimizer) {
  save();
}

std::vector<::torch::Tensor> TorchState::model_tensors() const {
  std::vector<::torch::Tensor> out;
  for (const auto& item : model_.named_parameters(/*recurse=*/true)) out.push_back(item.value());
  for (const auto& item : model_.named_buffers(/*recurse=*/true))
    if (item.value().defined()) out.push_back(item.value());
  return out;
}

void TorchState::save() {
  ::torch::NoGradGuard no_grad;
  saved_tensors_.clear();
  for (const auto& t : model_tensors()) saved_tensors_.push_back(t.detach().clone());
  saved_optimizer_ = serialize(optimizer_);
  saved_values_ = values;
  save_commit_count();
}

void TorchState::restore() {
  ::torch::NoGradGuard no_grad;
  const auto tensors = model_tensors();
  if (tensors.size() != saved_tensors_.size())
    throw Error(
        fmt::format("TorchState::restore: the model has {} tensors, the commit {}: the "
                    "model changed shape since the commit",
                    tensors.size(), saved_tensors_.size()));
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(saved_tensors_[i]);
  deserialize(optimizer_, saved_optimizer_);
  values = saved_values_;
  restore_commit_count();
}

void TorchState::sync() {
  broadcast_parameters(model_, 0);
  const std::string optimizer =
      broadcast_bytes("elastic.torch_state.optimizer", serialize(optimizer_));
  if (krug::rank() != 0) deserialize(optimizer_, optimizer);
  values = decode(broadcast_bytes("elastic.torch_state.values", encode(values)));
  save();
}

}  // namespace krug::torch::elastic
