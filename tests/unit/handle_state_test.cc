// HandleState: completion, errors, and the spin before sleeping (engine/handle_state.h).
#include "engine/handle_state.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace krug::engine {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(HandleState, CompletesWhenEveryPartHasAndKeepsTheFirstError) {
  HandleState h(3);
  EXPECT_FALSE(h.complete_part());
  EXPECT_FALSE(h.complete_part("first"));
  EXPECT_FALSE(h.done());
  EXPECT_TRUE(h.complete_part("second"));
  EXPECT_TRUE(h.done());
  EXPECT_EQ(h.error(), "first");
  EXPECT_FALSE(h.complete_part());  // already complete
}

// The spin ends as soon as the operation completes (not when the spin budget runs out).
TEST(HandleState, ASpinningWaiterReturnsOnceCompleted) {
  HandleState h(1, std::chrono::duration_cast<std::chrono::microseconds>(10s));
  std::thread completer([&] {
    std::this_thread::sleep_for(20ms);
    h.complete_part();
  });
  const auto start = Clock::now();
  h.wait();
  EXPECT_TRUE(h.done());
  EXPECT_LT(Clock::now() - start, 5s);
  completer.join();
}

// A deadline shorter than the spin budget is honoured.
TEST(HandleState, WaitUntilHonoursADeadlineShorterThanTheSpin) {
  HandleState h(1, std::chrono::duration_cast<std::chrono::microseconds>(10s));
  const auto start = Clock::now();
  EXPECT_FALSE(h.wait_until(start + 50ms));
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_FALSE(h.done());
}

}  // namespace
}  // namespace krug::engine
