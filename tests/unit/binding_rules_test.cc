// What every framework binding takes from the core (include/krug/binding_rules.h): names for
// unnamed operations that start again at every init().
#include "krug/binding_rules.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api/op_name_counters.h"
#include "krug/krug.h"

namespace krug {
namespace {

TEST(OpNameCounters, OneCounterPerKindAndProcessSet) {
  OpNameCounters names;
  EXPECT_EQ(names.next("allreduce", 0), "allreduce.noname.0");
  EXPECT_EQ(names.next("allreduce", 0), "allreduce.noname.1");
  EXPECT_EQ(names.next("allgather", 0), "allgather.noname.0");
  EXPECT_EQ(names.next("allreduce", 1), "allreduce.noname.0");
  EXPECT_EQ(names.next("allreduce", 0), "allreduce.noname.2");
}

// Through the public API in a job of one (init() without krugrun).
TEST(UnnamedOpNames, StartAgainAtEveryInit) {
  ASSERT_FALSE(is_initialized());
  EXPECT_THROW(unnamed_op_name("allreduce"), Error);
  init();
  EXPECT_EQ(unnamed_op_name("allreduce"), "allreduce.noname.0");
  EXPECT_EQ(name_or_unnamed("", "allreduce"), "allreduce.noname.1");
  EXPECT_EQ(name_or_unnamed("grad", "allreduce"), "grad");
  EXPECT_EQ(unnamed_op_name("broadcast"), "broadcast.noname.0");
  shutdown();
  init();
  EXPECT_EQ(unnamed_op_name("allreduce"), "allreduce.noname.0");
  EXPECT_EQ(unnamed_op_name("broadcast"), "broadcast.noname.0");
  shutdown();
}

}  // namespace
}  // namespace krug
