// What every framework binding takes from the core (include/krug/binding_rules.h): names for
// unnamed operations that start again at every init(), the alltoall splits rule, the op table.
#include "krug/binding_rules.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "api/op_name_counters.h"
#include "controller/alltoall_splits.h"
#include "krug/krug.h"

namespace krug {
namespace {

TEST(AlltoallSplitsRule, OneNonNegativeEntryPerRankSummingToTheRows) {
  using controller::alltoall_splits_problem;
  const std::vector<int64_t> good{1, 0, 3};
  EXPECT_EQ(alltoall_splits_problem(good, 4, 3), "");
  EXPECT_NE(alltoall_splits_problem(good, 5, 3), "");                         // sum != rows
  EXPECT_NE(alltoall_splits_problem(good, 4, 2), "");                         // entries != ranks
  EXPECT_NE(alltoall_splits_problem(std::vector<int64_t>{5, -1}, 4, 2), "");  // negative
  EXPECT_EQ(alltoall_splits_problem(std::vector<int64_t>{5, -1}, 4, 2),
            "splits [5, -1] must have one non-negative entry per rank of the process set (2) "
            "summing to the first dimension (4)");
}

TEST(OpNameCounters, OneCounterPerKindAndProcessSet) {
  OpNameCounters names;
  EXPECT_EQ(names.next("allreduce", 0), "allreduce.noname.0");
  EXPECT_EQ(names.next("allreduce", 0), "allreduce.noname.1");
  EXPECT_EQ(names.next("allgather", 0), "allgather.noname.0");
  EXPECT_EQ(names.next("allreduce", 1), "allreduce.noname.0");
  EXPECT_EQ(names.next("allreduce", 0), "allreduce.noname.2");
}

TEST(ReduceOps, HorovodsNamesWithEveryOpOnce) {
  std::vector<std::string> names;
  std::set<ReduceOp> ops;
  for (const auto& o : reduce_ops()) {
    names.emplace_back(o.name);
    ops.insert(o.op);
    EXPECT_EQ(reduce_op_name(o.op).empty(), false);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"Average", "Sum", "Adasum", "Min", "Max", "Product"}));
  EXPECT_EQ(ops.size(), names.size());
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

TEST(CheckAlltoallSplits, ThrowsInvalidArgumentForSplitsThatDoNotFit) {
  init();
  EXPECT_NO_THROW(check_alltoall_splits(std::vector<int64_t>{3}, 3, kGlobalProcessSet));
  EXPECT_NO_THROW(check_alltoall_splits({}, 5, kGlobalProcessSet));  // an even split
  try {
    check_alltoall_splits(std::vector<int64_t>{1, 2}, 3, kGlobalProcessSet);
    ADD_FAILURE() << "two splits for a process set of one rank were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("one non-negative entry per rank of the process set (1)"),
              std::string::npos)
        << e.what();
  }
  shutdown();
}

TEST(ReportInterrupted, StopsKrugOnThisRankWithTheReason) {
  report_interrupted("nothing");  // not initialized: nobody to tell, no error
  init();
  report_interrupted("synchronize (KeyboardInterrupt in Python)");
  std::vector<float> v(4, 1.0f);
  try {
    allreduce("after", v.data(), v.data(), DataType::kFloat32, {4});
    ADD_FAILURE() << "an allreduce after the interruption succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 ("), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("was interrupted while waiting in synchronize"),
              std::string::npos)
        << e.what();
  }
  shutdown();
  init();  // a new initialization works again
  allreduce("again", v.data(), v.data(), DataType::kFloat32, {4});
  EXPECT_EQ(v[0], 1.0f);
  shutdown();
}

}  // namespace
}  // namespace krug
