// Adasum: the two-vector rule, point-to-point over Gloo, the recursive vector-halving
// distance-doubling allreduce (ranks as threads over real Gloo communicators) against a scalar
// reference written here, and the engine path (fusion keeps per-tensor boundaries, errors).
#include "collectives/adasum.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "collectives/gloo/gloo_communicator.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "reduce/reduce.h"
#include "rendezvous/store.h"

namespace krug::collectives {
namespace {

using namespace std::chrono_literals;

// ---- Reference: the tree of the paper on whole vectors, in double, one tensor at a time.

std::vector<double> ref_pair(const std::vector<double>& a, const std::vector<double>& b) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double ca = aa == 0 ? 1.0 : 1.0 - dot / (2 * aa);
  const double cb = bb == 0 ? 1.0 : 1.0 - dot / (2 * bb);
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

// per_rank[r] = rank r's tensor. Level by level: block [i 2d, (i+1) 2d) combines its two halves.
std::vector<double> ref_adasum(std::vector<std::vector<double>> per_rank) {
  const size_t n = per_rank.size();
  for (size_t d = 1; d < n; d *= 2)
    for (size_t r = 0; r < n; r += 2 * d) per_rank[r] = ref_pair(per_rank[r], per_rank[r + d]);
  return per_rank[0];
}

// ---- dtype helpers

double to_double(DataType t, const uint8_t* p) {
  switch (t) {
    case DataType::kFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    case DataType::kFloat64: { double d; std::memcpy(&d, p, 8); return d; }
    case DataType::kFloat16: { uint16_t h; std::memcpy(&h, p, 2); return reduce::half_to_float(h); }
    case DataType::kBFloat16: { uint16_t h; std::memcpy(&h, p, 2); return reduce::bfloat16_to_float(h); }
    default: throw Error("test: dtype");
  }
}

void from_double(DataType t, double v, uint8_t* p) {
  switch (t) {
    case DataType::kFloat32: { float f = float(v); std::memcpy(p, &f, 4); return; }
    case DataType::kFloat64: std::memcpy(p, &v, 8); return;
    case DataType::kFloat16: { uint16_t h = reduce::float_to_half(float(v)); std::memcpy(p, &h, 2); return; }
    case DataType::kBFloat16: { uint16_t h = reduce::float_to_bfloat16(float(v)); std::memcpy(p, &h, 2); return; }
    default: throw Error("test: dtype");
  }
}

// Relative tolerance (to the largest magnitude of a tensor's expected result) per dtype.
double tolerance(DataType t) {
  switch (t) {
    case DataType::kFloat64: return 1e-12;
    case DataType::kFloat32: return 2e-6;
    case DataType::kFloat16: return 8e-3;
    default: return 6e-2;  // bfloat16: 8 bits of mantissa, rounded at every level
  }
}

// Inputs: tensor t of rank r = a shared direction (so dot products matter) plus per-rank noise;
// tensor 2 is zero on odd ranks (zero-norm cases), tensor 3 zero everywhere.
std::vector<double> input_values(int rank, size_t tensor, size_t count) {
  std::mt19937 shared(unsigned(1000 + tensor)), own(unsigned(rank * 7919 + tensor));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(count);
  for (size_t i = 0; i < count; ++i) {
    const double s = u(shared), o = u(own);
    v[i] = (tensor == 3 || (tensor == 2 && rank % 2 == 1)) ? 0.0 : s + (0.3 + 0.2 * rank) * o;
  }
  return v;
}

// Runs body(comm) on `size` Gloo communicators, one thread each.
void run_comms(int size, const std::function<void(Communicator&)>& body,
               std::chrono::milliseconds timeout = 30s, bool final_barrier = true) {
  auto store = std::make_shared<rendezvous::InMemoryStore>();
  std::vector<std::string> failures(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooCommunicator comm(r, size, store, make_gloo_device("127.0.0.1", ""), timeout);
        // Nobody tears down its end of the mesh while a peer still connects or works.
        comm.barrier();
        body(comm);
        if (final_barrier) comm.barrier();
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

TEST(AdasumRule, OrthogonalVectorsAddAndParallelOnesAverage) {
  auto c = adasum_coefficients(0.0, 4.0, 9.0);
  EXPECT_EQ(c.a, 1.0);
  EXPECT_EQ(c.b, 1.0);
  c = adasum_coefficients(4.0, 4.0, 4.0);  // a == b
  EXPECT_EQ(c.a, 0.5);
  EXPECT_EQ(c.b, 0.5);
  c = adasum_coefficients(0.0, 0.0, 3.0);  // a == 0: result is b
  EXPECT_EQ(c.b, 1.0);
  c = adasum_coefficients(0.0, 0.0, 0.0);
  EXPECT_TRUE(std::isfinite(c.a) && std::isfinite(c.b));
  c = adasum_coefficients(-2.0, 1.0, 4.0);  // opposed: a.b = -2
  EXPECT_DOUBLE_EQ(c.a, 2.0);
  EXPECT_DOUBLE_EQ(c.b, 1.25);
}

TEST(AdasumRule, UnsupportedCasesHaveClearMessages) {
  EXPECT_EQ(adasum_unsupported(DataType::kFloat32, 4, 0), "");
  EXPECT_EQ(adasum_unsupported(DataType::kFloat16, 1, 0), "");
  EXPECT_EQ(adasum_unsupported(DataType::kFloat32, 3, 2),
            "Adasum needs a power-of-two number of ranks (process set 2 has 3)");
  EXPECT_NE(adasum_unsupported(DataType::kInt32, 4, 0).find("not int32"), std::string::npos);
}

TEST(AdasumRule, ElementwiseKernelsRejectAdasum) {
  float x[1] = {1}, y[1] = {2};
  try {
    reduce::reduce_into(DataType::kFloat32, ReduceOp::kAdasum, x, y, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adasum is not an element-wise"), std::string::npos);
  }
  EXPECT_EQ(reduce_op_name(ReduceOp::kAdasum), "adasum");
}

TEST(GlooPointToPoint, RingShiftsOfEverySizeIncludingEmpty) {
  for (int size : {1, 2, 3, 5}) {
    run_comms(size, [size](Communicator& c) {
      const int next = (c.rank() + 1) % size, prev = (c.rank() + size - 1) % size;
      for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{1} << 18}) {
        std::vector<int32_t> out(count, c.rank()), in(count, -1);
        c.sendrecv(out.data(), count * 4, next, in.data(), count * 4, prev);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(in[i], prev);
      }
      // One-directional calls (send returns once the peer took the message) between pairs,
      // then a collective: the collectives' slots are unaffected by who did point-to-point.
      int32_t token = c.rank() * 10, got = -1;
      if (c.rank() % 2 == 0 && c.rank() + 1 < size) c.send(&token, 4, c.rank() + 1);
      if (c.rank() % 2 == 1) {
        c.recv(&got, 4, c.rank() - 1);
        EXPECT_EQ(got, (c.rank() - 1) * 10);
      }
      c.barrier();
      std::vector<float> v(7, 1.0f);
      c.allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
      EXPECT_EQ(v[6], float(size));
    });
  }
}

TEST(GlooPointToPoint, BadPeerAndTimeoutNameTheRanks) {
  run_comms(2, [](Communicator& c) {
    int32_t x = 0;
    try {
      c.send(&x, 4, 5);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("to rank 5"), std::string::npos) << e.what();
    }
  });
  run_comms(
      2,
      [](Communicator& c) {
        if (c.rank() != 0) return;  // rank 1 never sends
        int32_t x = 0;
        try {
          c.recv(&x, 4, 1);
          ADD_FAILURE() << "no error";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("receive of 4 bytes from rank 1"),
                    std::string::npos)
              << e.what();
          EXPECT_NE(std::string(e.what()).find("on rank 0 of 2"), std::string::npos) << e.what();
        }
      },
      300ms, /*final_barrier=*/false);
}

struct Case {
  int ranks;
  DataType dtype;
};

class AdasumAllreduce : public ::testing::TestWithParam<Case> {};

TEST_P(AdasumAllreduce, MatchesTheScalarReferencePerTensorOnEveryRank) {
  const auto [size, dtype] = GetParam();
  // Tensor boundaries deliberately cut across the halving points.
  const std::vector<size_t> counts = {1000, 7, 333, 64, 1, 0, 4099, 1 << 14};
  const size_t esize = dtype_size(dtype);
  size_t total = 0;
  for (size_t c : counts) total += c;

  std::vector<std::vector<uint8_t>> buffers(size, std::vector<uint8_t>(total * esize));
  // quantized[t][r]: rank r's tensor t as the dtype holds it.
  std::vector<std::vector<std::vector<double>>> quantized(counts.size(),
                                                          std::vector<std::vector<double>>(size));
  for (int r = 0; r < size; ++r) {
    size_t at = 0;
    for (size_t t = 0; t < counts.size(); ++t) {
      auto v = input_values(r, t, counts[t]);
      for (size_t i = 0; i < counts[t]; ++i, ++at) {
        from_double(dtype, v[i], &buffers[r][at * esize]);
        quantized[t][r].push_back(to_double(dtype, &buffers[r][at * esize]));
      }
    }
  }
  run_comms(size, [&](Communicator& c) {
    adasum_allreduce(c, buffers[c.rank()].data(), dtype, counts);
  });
  for (int r = 1; r < size; ++r)
    ASSERT_EQ(0, std::memcmp(buffers[0].data(), buffers[r].data(), total * esize))
        << "rank " << r << " differs from rank 0";
  size_t at = 0;
  for (size_t t = 0; t < counts.size(); ++t) {
    auto expected = ref_adasum(quantized[t]);
    double scale = 0;
    for (double e : expected) scale = std::max(scale, std::fabs(e));
    for (size_t i = 0; i < counts[t]; ++i, ++at) {
      const double got = to_double(dtype, &buffers[0][at * esize]);
      ASSERT_NEAR(got, expected[i], tolerance(dtype) * std::max(scale, 1e-30))
          << "tensor " << t << " element " << i;
    }
    if (t == 3) {
      for (double e : expected) ASSERT_EQ(e, 0.0);
    }
  }
}

TEST_P(AdasumAllreduce, IdenticalInputsStayAndOrthogonalInputsAdd) {
  const auto [size, dtype] = GetParam();
  const size_t esize = dtype_size(dtype);
  const size_t n = 64 * size_t(size);
  run_comms(size, [&](Communicator& c) {
    // Tensor 0: the same on every rank. Tensor 1: rank r owns coordinates [64 r, 64 r + 64).
    std::vector<uint8_t> buf(2 * n * esize, 0);
    for (size_t i = 0; i < n; ++i) {
      from_double(dtype, double(i % 5) - 2.0, &buf[i * esize]);
      if (i / 64 == size_t(c.rank())) from_double(dtype, 1.0 + double(i % 3), &buf[(n + i) * esize]);
    }
    adasum_allreduce(c, buf.data(), dtype, {n, n});
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(to_double(dtype, &buf[i * esize]), double(i % 5) - 2.0, 1e-2) << i;
      ASSERT_NEAR(to_double(dtype, &buf[(n + i) * esize]), 1.0 + double(i % 3), 1e-2) << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndTypes, AdasumAllreduce,
    ::testing::Values(Case{1, DataType::kFloat32}, Case{2, DataType::kFloat32},
                      Case{4, DataType::kFloat32}, Case{8, DataType::kFloat32},
                      Case{1, DataType::kFloat64}, Case{2, DataType::kFloat64},
                      Case{4, DataType::kFloat64}, Case{8, DataType::kFloat64},
                      Case{2, DataType::kFloat16}, Case{4, DataType::kFloat16},
                      Case{8, DataType::kFloat16}, Case{2, DataType::kBFloat16},
                      Case{4, DataType::kBFloat16}, Case{8, DataType::kBFloat16}),
    [](const auto& info) {
      return "ranks" + std::to_string(info.param.ranks) + "_" +
             std::string(dtype_name(info.param.dtype));
    });

TEST(AdasumAllreduceErrors, ThreeRanksAndIntegersAreRejected) {
  run_comms(3, [](Communicator& c) {
    std::vector<float> v(10, 1.0f);
    try {
      adasum_allreduce(c, v.data(), DataType::kFloat32, {10}, 0);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                "Adasum needs a power-of-two number of ranks (process set 0 has 3)");
    }
  });
  run_comms(2, [](Communicator& c) {
    std::vector<int32_t> v(10, 1);
    EXPECT_THROW(adasum_allreduce(c, v.data(), DataType::kInt32, {10}), Error);
  });
}

}  // namespace
}  // namespace krug::collectives

// ---- Through the engine: fused buffers, scaling, errors on every rank's handle.
namespace krug::engine {
namespace {

using controller::OpType;
using controller::Request;

using testing::run_ranks;

Request adasum_request(const std::string& name, DataType dtype, int64_t count) {
  Request q;
  q.name = name;
  q.op = OpType::kAllreduce;
  q.dtype = dtype;
  q.reduce_op = ReduceOp::kAdasum;
  q.shape = {count};
  return q;
}

// Values of tensor t on rank r (float64, so the reference is exact enough for 1e-12).
std::vector<double> values(int r, int t, int64_t count) {
  std::vector<double> v(count);
  for (int64_t i = 0; i < count; ++i)
    v[i] = std::sin(double(i + 1) * (t + 1)) + 0.5 * std::cos(double(i * (r + 2) + t));
  return v;
}

std::vector<double> ref_pair(const std::vector<double>& a, const std::vector<double>& b) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) dot += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    out[i] = (aa == 0 ? 1 : 1 - dot / (2 * aa)) * a[i] + (bb == 0 ? 1 : 1 - dot / (2 * bb)) * b[i];
  return out;
}

class EngineAdasum : public ::testing::TestWithParam<int> {};

TEST_P(EngineAdasum, GroupedTensorsAreCombinedPerTensorWithScaling) {
  const int size = GetParam();
  const std::vector<int64_t> counts = {5, 1000, 1, 77};
  run_ranks(size, [&](Engine& e, int rank) {
    std::vector<std::vector<double>> data;
    std::vector<TensorArgs> group;
    for (size_t t = 0; t < counts.size(); ++t) data.push_back(values(rank, int(t), counts[t]));
    for (size_t t = 0; t < counts.size(); ++t) {
      auto q = adasum_request("g." + std::to_string(t), DataType::kFloat64, counts[t]);
      q.group = "g";
      q.group_size = int32_t(counts.size());
      q.prescale = 0.5;
      q.postscale = 3.0;
      group.push_back(tensor_args(q, data[t].data(), data[t].data()));
    }
    auto h = e.enqueue(std::move(group));
    h->wait();
    ASSERT_EQ(h->error(), "");
    for (size_t t = 0; t < counts.size(); ++t) {
      std::vector<std::vector<double>> per_rank;
      for (int r = 0; r < size; ++r) {
        auto v = values(r, int(t), counts[t]);
        for (double& x : v) x *= 0.5;
        per_rank.push_back(v);
      }
      for (int d = 1; d < size; d *= 2)
        for (int r = 0; r < size; r += 2 * d) per_rank[r] = ref_pair(per_rank[r], per_rank[r + d]);
      for (int64_t i = 0; i < counts[t]; ++i)
        ASSERT_NEAR(data[t][i], 3.0 * per_rank[0][i], 1e-12) << "tensor " << t << " i " << i;
    }
    // A single tensor runs in the user's buffer, without fusion.
    std::vector<float> one(33, float(rank + 1)), out(33);
    std::vector<TensorArgs> single;
    single.push_back(tensor_args(adasum_request("one", DataType::kFloat32, 33), one.data(), out.data()));
    auto h1 = e.enqueue(std::move(single));
    h1->wait();
    ASSERT_EQ(h1->error(), "");
    // Parallel vectors c_r * u: each level combines to a multiple of u.
    for (float v : out) ASSERT_EQ(v, out[0]);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, EngineAdasum, ::testing::Values(1, 2, 4, 8));

TEST(EngineAdasumErrors, ThreeRanksFailEveryHandleAndTheEngineGoesOn) {
  run_ranks(3, [](Engine& e, int rank) {
    std::vector<float> v(8, float(rank));
    std::vector<TensorArgs> args;
    args.push_back(tensor_args(adasum_request("grad", DataType::kFloat32, 8), v.data(), v.data()));
    auto h = e.enqueue(std::move(args));
    h->wait();
    EXPECT_NE(h->error().find("Adasum needs a power-of-two number of ranks (process set 0 has 3)"),
              std::string::npos)
        << h->error();
    EXPECT_NE(h->error().find("'grad'"), std::string::npos) << h->error();

    std::vector<int32_t> iv(4, 1);
    std::vector<TensorArgs> iargs;
    iargs.push_back(tensor_args(adasum_request("ints", DataType::kInt32, 4), iv.data(), iv.data()));
    auto hi = e.enqueue(std::move(iargs));
    hi->wait();
    EXPECT_NE(hi->error().find("floating-point"), std::string::npos) << hi->error();

    // Still alive: a plain sum works.
    Request q = adasum_request("sum", DataType::kFloat32, 8);
    q.reduce_op = ReduceOp::kSum;
    std::vector<TensorArgs> sargs;
    sargs.push_back(tensor_args(q, v.data(), v.data()));
    auto hs = e.enqueue(std::move(sargs));
    hs->wait();
    EXPECT_EQ(hs->error(), "");
    EXPECT_EQ(v[0], 3.0f);
  });
}

TEST(EngineAdasumErrors, ReducescatterRejectsAdasum) {
  run_ranks(2, [](Engine& e, int) {
    std::vector<float> v(8, 1.0f);
    Request q = adasum_request("rs", DataType::kFloat32, 8);
    q.op = OpType::kReducescatter;
    std::vector<TensorArgs> args;
    args.push_back(tensor_args(q, v.data(), nullptr));
    auto h = e.enqueue(std::move(args));
    h->wait();
    EXPECT_NE(h->error().find("runs only as an allreduce"), std::string::npos) << h->error();
  });
}

}  // namespace
}  // namespace krug::engine
