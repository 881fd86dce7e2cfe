// MovePacer (collectives/shm/move_pacer.h): a member sharing its core may try to move at once,
// then again after a short pause; a move the scheduler undoes at once doubles the pause up to
// its longest, and one that lasted brings the shortest back.
#include "collectives/shm/move_pacer.h"

#include <gtest/gtest.h>

namespace krug::collectives::shm {
namespace {

using namespace std::chrono_literals;
using Pacer = MovePacer;

TEST(MovePacer, TheFirstTryComesAtOnceAndTheNextAfterTheShortestPause) {
  Pacer pacer;
  const Pacer::Clock::time_point t0{1s};
  EXPECT_TRUE(pacer.may_try(t0));
  EXPECT_EQ(pacer.pause(), Pacer::kShortestPause);
  EXPECT_FALSE(pacer.may_try(t0 + Pacer::kShortestPause - 1ns));
  EXPECT_TRUE(pacer.may_try(t0 + Pacer::kShortestPause));
}

TEST(MovePacer, MovesUndoneAtOnceDoubleThePauseUpToTheLongest) {
  Pacer pacer;
  auto now = Pacer::Clock::time_point{1s};
  ASSERT_TRUE(pacer.may_try(now));
  Pacer::Clock::duration expected = Pacer::kShortestPause;
  // Sharing again each time the pause ends: 200 us, 400 us, ... 100 ms, and no more.
  for (int i = 0; i < 12; ++i) {
    EXPECT_FALSE(pacer.may_try(now + pacer.pause() - 1us)) << "try " << i;
    now += pacer.pause();
    ASSERT_TRUE(pacer.may_try(now)) << "try " << i;
    expected = std::min(2 * expected, Pacer::kLongestPause);
    EXPECT_EQ(pacer.pause(), expected) << "try " << i;
  }
  EXPECT_EQ(pacer.pause(), Pacer::kLongestPause);
}

TEST(MovePacer, AMoveThatLastedBringsTheShortestPauseBack) {
  Pacer pacer;
  auto now = Pacer::Clock::time_point{1s};
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(pacer.may_try(now));
    now += pacer.pause();
  }
  ASSERT_GT(pacer.pause(), Pacer::kShortestPause);
  // The member shares a core again only well after the pause: its move had lasted.
  now += Pacer::kUndone;
  EXPECT_TRUE(pacer.may_try(now));
  EXPECT_EQ(pacer.pause(), Pacer::kShortestPause);
}

}  // namespace
}  // namespace krug::collectives::shm
