// Engine::run_direct (engine/direct_lane.h), ranks as engine threads: synchronous calls made
// together run on the lane with the engine's result (allreduce; broadcast and allgather too); a
// rank with anything else in flight, calls that differ, and a lane turned off run nothing there,
// and the same calls through the engine then behave as they always did (results, mismatch errors);
// a rank with something in flight declines its calls, so its peer neither waits nor pauses; a
// peer that comes later than the window is waited for, asleep, on the lane. An asynchronous
// operation that a thread waits for alone at an idle engine runs there too, and leaves at once
// where the peer's engine is busy.
#include "engine/direct_lane.h"

#include <gtest/gtest.h>

#include <barrier>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"

namespace krug::engine {
namespace {

using namespace std::chrono_literals;
using controller::OpType;
using testing::expect_ok;
using testing::request;
using testing::run_ranks;
using testing::submit;

// A busy poll, and with it a window (4 of them), long enough that threads on a busy 2-core
// machine still meet.
constexpr auto kLongBusyPoll = std::chrono::microseconds(20000);
constexpr auto kLongWindow = 4 * kLongBusyPoll;  // the lane's window with it
void long_window(Config& c) {
  c.busy_poll = kLongBusyPoll;
}

bool run_direct(Engine& e, const std::string& name, const std::vector<int64_t>& shape,
                const std::vector<float>& in, std::vector<float>& out,
                ReduceOp op = ReduceOp::kSum) {
  return e.run_direct(TensorView{.name = name,
                                 .op = OpType::kAllreduce,
                                 .dtype = DataType::kFloat32,
                                 .shape = shape,
                                 .reduce_op = op,
                                 .input = in.data(),
                                 .output = out.data()});
}

// The call through the engine, as a binding does when run_direct() says false.
std::shared_ptr<HandleState> enqueue(Engine& e, const std::string& name,
                                     const std::vector<int64_t>& shape,
                                     const std::vector<float>& in, std::vector<float>& out) {
  return submit(e, request(name, OpType::kAllreduce, DataType::kFloat32, shape), in.data(),
                out.data());
}

// The call on the lane, or else through the engine, as a binding makes it; whether it ran on
// the lane.
bool run_anywhere(Engine& e, const std::string& name, const std::vector<int64_t>& shape,
                  const std::vector<float>& in, std::vector<float>& out) {
  if (run_direct(e, name, shape, in, out)) return true;
  expect_ok(enqueue(e, name, shape, in, out));
  return false;
}

TEST(EngineDirectLane, TheLanesBytesAreSharedByTheRanks) {
  // Each rank reads every rank's input, so the budget is split: 512 KiB a rank at 2 ranks, 64
  // KiB at 16, whole cache lines, nothing where a rank's share is less than one.
  EXPECT_EQ(DirectLane::bytes_per_rank(1 << 20, 2), 512u * 1024);
  EXPECT_EQ(DirectLane::bytes_per_rank(1 << 20, 16), 64u * 1024);
  EXPECT_EQ(DirectLane::bytes_per_rank(1 << 20, 3), 349504u);
  EXPECT_EQ(DirectLane::bytes_per_rank(100, 2), 0u);
  EXPECT_EQ(DirectLane::bytes_per_rank(0, 2), 0u);
}

TEST(EngineDirectLane, CallsMadeTogetherRunThereWithTheEnginesResult) {
  std::vector<int> direct(2, 0);
  run_ranks(
      2,
      [&](Engine& e, int rank) {
        // The lane's bytes are every rank's input together; a broadcast may fill all of them,
        // and broadcasts and allgathers read in place (the ranks are threads of one process
        // here, which may always read itself) take up to 8 MiB of result.
        const auto budget = static_cast<size_t>(e.config().direct_lane_bytes);
        EXPECT_EQ(e.direct_lane_bytes(), budget / 2);
        EXPECT_GT(e.direct_lane_bytes(), 0u);
        EXPECT_EQ(e.direct_lane_bytes(OpType::kBroadcast), std::max(budget, size_t{8} << 20));
        EXPECT_EQ(e.direct_lane_bytes(OpType::kAllgather), std::max(budget, size_t{8} << 20) / 2);
        const std::vector<int64_t> shape{3, 2};
        for (int i = 0; i < 100; ++i) {
          const std::string name = "g" + std::to_string(i % 7);
          std::vector<float> in(6, static_cast<float>(rank + 1 + i)), out(6, -1.0f);
          const bool ran = run_direct(e, name, shape, in, out, ReduceOp::kAverage);
          direct[rank] += ran;
          if (!ran) expect_ok(enqueue(e, name, shape, in, out));
          // Through the engine the op is a sum: halve it there too.
          if (!ran)
            for (float& v : out) v /= 2;
          EXPECT_EQ(out, std::vector<float>(6, 1.5f + static_cast<float>(i))) << "call " << i;
        }
      },
      long_window);
  EXPECT_GT(direct[0], 0) << "no call ran on the lane";
  EXPECT_EQ(direct[0], direct[1]);
}

TEST(EngineDirectLane, BroadcastsAndAllgathersRunThere) {
  std::vector<int> direct(2, 0);
  // A call that found no partner runs nowhere here, so nothing else brings the ranks back into
  // step: a rank whose background thread held the loop at its call returns at once and would
  // post its next call where its peer waits with this one.
  std::barrier sync(2);
  run_ranks(
      2,
      [&](Engine& e, int rank) {
        for (int i = 0; i < 40; ++i) {
          sync.arrive_and_wait();
          const std::string name = "c" + std::to_string(i);
          const std::vector<int64_t> shape{2, 3};
          std::vector<float> in(6, static_cast<float>(10 * rank + i)), out(12, -1.0f);
          const bool gather = i % 2 == 1;
          const int root = (i / 2) % 2;
          const bool ran =
              e.run_direct(TensorView{.name = name,
                                      .op = gather ? OpType::kAllgather : OpType::kBroadcast,
                                      .dtype = DataType::kFloat32,
                                      .shape = shape,
                                      .root = root,
                                      .input = in.data(),
                                      .output = gather ? out.data() : in.data()});
          // A call that found no partner ran on neither rank: both skip it.
          if (!ran) continue;
          ++direct[rank];
          if (gather) {
            std::vector<float> want(6, static_cast<float>(i));
            want.resize(12, static_cast<float>(10 + i));
            EXPECT_EQ(out, want) << "call " << i;
          } else {
            EXPECT_EQ(in, std::vector<float>(6, static_cast<float>(10 * root + i))) << "call " << i;
          }
        }
      },
      long_window);
  EXPECT_GT(direct[0], 0) << "no call ran on the lane";
  EXPECT_EQ(direct[0], direct[1]);
}

TEST(EngineDirectLane, ACallThatDiffersFromTheLastInOneArgumentRunsAsItself) {
  // The lane keeps the last call's arguments made ready (the same name and shape every step):
  // a call under the same name that differs from the one before in a single argument must not
  // run as that one. Inputs are rank + 1 (floats), -(rank + 1) (int32: NaNs read as floats).
  struct Step {
    OpType op = OpType::kAllreduce;
    ReduceOp reduce_op = ReduceOp::kSum;
    DataType dtype = DataType::kFloat32;
    std::vector<int64_t> shape{6};
    double prescale = 1.0;
    double postscale = 1.0;
    int32_t root = 0;
    double want = 3;  // each element of the result; the rest of the 6 stay -1
  };
  const std::vector<Step> steps{
      {},
      {.prescale = 2.0, .want = 6},
      {},
      {.postscale = 0.5, .want = 1.5},
      {},
      {.reduce_op = ReduceOp::kAverage, .want = 1.5},
      {},
      {.reduce_op = ReduceOp::kMax, .want = 2},
      {},
      {.shape = {2}},
      {},
      {.dtype = DataType::kInt32, .want = -3},
      {},
      {.op = OpType::kBroadcast, .root = 1, .want = 2},
      {.op = OpType::kBroadcast, .root = 0, .want = 1},
      {},
  };
  std::vector<int> direct(2, 0);
  std::barrier sync(2);
  run_ranks(
      2,
      [&](Engine& e, int rank) {
        const std::string name = "same";
        for (int round = 0; round < 4; ++round)
          for (size_t i = 0; i < steps.size(); ++i) {
            const Step& s = steps[i];
            sync.arrive_and_wait();
            std::vector<float> floats(6, static_cast<float>(rank + 1)), float_out(6, -1.0f);
            std::vector<int32_t> ints(6, -(rank + 1)), int_out(6, -1);
            const bool is_int = s.dtype == DataType::kInt32;
            void* in = is_int ? static_cast<void*>(ints.data()) : floats.data();
            void* out = is_int ? static_cast<void*>(int_out.data()) : float_out.data();
            const bool ran = e.run_direct(TensorView{.name = name,
                                                     .op = s.op,
                                                     .dtype = s.dtype,
                                                     .shape = s.shape,
                                                     .reduce_op = s.reduce_op,
                                                     .prescale = s.prescale,
                                                     .postscale = s.postscale,
                                                     .root = s.root,
                                                     .input = in,
                                                     .output = out});
            if (!ran) continue;  // ran on neither rank: both skip it
            ++direct[rank];
            const auto n = static_cast<size_t>(s.shape[0]);
            if (is_int) {
              std::vector<int32_t> want(n, static_cast<int32_t>(s.want));
              want.resize(6, -1);
              EXPECT_EQ(int_out, want) << "step " << i;
            } else {
              std::vector<float> want(n, static_cast<float>(s.want));
              want.resize(6, -1.0f);
              EXPECT_EQ(float_out, want) << "step " << i;
            }
          }
      },
      long_window);
  EXPECT_GT(direct[0], 0) << "no call ran on the lane";
  EXPECT_EQ(direct[0], direct[1]);
}

TEST(EngineDirectLane, ARankWithAnOperationInFlightRunsNothingThere) {
  run_ranks(2, [&](Engine& e, int rank) {
    const std::vector<int64_t> shape{4};
    std::vector<float> in(4, 1.0f), out(4, -1.0f), pending_out(4);
    std::shared_ptr<HandleState> pending;
    // Rank 1 submits "pending" only later, so on rank 0 it stays in flight meanwhile.
    if (rank == 0) pending = enqueue(e, "pending", shape, in, pending_out);
    EXPECT_FALSE(run_direct(e, "now", shape, in, out)) << "rank " << rank;
    EXPECT_EQ(out, std::vector<float>(4, -1.0f));
    expect_ok(enqueue(e, "now", shape, in, out));
    EXPECT_EQ(out, std::vector<float>(4, 2.0f));
    if (rank == 1) pending = enqueue(e, "pending", shape, in, pending_out);
    expect_ok(pending);
    EXPECT_EQ(pending_out, std::vector<float>(4, 2.0f));
  });
}

TEST(EngineDirectLane, APeerWithAnOperationInFlightCostsNoWindowAndNoPause) {
  constexpr int kDeclined = 20;  // more than the misses in a row that pause the lane
  std::vector<std::chrono::steady_clock::duration> waited(2);
  std::vector<int> direct(2, 0);
  std::barrier sync(2);
  run_ranks(
      2,
      [&](Engine& e, int rank) {
        const std::vector<int64_t> shape{4};
        std::vector<float> in(4, 1.0f), out(4, -1.0f), pending_out(4);
        for (int i = 0; i < kDeclined; ++i) {
          // Rank 0 has "pending" in flight at its call, so it declines the call on the lane.
          const std::string n = std::to_string(i);
          std::shared_ptr<HandleState> pending;
          if (rank == 0) pending = enqueue(e, "pending" + n, shape, in, pending_out);
          const auto start = std::chrono::steady_clock::now();
          EXPECT_FALSE(run_direct(e, "now" + n, shape, in, out)) << "rank " << rank;
          waited[rank] += std::chrono::steady_clock::now() - start;
          expect_ok(enqueue(e, "now" + n, shape, in, out));
          if (rank == 1) pending = enqueue(e, "pending" + n, shape, in, pending_out);
          expect_ok(pending);
        }
        // Rank 1 counted none of those as a miss, so the lane is not paused: calls made
        // together run there again.
        for (int i = 0; i < 5; ++i) {
          sync.arrive_and_wait();
          const std::string name = "together" + std::to_string(i);
          direct[rank] += run_anywhere(e, name, shape, in, out);
          EXPECT_EQ(out, std::vector<float>(4, 2.0f));
        }
      },
      long_window);
  // Waiting out its window each time, rank 1 would have spent more than 10 of them.
  EXPECT_LT(waited[1], 10 * kLongWindow) << "rank 1 waited for a peer that had declined";
  EXPECT_GT(direct[0], 0) << "the lane stayed paused";
  EXPECT_EQ(direct[0], direct[1]);
}

TEST(EngineDirectLane, APartnerLateByMoreThanTheWindowIsWaitedForAsleep) {
  // The default busy poll: a window of 200 us, 2 ms after a miss. Rank 1 comes 3 ms late to
  // every call, as a rank whose core was taken for that long: rank 0 sleeps for it on the lane
  // (up to 20 ms) instead of sending both through the engine.
  constexpr int kCalls = 10;
  std::vector<int> direct(2, 0);
  std::barrier sync(2);
  run_ranks(2, [&](Engine& e, int rank) {
    const std::vector<int64_t> shape{4};
    std::vector<float> in(4, 1.0f + rank), out(4, -1.0f);
    for (int i = 0; i < kCalls; ++i) {
      sync.arrive_and_wait();
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      const std::string name = "late" + std::to_string(i);
      direct[rank] += run_anywhere(e, name, shape, in, out);
      EXPECT_EQ(out, std::vector<float>(4, 3.0f));
    }
  });
  // A scheduler that oversleeps rank 1 past rank 0's sleep can cost a call or two.
  EXPECT_GE(direct[0], kCalls - 2) << "rank 0 gave its late partner up";
  EXPECT_EQ(direct[0], direct[1]);
}

TEST(EngineDirectLane, MismatchedCallsFailThroughTheEngineAsBefore) {
  run_ranks(
      2,
      [&](Engine& e, int rank) {
        const std::vector<int64_t> shape{rank == 0 ? 2 : 3};
        std::vector<float> in(3, 1.0f), out(3, -1.0f);
        EXPECT_FALSE(run_direct(e, "w", shape, in, out));
        auto h = enqueue(e, "w", shape, in, out);
        h->wait();
        EXPECT_NE(h->error().find("Mismatched shapes"), std::string::npos) << h->error();
      },
      long_window);
}

TEST(EngineDirectLane, ABroadcastMayTakeTheWholeBudget) {
  // A 4 KiB budget at 2 ranks: 2 KiB a rank for allreduces and allgathers, all 4 KiB for a
  // broadcast, whose root alone posts data. What does not fit runs nowhere, at once.
  std::barrier sync(2);
  run_ranks(
      2,
      [&](Engine& e, int rank) {
        EXPECT_EQ(e.direct_lane_bytes(), 2048u);
        auto broadcast = [&](const std::string& name, std::vector<float>& data) {
          const std::vector<int64_t> shape{static_cast<int64_t>(data.size())};
          return e.run_direct(TensorView{.name = name,
                                         .op = OpType::kBroadcast,
                                         .dtype = DataType::kFloat32,
                                         .shape = shape,
                                         .root = 1,
                                         .input = data.data(),
                                         .output = data.data()});
        };
        int ran = 0;
        for (int i = 0; i < 10 && ran == 0; ++i) {
          sync.arrive_and_wait();  // a call that found no partner ran on neither rank
          std::vector<float> data(1024, static_cast<float>(rank * 10 + i));
          if (!broadcast("whole." + std::to_string(i), data)) continue;
          ++ran;
          EXPECT_EQ(data, std::vector<float>(1024, static_cast<float>(10 + i)));
        }
        EXPECT_EQ(ran, 1) << "no 4 KiB broadcast ran on the lane on rank " << rank;
        std::vector<float> over(1025, static_cast<float>(rank));
        EXPECT_FALSE(broadcast("over", over));
        EXPECT_EQ(over, std::vector<float>(1025, static_cast<float>(rank)));
        std::vector<float> piece(1024, 1.0f), gathered(2048, -1.0f);
        const std::vector<int64_t> piece_shape{1024};
        EXPECT_FALSE(e.run_direct(TensorView{.name = "gather",
                                             .op = OpType::kAllgather,
                                             .dtype = DataType::kFloat32,
                                             .shape = piece_shape,
                                             .input = piece.data(),
                                             .output = gathered.data()}));
        EXPECT_EQ(gathered, std::vector<float>(2048, -1.0f));
      },
      [](Config& c) {
        long_window(c);
        c.direct_lane_bytes = 4096;
      });
}

TEST(EngineDirectLane, AnOperationWaitedForAloneRunsThereWithTheEnginesResult) {
  // Each rank submits one operation at a time and waits for it: the waiting thread runs the
  // loop, finds the engine idle and takes the operation to the lane, as a synchronous call.
  constexpr int kOps = 50;
  std::vector<uint64_t> direct(2, 0);
  run_ranks(
      2,
      [&](Engine& e, int rank) {
        const std::vector<int64_t> shape{5};
        for (int i = 0; i < kOps; ++i) {
          std::vector<float> in(5, static_cast<float>(rank + i)), out(5, -1.0f);
          expect_ok(enqueue(e, "alone" + std::to_string(i % 3), shape, in, out));
          EXPECT_EQ(out, std::vector<float>(5, static_cast<float>(2 * i + 1))) << "op " << i;
        }
        direct[rank] = e.direct_runs();
      },
      long_window);
  EXPECT_GT(direct[0], 0u) << "no operation ran on the lane";
  EXPECT_EQ(direct[0], direct[1]);
}

TEST(EngineDirectLane, AnOperationWaitedForAloneLeavesAtOnceWhereThePeerNegotiates) {
  // Rank 0 has "pending" in flight, so it negotiates "now"; rank 1, idle, takes "now" to the
  // lane, and must leave at once rather than spin its window (80 ms) for a peer that will not
  // come there.
  constexpr int kRounds = 5;
  std::chrono::steady_clock::duration waited{};
  std::barrier sync(2);
  run_ranks(
      2,
      [&](Engine& e, int rank) {
        const std::vector<int64_t> shape{4};
        std::vector<float> in(4, 1.0f), out(4, -1.0f), pending_out(4, -1.0f);
        for (int i = 0; i < kRounds; ++i) {
          const std::string n = std::to_string(i);
          std::shared_ptr<HandleState> pending;
          if (rank == 0) {
            pending = enqueue(e, "pending" + n, shape, in, pending_out);
            // Driving the loop for a moment puts it in flight (rank 1 has not submitted it).
            EXPECT_FALSE(pending->wait_until(std::chrono::steady_clock::now() + 1ms));
          }
          sync.arrive_and_wait();
          const auto start = std::chrono::steady_clock::now();
          expect_ok(enqueue(e, "now" + n, shape, in, out));
          if (rank == 1) waited += std::chrono::steady_clock::now() - start;
          EXPECT_EQ(out, std::vector<float>(4, 2.0f));
          if (rank == 1) pending = enqueue(e, "pending" + n, shape, in, pending_out);
          expect_ok(pending);
          EXPECT_EQ(pending_out, std::vector<float>(4, 2.0f));
        }
      },
      long_window);
  // Spinning its window, rank 1 would have waited two of them, until it was a whole ring of
  // positions ahead of rank 0 (which takes none): from then on its calls leave at once anyway.
  EXPECT_LT(waited, kLongWindow) << "rank 1 waited on the lane for a negotiating peer";
}

TEST(EngineDirectLane, AWaitUntilADeadlineDoesNotOutstayItOnTheLane) {
  // Rank 0 waits 5 ms for an operation that rank 1 submits only afterwards: the lane's window
  // (80 ms) is longer than the wait, so the operation does not go there.
  std::chrono::steady_clock::duration waited{};
  std::barrier sync(2);
  run_ranks(
      2,
      [&](Engine& e, int rank) {
        const std::vector<int64_t> shape{4};
        std::vector<float> in(4, 1.0f), out(4, -1.0f);
        std::shared_ptr<HandleState> h;
        if (rank == 0) {
          h = enqueue(e, "later", shape, in, out);
          const auto start = std::chrono::steady_clock::now();
          EXPECT_FALSE(h->wait_until(start + 5ms));
          waited = std::chrono::steady_clock::now() - start;
        }
        sync.arrive_and_wait();
        if (rank == 1) h = enqueue(e, "later", shape, in, out);
        expect_ok(h);
        EXPECT_EQ(out, std::vector<float>(4, 2.0f));
      },
      long_window);
  EXPECT_LT(waited, kLongWindow / 2) << "a 5 ms wait took the lane's window";
}

TEST(EngineDirectLane, ZeroBytesTurnsItOff) {
  run_ranks(
      2,
      [&](Engine& e, int) {
        EXPECT_EQ(e.direct_lane_bytes(), 0u);
        const std::vector<int64_t> shape{1};
        std::vector<float> in(1, 1.0f), out(1);
        for (int i = 0; i < 3; ++i) {
          EXPECT_FALSE(run_direct(e, "off", shape, in, out));
          expect_ok(enqueue(e, "off", shape, in, out));
        }
      },
      [](Config& c) {
        long_window(c);
        c.direct_lane_bytes = 0;
      });
}

}  // namespace
}  // namespace krug::engine
