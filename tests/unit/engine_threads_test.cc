// The engine with N ranks as threads of this process over an in-memory store: every collective,
// element counts {0, 1, 7, 1000, 1<<20}, 1..8 ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "net/address.h"
#include "net/socket.h"
#include "rendezvous/store.h"

namespace krug::engine {
namespace {

using controller::OpType;
using controller::Request;

using namespace testing;

class EngineThreads : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(EngineThreads, AllreduceSumAndAverage) {
  auto [size, count] = GetParam();
  run_ranks(size, [count = count, size = size](Engine& e, int rank) {
    std::vector<float> in(count), out(count, -1.0f);
    for (int64_t i = 0; i < count; ++i) in[i] = float(rank + 1) * float(i % 13);
    auto q = request("sum", OpType::kAllreduce, DataType::kFloat32, {count});
    expect_ok(submit(e, q, in.data(), out.data()));
    const float ranks_sum = float(size * (size + 1) / 2);
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], ranks_sum * float(i % 13)) << i;

    q.name = "avg";
    q.reduce_op = ReduceOp::kAverage;
    std::vector<double> din(count, rank * 2.0), dout(count);
    q.dtype = DataType::kFloat64;
    expect_ok(submit(e, q, din.data(), dout.data()));
    for (int64_t i = 0; i < count; ++i) ASSERT_DOUBLE_EQ(dout[i], double(size - 1));
  });
}

TEST_P(EngineThreads, AllgatherWithUnevenFirstDimension) {
  auto [size, count] = GetParam();
  run_ranks(size, [count = count, size = size](Engine& e, int rank) {
    const int64_t rows = count + rank;  // every rank contributes a different number of rows
    std::vector<int32_t> in(rows * 2);
    for (int64_t i = 0; i < rows * 2; ++i) in[i] = rank * 100000 + int32_t(i);
    auto h = submit(e, request("gather", OpType::kAllgather, DataType::kInt32, {rows, 2}),
                    in.data(), nullptr);
    expect_ok(h);
    const auto& res = h->result();
    int64_t total = 0;
    for (int r = 0; r < size; ++r) total += count + r;
    ASSERT_EQ(res.shape, (std::vector<int64_t>{total, 2}));
    const auto* got = reinterpret_cast<const int32_t*>(res.data.data());
    int64_t at = 0;
    for (int r = 0; r < size; ++r)
      for (int64_t i = 0; i < (count + r) * 2; ++i) ASSERT_EQ(got[at++], r * 100000 + int32_t(i));
  });
}

TEST_P(EngineThreads, AllgatherIntoCallerAllocatedOutput) {
  auto [size, count] = GetParam();
  run_ranks(size, [count = count, size = size](Engine& e, int rank) {
    std::vector<int16_t> in(count, int16_t(rank + 1));
    std::vector<int16_t> out;
    std::vector<int64_t> seen_shape;
    TensorArgs args =
        tensor_args(request("ag-alloc", OpType::kAllgather, DataType::kInt16, {count}), in.data(),
                    nullptr);
    args.allocate_output = [&](const std::vector<int64_t>& shape) -> void* {
      seen_shape = shape;
      out.resize(shape[0]);
      return out.data();
    };
    std::vector<TensorArgs> v;
    v.push_back(std::move(args));
    auto h = e.enqueue(std::move(v));
    expect_ok(h);
    ASSERT_EQ(seen_shape, (std::vector<int64_t>{count * size}));
    EXPECT_TRUE(h->result().data.empty());  // nothing was copied into the handle
    for (int r = 0; r < size; ++r)
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[r * count + i], r + 1);
  });
}

TEST_P(EngineThreads, BroadcastFromEveryRoot) {
  auto [size, count] = GetParam();
  run_ranks(size, [count = count, size = size](Engine& e, int rank) {
    for (int root = 0; root < size; ++root) {
      std::vector<int64_t> data(count, rank == root ? 7 + root : -1);
      auto q = request("bcast" + std::to_string(root), OpType::kBroadcast, DataType::kInt64, {count});
      q.root = root;
      expect_ok(submit(e, q, data.data(), data.data()));
      for (int64_t v : data) ASSERT_EQ(v, 7 + root);
    }
  });
}

TEST_P(EngineThreads, AlltoallWithUnevenSplits) {
  auto [size, count] = GetParam();
  run_ranks(size, [count = count, size = size](Engine& e, int rank) {
    // Rank r sends (r + p) % 3 * count rows... to rank p; each row's value = r * 1000 + p.
    std::vector<int64_t> splits(size);
    std::vector<float> in;
    for (int p = 0; p < size; ++p) {
      splits[p] = ((rank + p) % 3) * std::min<int64_t>(count, 50);
      for (int64_t i = 0; i < splits[p]; ++i) in.push_back(float(rank * 1000 + p));
    }
    auto q = request("a2a", OpType::kAlltoall, DataType::kFloat32, {int64_t(in.size())});
    q.splits = splits;
    auto h = submit(e, q, in.data(), nullptr);
    expect_ok(h);
    const auto& res = h->result();
    const auto* got = reinterpret_cast<const float*>(res.data.data());
    int64_t at = 0;
    for (int s = 0; s < size; ++s) {
      int64_t expected_rows = ((s + rank) % 3) * std::min<int64_t>(count, 50);
      ASSERT_EQ(res.received_splits[s], expected_rows);
      for (int64_t i = 0; i < expected_rows; ++i) ASSERT_EQ(got[at++], float(s * 1000 + rank));
    }
    ASSERT_EQ(res.shape[0], at);
  });
}

TEST_P(EngineThreads, ReducescatterSplitsRowsEvenly) {
  auto [size, count] = GetParam();
  run_ranks(size, [count = count, size = size](Engine& e, int rank) {
    std::vector<int32_t> in(count);
    for (int64_t i = 0; i < count; ++i) in[i] = int32_t(i) + rank;
    auto h = submit(e, request("rs", OpType::kReducescatter, DataType::kInt32, {count}), in.data(),
                    nullptr);
    expect_ok(h);
    const auto& res = h->result();
    int64_t start = 0;
    for (int r = 0; r < rank; ++r) start += count / size + (r < count % size ? 1 : 0);
    int64_t mine = count / size + (rank < count % size ? 1 : 0);
    ASSERT_EQ(res.shape, (std::vector<int64_t>{mine}));
    const auto* got = reinterpret_cast<const int32_t*>(res.data.data());
    for (int64_t i = 0; i < mine; ++i)
      ASSERT_EQ(got[i], int32_t((start + i) * size + size * (size - 1) / 2));
  });
}

INSTANTIATE_TEST_SUITE_P(RanksAndCounts, EngineThreads,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                                            ::testing::Values(0, 1, 7, 1000, 1 << 20)),
                         [](const auto& info) {
                           return "ranks" + std::to_string(std::get<0>(info.param)) + "_count" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(EngineThreadsFusion, ManyTensorsInFlightFuseAndStayCorrect) {
  run_ranks(3, [](Engine& e, int rank) {
    constexpr int kTensors = 1000;
    std::vector<std::vector<float>> data(kTensors);
    std::vector<std::shared_ptr<HandleState>> handles;
    for (int t = 0; t < kTensors; ++t) {
      data[t].assign(1 + t % 17, float(rank + t));
      handles.push_back(submit(e, request("t" + std::to_string(t), OpType::kAllreduce,
                                          DataType::kFloat32, {int64_t(data[t].size())}),
                               data[t].data(), data[t].data()));
    }
    for (int t = 0; t < kTensors; ++t) {
      expect_ok(handles[t]);
      for (float v : data[t]) ASSERT_EQ(v, float(3 * t + 3)) << t;
    }
  });
}

// From the second step on every name is a cache hit: the coordinator counts ids and the ranks
// find their tensors by id. Each step's values differ, so a stale or misplaced tensor shows.
TEST(EngineThreadsCache, SteadyStateStepsOfEveryCachedOpStayCorrect) {
  run_ranks(3, [](Engine& e, int rank) {
    for (int step = 0; step < 6; ++step) {
      std::vector<std::vector<float>> grads(40);
      std::vector<std::shared_ptr<HandleState>> handles;
      for (int t = 0; t < 40; ++t) {
        grads[t].assign(1 + t % 5, float(rank + t + step));
        auto q = request("grad" + std::to_string(t), OpType::kAllreduce, DataType::kFloat32,
                         {int64_t(grads[t].size())});
        if (t % 2) q.reduce_op = ReduceOp::kAverage;
        handles.push_back(submit(e, q, grads[t].data(), grads[t].data()));
      }
      std::vector<int64_t> bcast(5, rank == 1 ? 100 + step : -1);
      auto b = request("state", OpType::kBroadcast, DataType::kInt64, {5});
      b.root = 1;
      auto hb = submit(e, b, bcast.data(), bcast.data());
      std::vector<int32_t> rs(6, rank + step);
      auto hr = submit(e, request("rs", OpType::kReducescatter, DataType::kInt32, {6}), rs.data(),
                       nullptr);
      for (int t = 0; t < 40; ++t) {
        expect_ok(handles[t]);
        const float sum = float(3 + 3 * t + 3 * step);
        for (float v : grads[t])
          ASSERT_EQ(v, t % 2 ? sum / 3 : sum) << "step " << step << " t " << t;
      }
      expect_ok(hb);
      for (int64_t v : bcast) ASSERT_EQ(v, 100 + step) << "step " << step;
      expect_ok(hr);
      ASSERT_EQ(hr->result().shape, (std::vector<int64_t>{2}));
      const auto* got = reinterpret_cast<const int32_t*>(hr->result().data.data());
      for (int i = 0; i < 2; ++i) ASSERT_EQ(got[i], 3 + 3 * step) << "step " << step;
    }
  });
}

// With a cycle time of 10 us the background thread wakes all the time and wants the loop while
// two threads per rank wait for their operations and drive it: the drivers let it in, and one
// that gives up waiting for the loop (after a busy-poll window of 2 us) leaves its queue to it.
// Every operation must still complete, in time, with the right result: a lost wake-up or a hand-off
// that never happens hangs a rank.
TEST(EngineThreadsLoop, WaitingThreadsAndTheBackgroundThreadShareTheLoop) {
  run_ranks(
      2,
      [](Engine& e, int rank) {
        auto waiter = [&](int thread) {
          for (int i = 0; i < 2000; ++i) {
            std::vector<float> v(4, float(rank + i + thread));
            const std::string name = "w" + std::to_string(thread) + "." + std::to_string(i % 7);
            auto h = submit(e, request(name, OpType::kAllreduce, DataType::kFloat32, {4}), v.data(),
                            v.data());
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
            ASSERT_TRUE(h->wait_until(deadline)) << "rank " << rank << " " << name << " #" << i;
            ASSERT_EQ(h->error(), "");
            for (float x : v) ASSERT_EQ(x, float(1 + 2 * (i + thread))) << name << " #" << i;
          }
        };
        std::thread second(waiter, 1);
        waiter(0);
        second.join();
      },
      [](Config& c) {
        c.cycle_time = Milliseconds(0.01);
        c.busy_poll = std::chrono::microseconds(2);  // drivers give up the loop soon
      });
}

TEST(EngineThreadsErrors, MismatchedDtypeFailsOnEveryRankNamingTheRanks) {
  run_ranks(3, [](Engine& e, int rank) {
    std::vector<double> buf(4, 1.0);
    auto dtype = rank == 1 ? DataType::kFloat64 : DataType::kFloat32;
    auto h = submit(e, request("grad", OpType::kAllreduce, dtype, {2}), buf.data(), buf.data());
    h->wait();
    EXPECT_NE(h->error().find("Mismatched data types"), std::string::npos) << h->error();
    EXPECT_NE(h->error().find("'grad'"), std::string::npos) << h->error();
    EXPECT_NE(h->error().find("rank 1: float64"), std::string::npos) << h->error();
    EXPECT_NE(h->error().find("ranks 0, 2: float32"), std::string::npos) << h->error();
  });
}

TEST(EngineThreadsErrors, DuplicateInFlightNameIsRejectedLocally) {
  run_ranks(2, [](Engine& e, int rank) {
    std::vector<float> a(4, 1.0f), b(4, 1.0f);
    auto q = request("dup", OpType::kAllreduce, DataType::kFloat32, {4});
    std::shared_ptr<HandleState> first;
    if (rank == 0) {
      first = submit(e, q, a.data(), a.data());
      auto second = submit(e, q, b.data(), b.data());
      second->wait();
      EXPECT_NE(second->error().find("already in flight"), std::string::npos) << second->error();
    } else {
      first = submit(e, q, a.data(), a.data());
    }
    expect_ok(first);
    EXPECT_EQ(a[0], 2.0f);
  });
}

// Engine::abort (a rank whose user gave up waiting): every rank's pending operation, here one
// that waits for the aborting rank, fails with the reason, and so does a later one.
class EngineThreadsAbort : public ::testing::TestWithParam<int> {};

TEST_P(EngineThreadsAbort, FailsEveryRanksPendingOperationsWithTheReason) {
  const int aborting = GetParam();
  run_ranks(3, [aborting](Engine& e, int rank) {
    std::vector<float> buf(4, 1.0f);
    // The aborting rank waits for an operation no other rank submits; the others for one it
    // never submits.
    const std::string name = rank == aborting ? "only.mine" : "all.but.one";
    auto h = submit(e, request(name, OpType::kAllreduce, DataType::kFloat32, {4}), buf.data(),
                    buf.data());
    if (rank == aborting) {
      EXPECT_FALSE(h->wait_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
      e.abort("rank " + std::to_string(rank) + " gave up waiting");
    }
    h->wait();
    const std::string reason = "rank " + std::to_string(aborting) + " gave up waiting";
    EXPECT_NE(h->error().find(reason), std::string::npos) << h->error();
    auto later = submit(e, request("later", OpType::kAllreduce, DataType::kFloat32, {4}),
                        buf.data(), buf.data());
    later->wait();
    EXPECT_NE(later->error().find(reason), std::string::npos) << later->error();
  });
}

INSTANTIATE_TEST_SUITE_P(Rank, EngineThreadsAbort, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? std::string("Coordinator")
                                                  : std::string("Worker");
                         });

TEST(EngineThreadsDeterminism, FusionLayoutDoesNotChangeBits) {
  // The same inputs reduced alone and inside a fused buffer at another offset must give the
  // same bits (rank-ordered reduction), even with 3 ranks where float addition order matters.
  std::vector<std::vector<float>> results(2);
  for (int layout = 0; layout < 2; ++layout) {
    run_ranks(3, [&, layout](Engine& e, int rank) {
      std::vector<float> pad(layout == 0 ? 0 : 12345, 1.0f);
      std::vector<float> x(100003);
      for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i * (rank + 1))) * 1e7f / (rank + 1);
      std::vector<TensorArgs> group;
      if (layout == 1) {
        auto qp = request("pad", OpType::kAllreduce, DataType::kFloat32, {int64_t(pad.size())});
        qp.group = "g";
        qp.group_size = 2;
        group.push_back(tensor_args(qp, pad.data(), pad.data()));
      }
      auto qx = request("x", OpType::kAllreduce, DataType::kFloat32, {int64_t(x.size())});
      if (layout == 1) {
        qx.group = "g";
        qx.group_size = 2;
      }
      group.push_back(tensor_args(qx, x.data(), x.data()));
      auto h = e.enqueue(std::move(group));
      expect_ok(h);
      if (rank == 1) results[layout] = x;
    });
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)));
}

}  // namespace
}  // namespace krug::engine

namespace krug::engine {
namespace {

using namespace testing;

// Runs `stranger` on a thread of its own while two ranks start: rank 1 joins only once the
// stranger set "stray/done" in `store`. Returns each rank's allreduce of rank + 1 (-1 on error).
std::vector<float> two_ranks_alongside(const std::shared_ptr<rendezvous::InMemoryStore>& store,
                                       const std::function<void()>& stranger) {
  std::thread stray(stranger);
  std::vector<std::thread> ranks;
  std::vector<float> results(2, 0.0f);
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      if (r == 1) store->get("stray/done", std::chrono::seconds(30));
      Engine e(rank_config(r, 2), store);
      float v = float(r + 1);
      auto h = submit(e, request("x", OpType::kAllreduce, DataType::kFloat32, {1}), &v, &v);
      h->wait();
      results[r] = h->error().empty() ? v : -1.0f;
      e.shutdown();
    });
  }
  for (auto& t : ranks) t.join();
  stray.join();
  return results;
}

// The coordinator's address, found the way a rank finds it.
std::pair<std::string, uint16_t> control_plane_address(rendezvous::Store& store) {
  const auto bytes = store.get("control/address", std::chrono::seconds(30));
  return net::split_host_port({bytes.begin(), bytes.end()});
}

TEST(EngineThreadsSecurity, ControlPlaneRefusesAClientWithoutTheSecret) {
  auto store = std::make_shared<rendezvous::InMemoryStore>();
  std::string stray_error;
  const auto results = two_ranks_alongside(store, [&] {
    const auto [host, port] = control_plane_address(*store);
    auto deadline = net::Clock::now() + std::chrono::seconds(10);
    auto conn = net::Connection::connect(host, port, deadline);
    try {
      conn.authenticate_as_client("not-the-job-secret", deadline);
    } catch (const std::exception& e) {
      stray_error = e.what();
    }
    // Only now may the real rank 1 join; the coordinator must still accept it.
    store->set("stray/done", {1});
  });
  EXPECT_NE(stray_error.find("rejected"), std::string::npos) << stray_error;
  EXPECT_EQ(results, (std::vector<float>{3.0f, 3.0f}));
}

// Strangers that connect to the control plane while the job starts and then say nothing hold
// handshake slots, not rank 0: the ranks join and reduce while the strangers are still connected.
// (Rank 0 once authenticated connections one after another, each with the whole start's deadline:
// a single silent connection kept every rank waiting until the job timed out.)
TEST(EngineThreadsSecurity, SilentConnectionsToTheControlPlaneDoNotHoldUpTheStart) {
  auto store = std::make_shared<rendezvous::InMemoryStore>();
  std::vector<net::Connection> strangers;
  const auto results = two_ranks_alongside(store, [&] {
    const auto [host, port] = control_plane_address(*store);
    for (int i = 0; i < 5; ++i)
      strangers.push_back(
          net::Connection::connect(host, port, net::Clock::now() + std::chrono::seconds(10)));
    store->set("stray/done", {1});
  });
  EXPECT_EQ(results, (std::vector<float>{3.0f, 3.0f}));
  for (auto& c : strangers) EXPECT_TRUE(c.valid());  // still connected all along
}

}  // namespace
}  // namespace krug::engine
