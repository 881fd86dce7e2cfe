// What both digits examples (digits.cpp, elastic_digits.cpp) share: reading scikit-learn's
// digits CSV, a portable permutation, and the model.
#pragma once

#include <torch/torch.h>
#include <zlib.h>

#include <cstdint>
#include <exception>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace digits {

constexpr const char* kDefaultPath =
    "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
constexpr int kFeatures = 64;
constexpr int kClasses = 10;

struct DataSet {
  torch::Tensor x;  // [n, 64] float32 in [0, 1]
  torch::Tensor y;  // [n] int64
};

struct LoadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads the gzip-compressed CSV with zlib: 64 pixel values (0..16) then the label per line.
inline DataSet load_digits(const std::string& path) {
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
inline std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  std::mt19937_64 gen(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[gen() % static_cast<uint64_t>(i + 1)]);
  return p;
}

inline torch::Tensor index_tensor(const std::vector<int64_t>& idx) {
  return torch::tensor(idx, torch::kInt64);
}

struct Mlp : torch::nn::Module {
  Mlp()
      : fc1(register_module("fc1", torch::nn::Linear(kFeatures, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, kClasses))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

}  // namespace digits
