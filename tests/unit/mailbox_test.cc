// The control plane's shared-memory mailbox: frames in order across the ring's wrap, a full ring
// refusing rather than overwriting, the sleep/doorbell handshake losing no frame with the two
// ends on different threads, and the engine with mailboxes: lists too large for a ring (spilled
// to the socket), operations nobody waits for, and threads waiting on them (which drive the
// loop).
#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "engine/mailbox.h"
#include "engine_test_util.h"

namespace krug::engine {
namespace {

std::vector<uint8_t> frame_of(size_t size, uint8_t seed) {
  std::vector<uint8_t> f(size);
  for (size_t i = 0; i < size; ++i) f[i] = static_cast<uint8_t>(seed + i * 7);
  return f;
}

struct Memory {
  explicit Memory(size_t capacity) : bytes(Mailbox::bytes_for(capacity) + 64) {}
  uint8_t* aligned() {
    auto p = reinterpret_cast<uintptr_t>(bytes.data());
    return reinterpret_cast<uint8_t*>((p + 63) / 64 * 64);
  }
  std::vector<uint8_t> bytes;
};

TEST(Mailbox, FramesComeOutInOrderAcrossTheWrap) {
  Memory memory(256);
  Mailbox producer(memory.aligned(), 256), consumer(memory.aligned(), 256);
  EXPECT_FALSE(consumer.has_frame());
  for (int i = 0; i < 200; ++i) {
    const size_t size = static_cast<size_t>(i % 41);  // 0..40 bytes: every alignment
    auto f = frame_of(size, static_cast<uint8_t>(i));
    ASSERT_TRUE(producer.try_push(1000 + i, f.data(), f.size())) << i;
    ASSERT_TRUE(consumer.has_frame());
    EXPECT_EQ(consumer.front_seq(), uint64_t(1000 + i));
    std::vector<uint8_t> got;
    consumer.pop(got);
    ASSERT_EQ(got, f) << "frame " << i;
    EXPECT_FALSE(consumer.has_frame());
  }
}

TEST(Mailbox, AFullRingRefusesAndKeepsWhatItHolds) {
  Memory memory(256);
  Mailbox box(memory.aligned(), 256);
  EXPECT_EQ(box.largest_frame(), 128u);
  EXPECT_FALSE(box.try_push(0, frame_of(129, 0).data(), 129)) << "larger than half the ring";
  int pushed = 0;
  while (box.try_push(pushed, frame_of(24, static_cast<uint8_t>(pushed)).data(), 24)) ++pushed;
  EXPECT_EQ(pushed, 256 / (16 + 24));
  for (int i = 0; i < pushed; ++i) {
    EXPECT_EQ(box.front_seq(), uint64_t(i));
    std::vector<uint8_t> got;
    box.pop(got);
    EXPECT_EQ(got, frame_of(24, static_cast<uint8_t>(i)));
  }
  EXPECT_FALSE(box.has_frame());
}

TEST(Mailbox, TheProducerSeesWhenTheConsumerTookEverything) {
  Memory memory(256);
  Mailbox producer(memory.aligned(), 256), consumer(memory.aligned(), 256);
  EXPECT_FALSE(producer.has_frame());
  auto f = frame_of(10, 1);
  ASSERT_TRUE(producer.try_push(0, f.data(), f.size()));
  ASSERT_TRUE(producer.try_push(1, f.data(), f.size()));
  EXPECT_TRUE(producer.has_frame());
  std::vector<uint8_t> got;
  consumer.pop(got);
  EXPECT_TRUE(producer.has_frame()) << "one frame is still there";
  consumer.pop(got);
  EXPECT_FALSE(producer.has_frame());
}

// The consumer sleeps in poll() on a pipe (the doorbell) after announcing it; the producer rings
// only when it sees the announcement. Every frame must arrive, and the consumer must never
// sleep through one (the test would hang on the deadline instead).
TEST(Mailbox, TheDoorbellHandshakeLosesNoFrame) {
  constexpr int kFrames = 20000;
  Memory memory(4096);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  std::atomic<int> rings{0};
  std::thread producer([&] {
    Mailbox box(memory.aligned(), 4096);
    for (int i = 0; i < kFrames; ++i) {
      auto f = frame_of(static_cast<size_t>(i % 50), static_cast<uint8_t>(i));
      while (!box.try_push(i, f.data(), f.size())) std::this_thread::yield();
      if (box.consumer_sleeping()) {
        const char b = 1;
        ASSERT_EQ(::write(pipe_fds[1], &b, 1), 1);
        ++rings;
      }
      if (i % 1000 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  Mailbox box(memory.aligned(), 4096);
  int received = 0;
  while (received < kFrames) {
    while (box.has_frame()) {
      ASSERT_EQ(box.front_seq(), uint64_t(received));
      std::vector<uint8_t> got;
      box.pop(got);
      ASSERT_EQ(got, frame_of(static_cast<size_t>(received % 50), static_cast<uint8_t>(received)));
      ++received;
    }
    if (received == kFrames) break;
    if (box.prepare_to_sleep()) {
      pollfd p{pipe_fds[0], POLLIN, 0};
      ASSERT_GT(::poll(&p, 1, 10000), 0) << "slept through a frame after " << received;
      char drained[64];
      (void)!::read(pipe_fds[0], drained, sizeof drained);
      box.awake();
    }
  }
  producer.join();
  EXPECT_GT(rings.load(), 0);  // the consumer did sleep, and was woken
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

using testing::request;
using testing::run_ranks;
using testing::submit;

// A first step of thousands of long-named tensors makes request lists larger than a mailbox
// takes (128 KiB), and fills the rings while peers are busy in collectives: those lists go over
// the socket and are taken in order with the lists around them (a sender that waited for room
// instead deadlocked with a coordinator waiting in a collective for it).
TEST(EngineMailboxes, ListsLargerThanAMailboxAreSpilledInOrder) {
  constexpr int kTensors = 3000;
  run_ranks(3, [](Engine& e, int rank) {
    for (int step = 0; step < 2; ++step) {
      std::vector<float> data(kTensors);
      std::vector<std::shared_ptr<HandleState>> handles;
      for (int i = 0; i < kTensors; ++i) {
        data[i] = static_cast<float>(rank + i);
        handles.push_back(submit(
            e,
            request("a/rather/long/parameter/name/of/a/deep/model/layer." + std::to_string(i) +
                        std::string(60, 'x'),
                    controller::OpType::kAllreduce, DataType::kFloat32, {1}),
            &data[i], &data[i]));
      }
      for (auto& h : handles) {
        h->wait();
        ASSERT_EQ(h->error(), "");
      }
      for (int i = 0; i < kTensors; ++i) ASSERT_EQ(data[i], static_cast<float>(3 * i + 3)) << i;
    }
  });
}

// Operations nobody waits for still complete (the background thread takes them after the wake
// delay); operations waited for by several threads at once complete for every waiter.
TEST(EngineMailboxes, UnwaitedOperationsCompleteAndConcurrentWaitersAllReturn) {
  run_ranks(2, [](Engine& e, int rank) {
    std::vector<float> a(1000, static_cast<float>(rank + 1));
    auto unwaited = submit(e, request("unwaited", controller::OpType::kAllreduce,
                                      DataType::kFloat32, {1000}),
                           a.data(), a.data());
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!unwaited->done() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(unwaited->done()) << "an operation nobody waited for never ran";
    EXPECT_EQ(a[0], 3.0f);

    std::vector<std::vector<float>> values(8, std::vector<float>(10, static_cast<float>(rank)));
    std::vector<std::shared_ptr<HandleState>> handles;
    for (int i = 0; i < 8; ++i)
      handles.push_back(submit(e, request("w" + std::to_string(i), controller::OpType::kAllreduce,
                                          DataType::kFloat32, {10}),
                               values[i].data(), values[i].data()));
    std::vector<std::thread> waiters;
    for (int i = 0; i < 8; ++i) waiters.emplace_back([&, i] { handles[i]->wait(); });
    for (auto& t : waiters) t.join();
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(handles[i]->error(), "");
      EXPECT_EQ(values[i][9], 1.0f);
    }
  });
}

}  // namespace
}  // namespace krug::engine
