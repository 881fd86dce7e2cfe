// The direct lane (collectives/shm/shm_lane.h), its members as threads over one zeroed buffer:
// the same call on every member reduces in rank order, small or not; broadcasts and allgathers
// give every member the root's data and all data in rank order; different calls, or a
// member that does not come, run nowhere (false on every member that came, outputs untouched);
// members out of step find each other again; a call one member declines sends the others to
// the engine at once; members asleep after their window are woken by the last arrival or a
// decline; and over many calls with members missing at random, a call that ran on
// one member ran on all of them with the right result.
#include "collectives/shm/shm_lane.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace krug::collectives::shm {
namespace {

using namespace std::chrono_literals;

// Every member's window: long enough that members on an oversubscribed machine still meet.
constexpr auto kMeet = std::chrono::seconds(5);

struct Board {
  Board(int size, size_t max_bytes) : bytes(Lane::memory_bytes(size, max_bytes) + 64, 0) {}
  uint8_t* aligned() {
    auto p = reinterpret_cast<uintptr_t>(bytes.data());
    return reinterpret_cast<uint8_t*>((p + 63) / 64 * 64);
  }
  std::vector<uint8_t> bytes;
};

std::span<const uint8_t> sig(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// body(lane, member) on `size` threads, each member with its own Lane over one board with
// rooms of `room` bytes, its options those given with `tune(options, member)` applied.
void on_members(int size, std::chrono::nanoseconds window,
                const std::function<void(Lane&, int)>& body,
                const std::function<void(Lane::Options&, int)>& tune = {}, size_t room = 4096) {
  Board board(size, room);
  std::vector<std::thread> threads;
  for (int m = 0; m < size; ++m)
    threads.emplace_back([&, m] {
      Lane::Options options;
      options.max_bytes = room;
      options.window = window;
      if (tune) tune(options, m);
      Lane lane(m, size, board.aligned(), options);
      body(lane, m);
    });
  for (auto& t : threads) t.join();
}

bool sum_floats(Lane& lane, const std::string& name, std::vector<float>& in,
                std::vector<float>& out) {
  return lane.allreduce(sig(name), in.data(), out.data(), in.size(), DataType::kFloat32,
                        ReduceOp::kSum, 1.0, 1.0);
}

TEST(DirectLane, TheSameCallOnEveryMemberReducesInRankOrder) {
  // In float32, (1e8 + 1) - 1e8 is 0 but 1e8 + (1 - 1e8) is not: only rank order gives 0.
  // 7 floats fit beside the decision word (the last member reduces them); 100 do not (every
  // member reduces them).
  const float inputs[3] = {1e8f, 1.0f, -1e8f};
  std::vector<int> ran(3, 0);
  on_members(3, kMeet, [&](Lane& lane, int m) {
    for (int i = 0; i < 50; ++i) {
      const size_t count = i % 2 ? 7 : 100;
      std::vector<float> in(count, inputs[m]), out(count, 42.0f);
      if (!sum_floats(lane, "w", in, out)) continue;
      ++ran[m];
      for (float v : out) EXPECT_EQ(v, 0.0f) << "member " << m << ", call " << i;
    }
  });
  EXPECT_EQ(ran, std::vector<int>(3, 50));
}

TEST(DirectLane, ScaleFactorsAndOpsAreTheEngines) {
  on_members(2, kMeet, [&](Lane& lane, int m) {
    std::vector<double> in{1.0 + m, 10.0 * (m + 1)}, out(2);
    ASSERT_TRUE(lane.allreduce(sig("scaled"), in.data(), out.data(), 2, DataType::kFloat64,
                               ReduceOp::kSum, 2.0, 0.25));
    EXPECT_EQ(out, (std::vector<double>{(2.0 + 4.0) * 0.25, (20.0 + 40.0) * 0.25}));
    std::vector<int32_t> a{m == 0 ? 5 : -3, 7}, b(2);
    ASSERT_TRUE(lane.allreduce(sig("max"), a.data(), b.data(), 2, DataType::kInt32, ReduceOp::kMax,
                               1.0, 1.0));
    EXPECT_EQ(b, (std::vector<int32_t>{5, 7}));
  });
}

TEST(DirectLane, BroadcastGivesEveryMemberTheRootsData) {
  // 3 int32 fit beside the decision word, 100 do not; the root's output may be its input.
  std::vector<int> ran(3, 0);
  on_members(3, kMeet, [&](Lane& lane, int m) {
    for (int i = 0; i < 12; ++i) {
      const int root = i % 3;
      const size_t count = i % 2 ? 3 : 100;
      std::vector<int32_t> in(count, m == root ? 10 * i + 1 : -5), out(count, -1);
      int32_t* output = m == root && i % 4 == 0 ? in.data() : out.data();
      if (!lane.broadcast(sig("b"), in.data(), output, count, DataType::kInt32, root)) continue;
      ++ran[m];
      EXPECT_EQ(std::vector<int32_t>(output, output + count),
                std::vector<int32_t>(count, 10 * i + 1))
          << "member " << m << ", call " << i;
    }
  });
  EXPECT_EQ(ran, std::vector<int>(3, 12));
}

TEST(DirectLane, AllgatherGivesEveryMemberAllInputsInRankOrder) {
  std::vector<int> ran(3, 0);
  on_members(3, kMeet, [&](Lane& lane, int m) {
    for (const size_t count : {size_t{2}, size_t{4}, size_t{300}}) {  // 24 B and 48 B inline
      std::vector<float> in(count), out(3 * count, -1.0f), want;
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(1000 * m + i);
      for (int r = 0; r < 3; ++r)
        for (size_t i = 0; i < count; ++i) want.push_back(static_cast<float>(1000 * r + i));
      if (!lane.allgather(sig("g"), in.data(), out.data(), count, DataType::kFloat32)) continue;
      ++ran[m];
      EXPECT_EQ(out, want) << "member " << m << ", " << count << " elements each";
    }
  });
  EXPECT_EQ(ran, std::vector<int>(3, 3));
}

TEST(DirectLane, ABroadcastMayFillEveryMembersRoom) {
  // Only the root posts a broadcast's data, so it may take all 3 x 4096 bytes of a position;
  // allreduces and allgathers of a whole room each at the positions between, every position of
  // the ring in turn, must not overwrite it or be overwritten. A byte more runs nowhere.
  constexpr size_t kRoom = 4096 / sizeof(int32_t);
  std::vector<int> ran(3, 0);
  on_members(3, kMeet, [&](Lane& lane, int m) {
    EXPECT_EQ(lane.max_broadcast_bytes(), 3 * lane.max_bytes());
    for (int i = 0; i < 9; ++i) {
      const int root = i % 3;
      std::vector<int32_t> b(3 * kRoom), sum_in(kRoom, m + 1), sum_out(kRoom, -1);
      std::vector<int32_t> gather_in(kRoom, 10 * m + i), gathered(3 * kRoom, -1), want;
      for (size_t k = 0; k < b.size(); ++k)
        b[k] = m == root ? static_cast<int32_t>(1000 * i + k) : -1;
      for (int r = 0; r < 3; ++r) want.insert(want.end(), kRoom, 10 * r + i);
      const bool all =
          lane.broadcast(sig("b"), b.data(), b.data(), b.size(), DataType::kInt32, root) &
          lane.allreduce(sig("s"), sum_in.data(), sum_out.data(), kRoom, DataType::kInt32,
                         ReduceOp::kSum, 1.0, 1.0) &
          lane.allgather(sig("g"), gather_in.data(), gathered.data(), kRoom, DataType::kInt32);
      if (!all) continue;
      ++ran[m];
      for (size_t k = 0; k < b.size(); ++k)
        ASSERT_EQ(b[k], static_cast<int32_t>(1000 * i + k)) << "member " << m << ", call " << i;
      EXPECT_EQ(sum_out, std::vector<int32_t>(kRoom, 6)) << "member " << m << ", call " << i;
      EXPECT_EQ(gathered, want) << "member " << m << ", call " << i;
    }
    std::vector<int32_t> over(3 * kRoom + 1, 7), out(over.size(), -1);
    EXPECT_FALSE(
        lane.broadcast(sig("o"), over.data(), out.data(), over.size(), DataType::kInt32, 0));
    EXPECT_EQ(out, std::vector<int32_t>(over.size(), -1)) << "member " << m;
  });
  EXPECT_EQ(ran, std::vector<int>(3, 9));
}

TEST(DirectLane, ABroadcastOnTheBoardIsReadAsItsRootWritesIt) {
  // Rooms of 100 KiB, broadcasts of up to 300 KiB from each root in turn: the root writes its
  // room before the commit and the rest after it, around the board's end, in parts of 64 KiB
  // that the readers copy as they come. A window of 1 µs sends them to sleep for the parts
  // (sleeping up to 5 s for the decision first, so that they still meet).
  constexpr size_t kRoom = 100 * 1024;
  on_members(
      3, 1us,
      [&](Lane& lane, int m) {
        for (int i = 0; i < 6; ++i) {
          const int root = i % 3;
          const size_t count = (i < 3 ? 3 * kRoom : kRoom + 1000) / sizeof(int32_t);
          std::vector<int32_t> b(count, -1);
          if (m == root)
            for (size_t k = 0; k < count; ++k) b[k] = static_cast<int32_t>(1000 * i + k);
          ASSERT_TRUE(lane.broadcast(sig("b"), b.data(), b.data(), count, DataType::kInt32, root))
              << "member " << m << ", call " << i;
          for (size_t k = 0; k < count; ++k)
            ASSERT_EQ(b[k], static_cast<int32_t>(1000 * i + k)) << "member " << m << ", call " << i;
        }
      },
      [](Lane::Options& options, int) { options.sleep = 5s; }, kRoom);
}

// Every member may read every other's memory here (threads of one process): from 1 KiB of result
// on, broadcasts and allgathers read the root's (every member's) input in place.
void reading_in_place(Lane::Options& options, int) {
  options.pids.assign(3, ::getpid());
  options.cross_memory_bytes = 1024;
}

TEST(DirectLane, BroadcastsAndAllgathersReadInPlaceGiveTheBoardsResults) {
  // Each member spoils its input as soon as its call returns: an owner that returned before the
  // others had read its input would hand them spoilt data. Allgathers take inputs apart from
  // the output, at the member's own rows, and inside another member's rows (read from a copy).
  constexpr size_t kEach = 1000;  // floats: 4000 bytes, at most a member's room of 4096
  std::vector<int> ran(3, 0);
  on_members(
      3, kMeet,
      [&](Lane& lane, int m) {
        for (int i = 0; i < 60; ++i) {
          const int root = i % 3;
          const size_t count = i % 4 == 0 ? 2 : kEach;  // 8 bytes: on the board
          std::vector<float> b(count, m == root ? 10.0f * i + 1 : -1.0f);
          const bool broadcast =
              lane.broadcast(sig("b"), b.data(), b.data(), count, DataType::kFloat32, root);
          const std::vector<float> got_b = b;
          std::fill(b.begin(), b.end(), -7.0f);
          std::vector<float> gathered(3 * count, -1.0f), apart(count), want;
          for (int r = 0; r < 3; ++r)
            for (size_t k = 0; k < count; ++k) want.push_back(static_cast<float>(1000 * r + k + i));
          const size_t at = static_cast<size_t>(i % 3 == 0 ? m : (m + i) % 3) * count;
          float* in = i % 3 == 2 ? apart.data() : gathered.data() + at;
          for (size_t k = 0; k < count; ++k) in[k] = static_cast<float>(1000 * m + k + i);
          const bool gather =
              lane.allgather(sig("g"), in, gathered.data(), count, DataType::kFloat32);
          const std::vector<float> got_g = gathered;
          std::fill(gathered.begin(), gathered.end(), -7.0f);
          std::fill(apart.begin(), apart.end(), -7.0f);
          if (!broadcast || !gather) continue;
          ++ran[m];
          EXPECT_EQ(got_b, std::vector<float>(count, 10.0f * i + 1)) << "member " << m << ", " << i;
          EXPECT_EQ(got_g, want) << "member " << m << ", call " << i;
        }
      },
      reading_in_place);
  EXPECT_EQ(ran, std::vector<int>(3, 60));
}

TEST(DirectLane, ReadInPlaceTakesCallsBeyondTheBoardUpToItsOwnLimit) {
  // A room of 4096 bytes a member, 12288 in all; read in place, up to 24000 bytes of result.
  on_members(
      3, kMeet,
      [&](Lane& lane, int m) {
        EXPECT_EQ(lane.max_broadcast_bytes(), 24000u);
        EXPECT_EQ(lane.max_allgather_bytes(), 8000u);
        std::vector<uint8_t> b(24000, m == 1 ? 9 : 0);
        EXPECT_TRUE(lane.broadcast(sig("b"), b.data(), b.data(), b.size(), DataType::kUInt8, 1));
        EXPECT_EQ(b, std::vector<uint8_t>(24000, 9));
        std::vector<uint8_t> in(8000, static_cast<uint8_t>(m + 1)), out(24000), want;
        for (int r = 0; r < 3; ++r) want.insert(want.end(), 8000, static_cast<uint8_t>(r + 1));
        EXPECT_TRUE(lane.allgather(sig("g"), in.data(), out.data(), 8000, DataType::kUInt8));
        EXPECT_EQ(out, want);
        std::vector<uint8_t> over(24001, 1), out_over(3 * 8001, 0);
        EXPECT_FALSE(
            lane.broadcast(sig("o"), over.data(), over.data(), over.size(), DataType::kUInt8, 0));
        EXPECT_FALSE(
            lane.allgather(sig("p"), over.data(), out_over.data(), 8001, DataType::kUInt8));
        EXPECT_EQ(out_over, std::vector<uint8_t>(3 * 8001, 0));
      },
      [](Lane::Options& options, int m) {
        reading_in_place(options, m);
        options.max_in_place_bytes = 24000;
      });
}

TEST(DirectLane, AReadInPlaceThatFailsThrowsOnTheReaderAlone) {
  // Member 1 has the wrong pid for member 0 (no such process): its read fails after the call
  // committed, so it throws, naming member 0; member 0's result is whole.
  on_members(
      2, kMeet,
      [&](Lane& lane, int m) {
        std::vector<float> in(1000, static_cast<float>(m)), out(2000, -1.0f);
        if (m == 1) {
          try {
            lane.allgather(sig("g"), in.data(), out.data(), 1000, DataType::kFloat32);
            ADD_FAILURE() << "member 1 read a process that does not exist";
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("could not read rank 0"), std::string::npos)
                << e.what();
          }
          return;
        }
        EXPECT_TRUE(lane.allgather(sig("g"), in.data(), out.data(), 1000, DataType::kFloat32));
        std::vector<float> want(1000, 0.0f);
        want.resize(2000, 1.0f);
        EXPECT_EQ(out, want);
      },
      [](Lane::Options& options, int m) {
        reading_in_place(options, m);
        options.pids.resize(2);
        if (m == 1) options.pids[0] = std::numeric_limits<int32_t>::max();  // beyond pid_max
      });
}

TEST(DirectLane, CollectivesThatDifferInKindOrRootRunNowhere) {
  on_members(2, kMeet, [&](Lane& lane, int m) {
    std::vector<float> in(4, 1.0f + m), out(4, -1.0f), gathered(8, -1.0f);
    // The same signature, one member broadcasting and the other reducing.
    EXPECT_FALSE(m == 0 ? lane.broadcast(sig("k"), in.data(), out.data(), 4, DataType::kFloat32, 0)
                        : sum_floats(lane, "k", in, out));
    // Broadcasts from different roots; an allgather against an allreduce.
    EXPECT_FALSE(lane.broadcast(sig("r"), in.data(), out.data(), 4, DataType::kFloat32, m));
    EXPECT_FALSE(m == 0
                     ? lane.allgather(sig("a"), in.data(), gathered.data(), 4, DataType::kFloat32)
                     : sum_floats(lane, "a", in, out));
    EXPECT_EQ(out, std::vector<float>(4, -1.0f)) << "an output changed on member " << m;
    EXPECT_EQ(gathered, std::vector<float>(8, -1.0f)) << "an output changed on member " << m;
    EXPECT_TRUE(lane.broadcast(sig("r"), in.data(), out.data(), 4, DataType::kFloat32, 1));
    EXPECT_EQ(out, std::vector<float>(4, 2.0f));
    // Broadcasts that fill the board (6000 bytes, rooms of 4096): from different roots, and
    // against an allreduce of a whole room. Neither may write into the other's room.
    std::vector<float> big(1500, 1.0f + m), big_out(1500, -1.0f), room(1024, 1.0f + m);
    EXPECT_FALSE(lane.broadcast(sig("R"), big.data(), big_out.data(), 1500, DataType::kFloat32, m));
    EXPECT_FALSE(
        m == 0 ? lane.broadcast(sig("B"), big.data(), big_out.data(), 1500, DataType::kFloat32, 0)
               : sum_floats(lane, "B", room, room));
    EXPECT_EQ(big_out, std::vector<float>(1500, -1.0f)) << "an output changed on member " << m;
    EXPECT_EQ(room, std::vector<float>(1024, 1.0f + m)) << "an output changed on member " << m;
    EXPECT_TRUE(lane.broadcast(sig("R"), big.data(), big_out.data(), 1500, DataType::kFloat32, 1));
    EXPECT_EQ(big_out, std::vector<float>(1500, 2.0f));
  });
}

TEST(DirectLane, DifferentCallsRunNowhereAndTheLaneGoesOn) {
  on_members(2, kMeet, [&](Lane& lane, int m) {
    std::vector<float> in(4, 1.0f + m), out(4, -1.0f);
    EXPECT_FALSE(sum_floats(lane, m == 0 ? "a" : "b", in, out)) << "member " << m;
    EXPECT_EQ(out, std::vector<float>(4, -1.0f)) << "an output changed on member " << m;
    // The same name with another shape is another call too.
    std::vector<float> longer(5, 1.0f), out5(5, -1.0f);
    EXPECT_FALSE(m == 0 ? sum_floats(lane, "c", in, out) : sum_floats(lane, "c", longer, out5));
    EXPECT_TRUE(sum_floats(lane, "d", in, out));
    EXPECT_EQ(out, std::vector<float>(4, 3.0f));
  });
}

// Member 0 makes "x" alone and gives up after its window; then both go on together.
void member_0_alone_on_x(Lane& lane, int m, std::barrier<>& sync, std::vector<float>& in,
                         std::vector<float>& out) {
  if (m == 0) {
    EXPECT_FALSE(sum_floats(lane, "x", in, out));
    EXPECT_FALSE(lane.partner_left()) << "nobody else posted x";
  }
  sync.arrive_and_wait();
}

TEST(DirectLane, AMemberThatDoesNotComeCostsAWindowAndStepIsFoundAgain) {
  std::barrier sync(2);
  on_members(2, 20ms, [&](Lane& lane, int m) {
    std::vector<float> in(3, 1.0f + m), out(3, -1.0f);
    member_0_alone_on_x(lane, m, sync, in, out);
    // Member 1 comes late to "x", with a window longer than any scheduler's delay: member 0
    // posted "x" at the dead position and runs it through the engine, so member 1 gives up at
    // once instead of waiting at the next position for a partner that is not coming.
    if (m == 1) {
      lane.set_wait(kMeet, {});
      const auto start = std::chrono::steady_clock::now();
      EXPECT_FALSE(sum_floats(lane, "x", in, out));
      EXPECT_LT(std::chrono::steady_clock::now() - start, kMeet / 2);
      EXPECT_TRUE(lane.partner_left()) << "member 0 posted x";
    }
    EXPECT_EQ(out, std::vector<float>(3, -1.0f));
    sync.arrive_and_wait();
    // Both again (a window long enough for a busy machine: a short one could lose its partner
    // to the scheduler): they meet at the next position.
    lane.set_wait(kMeet, {});
    EXPECT_TRUE(sum_floats(lane, "y", in, out)) << "member " << m;
    EXPECT_EQ(out, std::vector<float>(3, 3.0f));
  });
}

TEST(DirectLane, ALateMemberWaitsWhenTheDeadPositionHeldAnotherCall) {
  std::barrier sync(2);
  on_members(2, 20ms, [&](Lane& lane, int m) {
    std::vector<float> in(3, 1.0f + m), out(3, -1.0f);
    member_0_alone_on_x(lane, m, sync, in, out);
    // Member 1's call is another one: member 0 may yet make it, so member 1 posts at the next
    // position and waits there, where member 0 comes.
    lane.set_wait(kMeet, {});
    if (m == 0) std::this_thread::sleep_for(50ms);  // longer than member 1's old window
    EXPECT_TRUE(sum_floats(lane, "z", in, out)) << "member " << m;
    EXPECT_EQ(out, std::vector<float>(3, 3.0f));
  });
}

// Member 0 declines "x" (it runs it through the engine) before or after member 1 comes with
// it; member 1, whose window no scheduler outlasts, leaves at once either way. Then both meet.
void decline_x_while_member_1_calls_it(bool member_1_first) {
  std::barrier engine(2);  // where both run "x" instead
  on_members(2, kMeet, [&](Lane& lane, int m) {
    std::vector<float> in(3, 1.0f + m), out(3, -1.0f);
    const auto x = Lane::allreduce_call(in.size(), DataType::kFloat32, ReduceOp::kSum, 1.0, 1.0);
    if (m == 0) {
      if (member_1_first) std::this_thread::sleep_for(20ms);
      lane.decline(x, sig("x"));
    } else {
      if (!member_1_first) std::this_thread::sleep_for(20ms);
      const auto start = std::chrono::steady_clock::now();
      EXPECT_FALSE(sum_floats(lane, "x", in, out));
      EXPECT_LT(std::chrono::steady_clock::now() - start, kMeet / 2);
      EXPECT_TRUE(lane.partner_left());
      EXPECT_EQ(out, std::vector<float>(3, -1.0f));
    }
    engine.arrive_and_wait();
    EXPECT_TRUE(sum_floats(lane, "y", in, out)) << "member " << m;
    EXPECT_EQ(out, std::vector<float>(3, 3.0f));
  });
}

TEST(DirectLane, ADeclinedCallSendsAPartnerWaitingWithItToTheEngine) {
  decline_x_while_member_1_calls_it(true);
}

TEST(DirectLane, ADeclinedCallSendsAPartnerComingLaterToTheEngine) {
  decline_x_while_member_1_calls_it(false);
}

TEST(DirectLane, ADeclinedCallLeavesAnotherCallItsPartner) {
  std::barrier sync(2);
  on_members(2, kMeet, [&](Lane& lane, int m) {
    std::vector<float> in(3, 1.0f + m), out(3, -1.0f);
    // Member 0 declines "x"; member 1's call is "y", which member 0 makes next: member 1 passes
    // the dead position and waits at the next one, where member 0 comes.
    if (m == 0) {
      lane.decline(Lane::allreduce_call(in.size(), DataType::kFloat32, ReduceOp::kSum, 1.0, 1.0),
                   sig("x"));
    }
    sync.arrive_and_wait();
    EXPECT_TRUE(sum_floats(lane, "y", in, out)) << "member " << m;
    EXPECT_EQ(out, std::vector<float>(3, 3.0f));
  });
}

// The CPU time this thread has used: what tells a sleeping wait from a spinning one.
std::chrono::nanoseconds thread_cpu_time() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

// Members 0 .. size-2 come at once with a window of a microsecond and a sleep no scheduler
// outlasts; the last comes 100 ms later. The early ones sleep (they use a fraction of the wait
// in CPU time) until the last one's arrival wakes them, and the call runs on every member.
void early_members_sleep_until_the_last_comes(int size) {
  on_members(size, 1us, [&](Lane& lane, int m) {
    lane.set_wait(1us, kMeet);
    std::vector<float> in(3, 1.0f), out(3, -1.0f);
    const bool last = m == size - 1;
    if (last) std::this_thread::sleep_for(100ms);
    const auto start = std::chrono::steady_clock::now();
    const auto cpu = thread_cpu_time();
    EXPECT_TRUE(sum_floats(lane, "late", in, out)) << "member " << m;
    EXPECT_EQ(out, std::vector<float>(3, static_cast<float>(size)));
    // The last one in decided the call: it did not wait.
    EXPECT_EQ(lane.last_wait(), last ? Lane::Wait::kNone : Lane::Wait::kSlept) << "member " << m;
    if (last) return;
    EXPECT_LT(std::chrono::steady_clock::now() - start, kMeet / 2) << "member " << m;
    EXPECT_LT(thread_cpu_time() - cpu, 50ms) << "member " << m << " spun instead of sleeping";
  });
}

TEST(DirectLane, AMemberAsleepAfterItsWindowIsWokenByItsPartnersArrival) {
  early_members_sleep_until_the_last_comes(2);
}

TEST(DirectLane, EveryMemberAsleepIsWokenByTheLastArrival) {
  early_members_sleep_until_the_last_comes(3);
}

TEST(DirectLane, AMemberAsleepLeavesWhenItsPartnerDeclines) {
  on_members(2, 1us, [&](Lane& lane, int m) {
    std::vector<float> in(3, 1.0f), out(3, -1.0f);
    if (m == 1) {
      std::this_thread::sleep_for(100ms);
      lane.decline(Lane::allreduce_call(in.size(), DataType::kFloat32, ReduceOp::kSum, 1.0, 1.0),
                   sig("x"));
      return;
    }
    lane.set_wait(1us, kMeet);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(sum_floats(lane, "x", in, out));
    EXPECT_LT(std::chrono::steady_clock::now() - start, kMeet / 2);
    EXPECT_TRUE(lane.partner_left());
    EXPECT_EQ(out, std::vector<float>(3, -1.0f));
  });
}

TEST(DirectLane, AMemberWhosePartnerNeverComesGivesUpAfterItsSleep) {
  std::barrier done(2);
  on_members(2, 1us, [&](Lane& lane, int m) {
    if (m == 0) {
      lane.set_wait(1us, 30ms);
      std::vector<float> in(3, 1.0f), out(3, -1.0f);
      const auto start = std::chrono::steady_clock::now();
      EXPECT_FALSE(sum_floats(lane, "x", in, out));
      EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
      EXPECT_FALSE(lane.partner_left());
    }
    done.arrive_and_wait();
    // The sleeper's abort left the lane in step: both meet at the next call.
    lane.set_wait(kMeet, {});
    std::vector<float> in(3, 1.0f), out(3, -1.0f);
    EXPECT_TRUE(sum_floats(lane, "y", in, out)) << "member " << m;
  });
}

// The cores this process may use.
std::vector<int> allowed_cores() {
  cpu_set_t allowed;
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return cores;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cores.push_back(c);
  return cores;
}

// Lets the calling thread run on `cores` only.
void run_on(const std::vector<int>& cores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cores) CPU_SET(c, &set);
  ASSERT_EQ(sched_setaffinity(0, sizeof(set), &set), 0);
}

// Pins the calling thread to the first core this process may use.
void pin_to_one_core() {
  const auto cores = allowed_cores();
  ASSERT_FALSE(cores.empty());
  run_on({cores.front()});
}

TEST(DirectLane, MembersOnOneCoreSleepInsteadOfSpinningTheirWindow) {
  // A member spinning for a partner on its own core keeps that partner off the core until the
  // window (20 ms) or the scheduler's slice (milliseconds) ends: 200 calls would take 0.2 s or
  // more. Sleeping at once, each takes a switch between the two.
  constexpr int kCalls = 200;
  std::vector<std::chrono::steady_clock::duration> took(2);
  on_members(2, 20ms, [&](Lane& lane, int m) {
    pin_to_one_core();
    lane.set_wait(20ms, kMeet);
    std::vector<float> in(3, 1.0f), out(3, -1.0f);
    EXPECT_TRUE(sum_floats(lane, "first", in, out));  // each learns the other's core
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) EXPECT_TRUE(sum_floats(lane, "c", in, out)) << "call " << i;
    took[m] = std::chrono::steady_clock::now() - start;
  });
  for (int m = 0; m < 2; ++m)
    EXPECT_LT(took[m], 100ms) << "member " << m << " spun while its partner could not run";
}

// The core the thread `tid` of this process last ran on (field 39 of its stat line), or -1.
int core_of_thread(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  if (!std::getline(stat, line) || line.rfind(')') == std::string::npos) return -1;
  // The command name, field 2, may hold spaces: count the fields after its parenthesis.
  std::istringstream rest(line.substr(line.rfind(')') + 1));
  std::string field;
  for (int i = 3; i <= 39 && rest >> field; ++i)
    if (i == 39) return std::stoi(field);
  return -1;
}

TEST(DirectLane, AMemberSharingItsPartnersCoreMovesToAFreeOne) {
  const auto cores = allowed_cores();
  if (cores.size() < 2) GTEST_SKIP() << "needs two cores";
  // Both start on the first core; then member 1 may run on every core, member 0 only there.
  // Member 1 comes first to the second call and, waiting, finds member 0 on its core: it moves
  // to a core no member runs on. Member 0 sees it there before coming in (on a busy machine the
  // scheduler may move it again later), and member 1 may still run on every core afterwards.
  std::barrier both(2);
  std::atomic<pid_t> member_1_thread{0};
  on_members(2, kMeet, [&](Lane& lane, int m) {
    pin_to_one_core();
    std::vector<float> in(3, 1.0f), out(3, -1.0f);
    EXPECT_TRUE(sum_floats(lane, "first", in, out));  // each learns the other's core
    std::this_thread::sleep_for(1ms);  // past the shortest pause between two tries to move
    if (m == 1) {
      run_on(cores);
      member_1_thread = gettid();
    }
    both.arrive_and_wait();
    if (m == 0) {
      bool moved = false;
      for (auto until = std::chrono::steady_clock::now() + 2s;
           !moved && std::chrono::steady_clock::now() < until;) {
        std::this_thread::sleep_for(1ms);  // the core is member 1's until it moves
        const int core = core_of_thread(member_1_thread);
        moved = core >= 0 && core != cores[0];
      }
      EXPECT_TRUE(moved) << "member 1 stayed on its partner's core while it waited";
    }
    EXPECT_TRUE(sum_floats(lane, "second", in, out)) << "member " << m;
    EXPECT_EQ(out, std::vector<float>(3, 2.0f));
    if (m == 1) {
      EXPECT_EQ(allowed_cores(), cores) << "member 1 lost cores it may run on";
    }
  });
}

TEST(DirectLane, ACallThatRanOnOneMemberRanOnAllWithTheRightResult) {
  constexpr int kMembers = 3, kCalls = 300;
  // Member m makes call i unless this says no (about one in six): then it sits the call out.
  auto calls = [](int m, int i) { return (i * 7 + m * 13 + i / 5) % 6 != 0; };
  auto everyone_calls = [&](int i) {
    for (int m = 0; m < kMembers; ++m)
      if (!calls(m, i)) return false;
    return true;
  };
  // Short windows race commits against aborts; every fourth call that everyone makes has a
  // window no scheduler outlasts, so those calls must meet (3 threads on 2 busy cores lose
  // each other within 2 ms).
  auto sure_to_meet = [&](int i) { return everyone_calls(i) && i % 4 == 0; };
  std::vector<std::vector<int>> outcome(kMembers, std::vector<int>(kCalls, -1));  // -1: no call
  std::vector<std::vector<float>> result(kMembers, std::vector<float>(kCalls));
  std::barrier sync(kMembers);
  on_members(kMembers, 2ms, [&](Lane& lane, int m) {
    for (int i = 0; i < kCalls; ++i) {
      sync.arrive_and_wait();
      if (!calls(m, i)) continue;
      lane.set_wait(sure_to_meet(i) ? std::chrono::nanoseconds(kMeet) : 2ms, {});
      std::vector<float> in(16, static_cast<float>(m + 1)), out(16, -1.0f);
      const bool ran = sum_floats(lane, "call-" + std::to_string(i), in, out);
      outcome[m][i] = ran;
      result[m][i] = out[15];
      if (!ran) {
        EXPECT_EQ(out, std::vector<float>(16, -1.0f));
      }
    }
  });
  int met = 0;
  for (int i = 0; i < kCalls; ++i) {
    int ran = 0;
    for (int m = 0; m < kMembers; ++m) ran += outcome[m][i] == 1;
    if (!everyone_calls(i)) {
      EXPECT_EQ(ran, 0) << "call " << i << " ran without a member";
      continue;
    }
    if (sure_to_meet(i)) {
      EXPECT_EQ(ran, kMembers) << "call " << i << " did not meet";
    }
    if (ran == 0) continue;
    EXPECT_EQ(ran, kMembers) << "call " << i << " ran on some members only";
    for (int m = 0; m < kMembers; ++m) EXPECT_EQ(result[m][i], 6.0f) << "call " << i;
    ++met;
  }
  EXPECT_GT(met, 0);
}

TEST(DirectLane, MembersOutOfStepNeverSplitACallNorMixUpResults) {
  // No barrier per call: the members drift apart (one sits a call out, declines it, or gives
  // up on it) and meet at positions with other calls, which abort, while others commit. Each
  // call's small result comes through the decider's announcement or the position's own line,
  // each large one from the posted data. Every fiftieth call the members line up again and
  // make the call with a window no scheduler outlasts: those calls must meet.
  constexpr int kMembers = 3, kCalls = 3000, kRealign = 50;
  enum Act { kRun, kDecline, kSkip };
  auto act = [](int m, int i) {
    const unsigned h = static_cast<unsigned>(i * 2654435761u + m * 40503u) >> 7;
    if (i % kRealign == 0) return kRun;
    return h % 11 == 0 ? kDecline : h % 13 == 0 ? kSkip : kRun;
  };
  auto elements = [](int i) { return i % 3 == 0 ? 32 : 4; };  // 128 B, or 16 B (inline)
  auto value = [](int m, int i) { return static_cast<float>((m + 1) * (i % 97 + 1)); };
  std::vector<std::vector<int>> ran(kMembers, std::vector<int>(kCalls, 0));
  std::vector<std::vector<float>> result(kMembers, std::vector<float>(kCalls));
  std::barrier sync(kMembers);
  on_members(kMembers, 20us, [&](Lane& lane, int m) {
    for (int i = 0; i < kCalls; ++i) {
      if (i % kRealign == 0) sync.arrive_and_wait();
      // Every fifth call may sleep after its window: the decision then comes by the futex.
      const auto sleep = std::chrono::nanoseconds(i % 5 == 0 ? 200us : 0us);
      lane.set_wait(i % kRealign == 0 ? std::chrono::nanoseconds(kMeet) : 20us, sleep);
      const auto n = static_cast<size_t>(elements(i));
      std::vector<float> in(n, value(m, i)), out(n, -1.0f);
      const std::string name = "call-" + std::to_string(i);
      if (act(m, i) == kSkip) continue;
      if (act(m, i) == kDecline) {
        lane.decline(Lane::allreduce_call(n, DataType::kFloat32, ReduceOp::kSum, 1.0, 1.0),
                     sig(name));
        continue;
      }
      ran[m][i] = sum_floats(lane, name, in, out);
      if (ran[m][i] == 0) {
        EXPECT_EQ(out, std::vector<float>(n, -1.0f)) << "member " << m << ", call " << i;
        continue;
      }
      result[m][i] = out[0];
      for (size_t e = 1; e < n; ++e) EXPECT_EQ(out[e], out[0]) << "member " << m << ", call " << i;
    }
  });
  int met = 0;
  for (int i = 0; i < kCalls; ++i) {
    int on = 0;
    for (int m = 0; m < kMembers; ++m) on += ran[m][i];
    if (i % kRealign == 0) {
      EXPECT_EQ(on, kMembers) << "call " << i << " did not meet";
    }
    if (on == 0) continue;
    ASSERT_EQ(on, kMembers) << "call " << i << " ran on some members only";
    for (int m = 0; m < kMembers; ++m)
      EXPECT_EQ(result[m][i], value(0, i) + value(1, i) + value(2, i)) << "call " << i;
    ++met;
  }
}

}  // namespace
}  // namespace krug::collectives::shm
