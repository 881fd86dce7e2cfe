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
}

}  // namespace
}  // namespace krug::engine
