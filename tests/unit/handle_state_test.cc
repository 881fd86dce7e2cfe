// HandleState: completion of grouped operations and their first error (engine/handle_state.h).
#include "engine/handle_state.h"

#include <gtest/gtest.h>

namespace krug::engine {
namespace {

TEST(HandleState, CompletesWhenEveryPartHasAndKeepsTheFirstError) {
  HandleState h(3);
  EXPECT_FALSE(h.complete_part());
  EXPECT_FALSE(h.complete_part("first"));
  EXPECT_FALSE(h.done());
  EXPECT_TRUE(h.complete_part("second"));
  EXPECT_TRUE(h.done());
  EXPECT_EQ(h.error(), "first");
  EXPECT_FALSE(h.complete_part());  // already complete
  EXPECT_FALSE(h.rejected());
}

TEST(HandleState, RejectCompletesEveryPartAtOnce) {
  HandleState h(3);
  EXPECT_FALSE(h.complete_part());
  h.reject("name in flight");
  EXPECT_TRUE(h.done());
  EXPECT_TRUE(h.rejected());
  EXPECT_EQ(h.error(), "name in flight");
  h.wait();                         // returns at once
  EXPECT_FALSE(h.complete_part());  // nothing left to complete
}

}  // namespace
}  // namespace krug::engine
