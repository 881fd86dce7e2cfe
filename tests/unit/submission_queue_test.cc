// The submission queue on its own: what enqueue admits, refuses and rejects, before the loop
// sees anything.
#include "engine/submission_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace krug::engine {
namespace {

class SubmissionQueueTest : public ::testing::Test {
 protected:
  SubmissionQueueTest() { queue_.set_process_set(0, {0, 1}, ""); }

  // Submits one handle over tensors named `names`, each of `shape`.
  std::shared_ptr<HandleState> submit(const std::vector<std::string>& names,
                                      const std::vector<std::vector<int64_t>>& shapes = {}) {
    auto handle = std::make_shared<HandleState>(static_cast<int>(names.size()));
    queue_.submit(handle, names.size(), [&](size_t i, TensorArgs& args) {
      args.request.name = names[i];
      args.request.shape = shapes.empty() ? std::vector<int64_t>{4} : shapes[i];
    });
    return handle;
  }

  std::vector<std::string> take_names() {
    std::vector<Table::node_type> arrived;
    bool shutting_down = false;
    EXPECT_TRUE(queue_.take(/*background=*/false, arrived, shutting_down));
    std::vector<std::string> names;
    for (auto& node : arrived) names.push_back(node.mapped().args.request.name);
    queue_.recycle(arrived);
    return names;
  }

  Wakeup wakeup_;
  std::atomic<int> drivers_{0};
  SubmissionQueue queue_{/*rank=*/0, wakeup_, /*waiters_drive=*/true, drivers_, {64 << 20, 1.0}};
};

TEST_F(SubmissionQueueTest, AGroupWithABadTensorQueuesNoneOfIt) {
  auto handle = submit({"a", "b"}, {{4}, {-1}});
  ASSERT_TRUE(handle->done());
  EXPECT_TRUE(handle->rejected());
  EXPECT_NE(handle->error().find("negative dimension"), std::string::npos) << handle->error();
  EXPECT_EQ(handle->failed_tensor(), "b");
  EXPECT_FALSE(queue_.has_work());
  // "a" left the in-flight set with it, so it may be submitted again.
  auto again = submit({"a"});
  EXPECT_FALSE(again->done());
  EXPECT_EQ(take_names(), std::vector<std::string>{"a"});
}

TEST_F(SubmissionQueueTest, ANameInFlightIsRejectedUntilItsEntryIsRecycled) {
  auto first = submit({"grad"});
  auto second = submit({"grad"});
  EXPECT_FALSE(first->done());
  ASSERT_TRUE(second->done());
  EXPECT_TRUE(second->rejected());
  EXPECT_NE(second->error().find("already in flight on rank 0"), std::string::npos)
      << second->error();
  EXPECT_EQ(take_names(), std::vector<std::string>{"grad"});  // recycled: no longer in flight
  auto third = submit({"grad"});
  EXPECT_FALSE(third->done());
}

// The loop sleeps on through a cycle timer that fires for a burst a waiting thread has taken,
// or for one still younger than the cycle time; it takes one that is due, or hurried.
TEST_F(SubmissionQueueTest, TheCycleTimerWakesTheLoopOnlyForABurstThatIsDue) {
  queue_.set_tuned(64 << 20, /*cycle_time_ms=*/60'000.0);
  auto young = submit({"a"});
  EXPECT_FALSE(queue_.timer_fired()) << "a burst younger than the cycle is left to its waiter";
  EXPECT_EQ(take_names(), std::vector<std::string>{"a"});
  EXPECT_FALSE(queue_.timer_fired()) << "a waiting thread took the burst: nothing to do";
  auto hurried = submit({"b"});
  queue_.expedite();
  EXPECT_TRUE(queue_.timer_fired()) << "an expedited burst is taken at once";
  EXPECT_EQ(take_names(), std::vector<std::string>{"b"});
  queue_.set_tuned(64 << 20, /*cycle_time_ms=*/0.0);
  auto due = submit({"c"});
  EXPECT_TRUE(queue_.timer_fired()) << "a burst as old as the cycle is the loop's to take";
}

TEST_F(SubmissionQueueTest, ARankOutsideTheProcessSetIsRejected) {
  queue_.set_process_set(3, {1, 2}, "");
  auto handle = std::make_shared<HandleState>();
  queue_.submit(handle, 1, [](size_t, TensorArgs& args) {
    args.request.name = "x";
    args.request.process_set = 3;
  });
  ASSERT_TRUE(handle->done());
  EXPECT_NE(handle->error().find("rank 0 is not a member of process set 3 (ranks [1, 2])"),
            std::string::npos)
      << handle->error();
}

TEST_F(SubmissionQueueTest, AfterAFailureEveryEnqueueFailsWithIt) {
  auto queued = submit({"a"});
  const auto left = queue_.fail("rank 1 on host b died");
  EXPECT_EQ(left.size(), 1u);  // the caller fails what was still queued
  auto later = submit({"b", "c"});
  ASSERT_TRUE(later->done());
  EXPECT_FALSE(later->rejected());  // not the caller's mistake
  // The first tensor's failure, naming it: the reason alone does not say which call it ended.
  EXPECT_EQ(later->error(), "allreduce 'b' (process set 0) was not started: rank 1 on host b died");
  EXPECT_EQ(later->failed_tensor(), "b");
}

TEST_F(SubmissionQueueTest, AfterShutdownIsAskedEnqueueFailsSayingSo) {
  queue_.request_shutdown();
  auto later = submit({"a"});
  ASSERT_TRUE(later->done());
  EXPECT_EQ(later->error(),
            "allreduce 'a' (process set 0) was not started: krug is shutting down on rank 0: no "
            "new operations");
}

}  // namespace
}  // namespace krug::engine
