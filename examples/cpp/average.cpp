// Averaging a tensor across ranks with krug's C++ API, the way data-parallel training averages
// gradients; then a short allgather and broadcast.
//
//   krugrun -np 2 build/examples/krug-example-average
//
// Every rank fills 1,000,000 float32 values from its rank, averages them with allreduce, and
// compares the result with the average it computes itself from the formula. It exits non-zero
// when any rank saw a wrong value.
#include <krug/krug.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

namespace {

constexpr int64_t kCount = 1'000'000;

// Rank r's value at index i. Every rank can compute every other rank's values, so the expected
// average is known without communication.
double gradient(int r, int64_t i) {
  return std::sin(static_cast<double>(i) * 0.001) * (r + 1) + 0.25 * r;
}

// Allreduce-average of a real tensor. Returns true if the result matches the local computation.
bool average_demo(int rank, int size) {
  std::vector<float> grad(kCount);
  for (int64_t i = 0; i < kCount; ++i) grad[i] = static_cast<float>(gradient(rank, i));

  // In place, op Average (the default): the result is the mean over all ranks.
  krug::allreduce("example/grad", grad.data(), grad.data(), krug::DataType::kFloat32, {kCount});

  double checksum = 0, max_error = 0;
  for (int64_t i = 0; i < kCount; ++i) {
    double expected = 0;
    for (int r = 0; r < size; ++r) expected += static_cast<float>(gradient(r, i));
    expected /= size;
    double err = std::fabs(static_cast<double>(grad[i]) - expected);
    if (!(err <= max_error)) max_error = std::isnan(err) ? INFINITY : err;  // NaN counts as wrong
    checksum += grad[i];
  }
  // float32 rounding: each value is below size + 1 in magnitude.
  const double tolerance = 1e-6 * (size + 1) * std::max(1, size);
  bool ok = max_error <= tolerance;
  std::printf("rank %d/%d: averaged %lld floats, checksum %.6f, max error %.3g%s\n", rank, size,
              static_cast<long long>(kCount), checksum, max_error, ok ? "" : "  WRONG");
  return ok;
}

// Allgather: rank r contributes r + 1 rows of 3 int32 values; everyone receives all rows.
bool allgather_demo(int rank, int size) {
  const int64_t rows = rank + 1;
  std::vector<int32_t> mine;
  for (int64_t row = 0; row < rows; ++row)
    for (int32_t col = 0; col < 3; ++col)
      mine.push_back(rank * 100 + static_cast<int32_t>(row) * 10 + col);

  krug::Handle h =
      krug::allgather_async("example/rows", mine.data(), krug::DataType::kInt32, {rows, 3});
  h.wait();

  std::vector<int32_t> expected;
  for (int r = 0; r < size; ++r)
    for (int64_t row = 0; row <= r; ++row)
      for (int32_t col = 0; col < 3; ++col)
        expected.push_back(r * 100 + static_cast<int32_t>(row) * 10 + col);

  const auto& out = h.output();
  const auto& shape = h.output_shape();
  bool ok = shape == krug::Shape{static_cast<int64_t>(expected.size() / 3), 3} &&
            out.size() == expected.size() * sizeof(int32_t) &&
            std::memcmp(out.data(), expected.data(), out.size()) == 0;
  std::printf("rank %d/%d: allgather of %lld rows gave %lld rows%s\n", rank, size,
              static_cast<long long>(rows), static_cast<long long>(shape.empty() ? 0 : shape[0]),
              ok ? "" : "  WRONG");
  return ok;
}

// Broadcast: rank 0's "initial weights" replace everyone's.
bool broadcast_demo(int rank, int size) {
  const int64_t n = 8;
  std::vector<double> weights(n);
  for (int64_t i = 0; i < n; ++i)
    weights[i] = rank == 0 ? 0.5 * static_cast<double>(i) : -1.0 - rank;

  krug::broadcast("example/weights", weights.data(), krug::DataType::kFloat64, {n}, /*root=*/0);

  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok = ok && weights[i] == 0.5 * static_cast<double>(i);
  std::printf("rank %d/%d: broadcast from rank 0: weights[%lld] = %g%s\n", rank, size,
              static_cast<long long>(n - 1), weights[n - 1], ok ? "" : "  WRONG");
  return ok;
}

}  // namespace

int main() {
  try {
    krug::init();
    const int rank = krug::rank(), size = krug::size();

    bool ok = average_demo(rank, size);
    ok = allgather_demo(rank, size) && ok;
    ok = broadcast_demo(rank, size) && ok;
    std::fflush(stdout);

    // Agree on the outcome: the number of ranks that saw a wrong result.
    int32_t failed = ok ? 0 : 1;
    krug::ReduceOptions sum;
    sum.op = krug::ReduceOp::kSum;
    krug::allreduce("example/failed", &failed, &failed, krug::DataType::kInt32, {1}, sum);
    if (rank == 0) {
      if (failed == 0)
        std::printf("OK\n");
      else
        std::printf("FAILED: %d of %d ranks saw wrong results\n", failed, size);
    }
    krug::shutdown();
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "krug-example-average: %s\n", e.what());
    return 1;
  }
}
