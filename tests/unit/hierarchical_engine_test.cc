// The engine's choice of a hierarchical allreduce per process set, with ranks as threads that
// claim different hosts (Config::hostname per thread), and allreduce results through it: every
// element-wise op and dtype, fused and alone, random floats bitwise reproducible across fusion
// layouts, Adasum and the other collectives unaffected.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <optional>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "reduce/reduce.h"

namespace krug::engine {
namespace {

using controller::OpType;
using namespace testing;

// Runs `body` on one engine per entry of `hosts`, rank r claiming host hosts[r]; `knob` is every
// rank's KRUG_HIERARCHICAL_ALLREDUCE unless `knob_of_rank` says otherwise.
void run_on_hosts(const std::vector<std::string>& hosts, std::optional<bool> knob,
                  const std::function<void(Engine&, int)>& body,
                  const std::function<std::optional<bool>(int)>& knob_of_rank = {}) {
  run_ranks(static_cast<int>(hosts.size()), body, [&](Config& c) {
    c.hostname = hosts.at(c.rank);
    c.hierarchical_allreduce = knob_of_rank ? knob_of_rank(c.rank) : knob;
  });
}

int32_t add_set(Engine& e, std::vector<int32_t> ranks) {
  auto q = request("__add_process_set" + ::testing::PrintToString(ranks), OpType::kAddProcessSet,
                   DataType::kUInt8, {});
  q.set_ranks = std::move(ranks);
  auto h = submit(e, q, nullptr, nullptr);
  h->wait();
  EXPECT_EQ(h->error(), "");
  return static_cast<int32_t>(h->result().value);
}

// Sum over `members` of (member + 1) * (i % 11), allreduced on set `id` (int32: exact).
void expect_set_sum(Engine& e, int rank, int32_t id, const std::vector<int32_t>& members,
                    int64_t count) {
  std::vector<int32_t> x(count);
  for (int64_t i = 0; i < count; ++i) x[i] = (rank + 1) * int32_t(i % 11);
  auto q = request(fmt::format("sum.{}.{}", id, count), OpType::kAllreduce, DataType::kInt32,
                   {count});
  q.process_set = id;
  expect_ok(submit(e, q, x.data(), x.data()));
  int32_t factor = 0;
  for (int32_t m : members) factor += m + 1;
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(x[i], factor * int32_t(i % 11)) << i;
}

TEST(EngineHierarchical, ChoosesPerProcessSetFromItsHosts) {
  const std::vector<std::string> hosts{"hostA", "hostA", "hostB", "hostB", "hostC", "hostC"};
  run_on_hosts(hosts, std::nullopt, [](Engine& e, int rank) {
    EXPECT_EQ(e.allreduce_algorithm(0), "hierarchical [0 1] [2 3] [4 5]");
    expect_set_sum(e, rank, 0, {0, 1, 2, 3, 4, 5}, 1000);
    // Part of the hosts, unevenly: hierarchical among its own members ([0 1] on hostA, [2]).
    const int32_t part = add_set(e, {0, 1, 2});
    // One rank per host, and one host: nothing to gain, flat.
    const int32_t spread = add_set(e, {0, 2, 4});
    const int32_t one_host = add_set(e, {4, 5});
    auto member = [&](std::vector<int32_t> m) {
      return std::find(m.begin(), m.end(), rank) != m.end();
    };
    EXPECT_EQ(e.allreduce_algorithm(part), member({0, 1, 2}) ? "hierarchical [0 1] [2]" : "");
    EXPECT_EQ(e.allreduce_algorithm(spread), member({0, 2, 4}) ? "flat" : "");
    EXPECT_EQ(e.allreduce_algorithm(one_host), member({4, 5}) ? "flat" : "");
    if (member({0, 1, 2})) expect_set_sum(e, rank, part, {0, 1, 2}, 7);
    if (member({0, 2, 4})) expect_set_sum(e, rank, spread, {0, 2, 4}, 7);
    if (member({4, 5})) expect_set_sum(e, rank, one_host, {4, 5}, 7);
    // Nobody shuts down (which stops the job) while others still use their sets.
    expect_set_sum(e, rank, 0, {0, 1, 2, 3, 4, 5}, 1);
  });
}

TEST(EngineHierarchical, KnobZeroKeepsFlatAndKnobOneNeedsAHierarchy) {
  run_on_hosts({"hostA", "hostA", "hostB", "hostB"}, false, [](Engine& e, int rank) {
    EXPECT_EQ(e.allreduce_algorithm(0), "flat");
    expect_set_sum(e, rank, 0, {0, 1, 2, 3}, 7);
  });
  run_on_hosts({"hostA", "hostA", "hostA", "hostA"}, true, [](Engine& e, int rank) {
    EXPECT_EQ(e.allreduce_algorithm(0), "flat");
    expect_set_sum(e, rank, 0, {0, 1, 2, 3}, 7);
  });
  run_on_hosts({"hostA", "hostA", "hostB", "hostB"}, true, [](Engine& e, int rank) {
    EXPECT_EQ(e.allreduce_algorithm(0), "hierarchical [0 1] [2 3]");
    expect_set_sum(e, rank, 0, {0, 1, 2, 3}, 7);
  });
}

TEST(EngineHierarchical, EveryRankFollowsTheCoordinatorsSetting) {
  // Rank 0 says auto, the others 0: building different communicators would hang the job.
  run_on_hosts(
      {"hostA", "hostA", "hostB", "hostB"}, std::nullopt,
      [](Engine& e, int rank) {
        EXPECT_EQ(e.allreduce_algorithm(0), "hierarchical [0 1] [2 3]");
        expect_set_sum(e, rank, 0, {0, 1, 2, 3}, 1000);
      },
      [](int rank) { return rank == 0 ? std::nullopt : std::optional<bool>(false); });
}

// ---- Every element-wise op and dtype, with values exact in every dtype.

const DataType kTypes[] = {DataType::kUInt8,   DataType::kInt8,     DataType::kInt16,
                           DataType::kInt32,   DataType::kInt64,    DataType::kUInt16,
                           DataType::kUInt32,  DataType::kUInt64,   DataType::kFloat16,
                           DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                           DataType::kBool};

bool is_signed(DataType t) {
  return t != DataType::kUInt8 && t != DataType::kUInt16 && t != DataType::kUInt32 &&
         t != DataType::kUInt64 && t != DataType::kBool;
}

double input(ReduceOp op, DataType t, int64_t i, int r) {
  if (t == DataType::kBool) return (i + r) % 3 == 0 ? 1 : 0;
  const bool sgn = is_signed(t);
  switch (op) {
    case ReduceOp::kSum: return double(i % 7 + r - (sgn ? 3 : 0));
    case ReduceOp::kAverage: return double(i % 5 + 2 * r);
    case ReduceOp::kMin:
    case ReduceOp::kMax: return double((i * 5 + r * 3) % 9 - (sgn ? 4 : 0));
    case ReduceOp::kProduct: {
      const double values[] = {1, 2, -1};
      return sgn ? values[(i + r) % 3] : values[(i + r) % 2];
    }
    default: return 0;
  }
}

double expected(ReduceOp op, DataType t, int64_t i, int n, double pre, double post) {
  double acc = 0;
  for (int r = 0; r < n; ++r) {
    const double v = input(op, t, i, r) * (t == DataType::kBool ? 1 : pre);
    if (r == 0) {
      acc = v;
      continue;
    }
    const bool boolean = t == DataType::kBool;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc = boolean ? std::max(acc, v) : acc + v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kProduct: acc = boolean ? std::min(acc, v) : acc * v; break;
      default: break;
    }
  }
  if (t == DataType::kBool) return acc;
  if (op == ReduceOp::kAverage) acc /= n;
  return acc * post;
}

void put(DataType t, uint8_t* p, double v) {
  auto store = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
  switch (t) {
    case DataType::kUInt8: store(uint8_t(v)); return;
    case DataType::kInt8: store(int8_t(v)); return;
    case DataType::kInt16: store(int16_t(v)); return;
    case DataType::kInt32: store(int32_t(v)); return;
    case DataType::kInt64: store(int64_t(v)); return;
    case DataType::kUInt16: store(uint16_t(v)); return;
    case DataType::kUInt32: store(uint32_t(v)); return;
    case DataType::kUInt64: store(uint64_t(v)); return;
    case DataType::kFloat16: store(reduce::float_to_half(float(v))); return;
    case DataType::kBFloat16: store(reduce::float_to_bfloat16(float(v))); return;
    case DataType::kFloat32: store(float(v)); return;
    case DataType::kFloat64: store(v); return;
    case DataType::kBool: store(uint8_t(v != 0)); return;
  }
}

double get(DataType t, const uint8_t* p) {
  auto load = [p](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (t) {
    case DataType::kUInt8: return load(uint8_t{});
    case DataType::kInt8: return load(int8_t{});
    case DataType::kInt16: return load(int16_t{});
    case DataType::kInt32: return load(int32_t{});
    case DataType::kInt64: return double(load(int64_t{}));
    case DataType::kUInt16: return load(uint16_t{});
    case DataType::kUInt32: return load(uint32_t{});
    case DataType::kUInt64: return double(load(uint64_t{}));
    case DataType::kFloat16: return reduce::half_to_float(load(uint16_t{}));
    case DataType::kBFloat16: return reduce::bfloat16_to_float(load(uint16_t{}));
    case DataType::kFloat32: return load(float{});
    case DataType::kFloat64: return load(double{});
    case DataType::kBool: return load(uint8_t{});
  }
  return 0;
}

struct OpCase {
  ReduceOp op;
  double pre, post;
};

class EngineHierarchicalOps : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(EngineHierarchicalOps, EveryOpAndDtypeFusedAndAlone) {
  const auto& hosts = GetParam();
  const int n = static_cast<int>(hosts.size());
  run_on_hosts(hosts, true, [n](Engine& e, int rank) {
    ASSERT_EQ(e.allreduce_algorithm(0).rfind("hierarchical", 0), 0u) << e.allreduce_algorithm(0);
    const OpCase cases[] = {{ReduceOp::kSum, 1, 1},     {ReduceOp::kAverage, 1, 1},
                            {ReduceOp::kMin, 1, 1},     {ReduceOp::kMax, 1, 1},
                            {ReduceOp::kProduct, 1, 1}, {ReduceOp::kSum, 2, 1.5}};
    const int64_t counts[] = {0, 1, 7, 1000};
    struct Pending {
      std::vector<uint8_t> data;
      std::shared_ptr<HandleState> handle;
      OpCase c;
      DataType t;
      std::string name;
    };
    // Alone: one synchronous allreduce at a time (the unfused path). Fused: everything in
    // flight at once, so tensors of one dtype and op share a fusion buffer.
    for (bool fused : {false, true}) {
      std::vector<Pending> pending;
      pending.reserve(std::size(cases) * std::size(kTypes) * std::size(counts));
      for (size_t k = 0; k < std::size(cases); ++k)
        for (DataType t : kTypes)
          for (int64_t count : counts) {
            const OpCase& c = cases[k];
            Pending p{std::vector<uint8_t>(count * dtype_size(t)), nullptr, c, t,
                      fmt::format("{}.{}.{}.{}.{}", fused ? "fused" : "alone", k,
                                  dtype_name(t), count, reduce_op_name(c.op))};
            for (int64_t i = 0; i < count; ++i)
              put(t, p.data.data() + i * dtype_size(t), input(c.op, t, i, rank));
            auto q = request(p.name, OpType::kAllreduce, t, {count});
            q.reduce_op = c.op;
            q.prescale = c.pre;
            q.postscale = c.post;
            pending.push_back(std::move(p));
            auto& back = pending.back();
            back.handle = submit(e, q, back.data.data(), back.data.data());
            if (!fused) back.handle->wait();
          }
      for (auto& p : pending) {
        expect_ok(p.handle);
        const int64_t count = int64_t(p.data.size() / dtype_size(p.t));
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(get(p.t, p.data.data() + i * dtype_size(p.t)),
                    expected(p.c.op, p.t, i, n, p.c.pre, p.c.post))
              << p.name << " element " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, EngineHierarchicalOps,
    ::testing::Values(std::vector<std::string>{"hostA", "hostA", "hostB", "hostB"},
                      std::vector<std::string>{"hostA", "hostB", "hostB", "hostC", "hostC", "hostC"},
                      std::vector<std::string>{"hostA", "hostB", "hostA", "hostB"}),
    [](const auto& info) {
      std::string name;
      for (const auto& h : info.param) name += h.back();
      return name;
    });

// ---- Random floats: the host association, bitwise the same on every rank and however fused.

float random_input(int rank, size_t i) {
  return std::sin(float(i * (rank + 1))) * 1e7f / float(rank + 1) + float(i % 3) * 0.1f;
}

TEST(EngineHierarchical, RandomFloatsAreBitwiseReproducibleAcrossRanksAndFusionLayouts) {
  constexpr size_t kCount = 100003;
  std::mutex mu;
  std::vector<std::vector<float>> results;  // [layout * 4 + rank]
  results.resize(8);
  for (int layout = 0; layout < 2; ++layout) {
    run_on_hosts({"hostA", "hostA", "hostB", "hostB"}, std::nullopt, [&, layout](Engine& e, int rank) {
      std::vector<float> pad(layout == 0 ? 0 : 12345, 1.0f);
      std::vector<float> x(kCount);
      for (size_t i = 0; i < kCount; ++i) x[i] = random_input(rank, i);
      std::vector<TensorArgs> group;
      auto qx = request("x", OpType::kAllreduce, DataType::kFloat32, {int64_t(kCount)});
      if (layout == 1) {
        auto qp = request("pad", OpType::kAllreduce, DataType::kFloat32, {int64_t(pad.size())});
        qp.group = qx.group = "g";
        qp.group_size = qx.group_size = 2;
        group.push_back(tensor_args(qp, pad.data(), pad.data()));
      }
      group.push_back(tensor_args(qx, x.data(), x.data()));
      expect_ok(e.enqueue(std::move(group)));
      std::lock_guard lock(mu);
      results[layout * 4 + rank] = std::move(x);
    });
  }
  for (size_t k = 1; k < results.size(); ++k) {
    ASSERT_EQ(results[k].size(), kCount) << k;
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[k].data(), kCount * sizeof(float)))
        << "layout " << k / 4 << " rank " << k % 4 << " differs from layout 0 rank 0";
  }
  // And the association is the promised one: (x0 + x1) + (x2 + x3).
  size_t differs_from_flat = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const float a = random_input(0, i) + random_input(1, i);
    const float b = random_input(2, i) + random_input(3, i);
    const float flat = ((random_input(0, i) + random_input(1, i)) + random_input(2, i)) + random_input(3, i);
    ASSERT_EQ(results[0][i], a + b) << "element " << i;
    differs_from_flat += (a + b) != flat;
  }
  // The data are chosen so that association matters: otherwise this test would not tell.
  EXPECT_GT(differs_from_flat, 0u);
}

// ---- Adasum and the other collectives run on the flat communicator, unchanged.

TEST(EngineHierarchical, AdasumGivesTheSameBitsWithHierarchicalOnOrOff) {
  std::vector<std::vector<double>> results(2);
  for (int knob = 0; knob < 2; ++knob) {
    run_on_hosts({"hostA", "hostA", "hostB", "hostB"}, knob == 1, [&, knob](Engine& e, int rank) {
      EXPECT_EQ(e.allreduce_algorithm(0), knob == 1 ? "hierarchical [0 1] [2 3]" : "flat");
      std::vector<double> x(1001);
      for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(double(i * (rank + 2))) * (rank + 1);
      auto q = request("adasum", OpType::kAllreduce, DataType::kFloat64, {int64_t(x.size())});
      q.reduce_op = ReduceOp::kAdasum;
      expect_ok(submit(e, q, x.data(), x.data()));
      if (rank == 3) results[knob] = x;
    });
  }
  ASSERT_EQ(results[0].size(), 1001u);
  ASSERT_EQ(results[1].size(), 1001u);
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), 1001 * sizeof(double)));
}

TEST(EngineHierarchical, OtherCollectivesStillWork) {
  run_on_hosts({"hostA", "hostA", "hostB", "hostB"}, true, [](Engine& e, int rank) {
    ASSERT_EQ(e.allreduce_algorithm(0), "hierarchical [0 1] [2 3]");
    // Broadcast from a rank on the second host.
    std::vector<int64_t> b(7, rank == 3 ? 99 : -1);
    auto qb = request("bcast", OpType::kBroadcast, DataType::kInt64, {7});
    qb.root = 3;
    expect_ok(submit(e, qb, b.data(), b.data()));
    for (int64_t v : b) ASSERT_EQ(v, 99);
    // Allgather of rank + 1 rows each.
    std::vector<int32_t> rows(rank + 1, rank);
    auto h = submit(e, request("gather", OpType::kAllgather, DataType::kInt32, {rank + 1}),
                    rows.data(), nullptr);
    expect_ok(h);
    const auto* got = reinterpret_cast<const int32_t*>(h->result().data.data());
    ASSERT_EQ(h->result().shape, (std::vector<int64_t>{10}));
    for (int r = 0, at = 0; r < 4; ++r)
      for (int k = 0; k <= r; ++k) ASSERT_EQ(got[at++], r);
    // Reducescatter: 8 rows, 2 per rank.
    std::vector<int32_t> in(8);
    for (int i = 0; i < 8; ++i) in[i] = i * (rank + 1);
    auto hr = submit(e, request("rs", OpType::kReducescatter, DataType::kInt32, {8}), in.data(),
                     nullptr);
    expect_ok(hr);
    const auto* mine = reinterpret_cast<const int32_t*>(hr->result().data.data());
    for (int k = 0; k < 2; ++k) ASSERT_EQ(mine[k], (2 * rank + k) * 10);
    // Alltoall: one row to every rank.
    std::vector<float> a2a{float(rank * 10 + 0), float(rank * 10 + 1), float(rank * 10 + 2),
                           float(rank * 10 + 3)};
    auto ha = submit(e, request("a2a", OpType::kAlltoall, DataType::kFloat32, {4}), a2a.data(),
                     nullptr);
    expect_ok(ha);
    const auto* recv = reinterpret_cast<const float*>(ha->result().data.data());
    for (int p = 0; p < 4; ++p) ASSERT_EQ(recv[p], float(p * 10 + rank));
  });
}

}  // namespace
}  // namespace krug::engine
