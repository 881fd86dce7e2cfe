// The frontend seam (include/krug/frontend.h) as a binding uses it, in a job of one (init()
// without krugrun): completion callbacks, ready events, the output allocator's tensor index, and
// failures as structured statuses. Uses nothing but the public headers.
#include "krug/frontend.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <future>
#include <vector>

namespace krug::frontend {
namespace {

using namespace std::chrono_literals;

class Frontend : public ::testing::Test {
 protected:
  void SetUp() override { krug::init(); }
  void TearDown() override { krug::shutdown(); }
};

TensorView floats(std::vector<float>& x, const std::vector<int64_t>& shape) {
  return TensorView{.dtype = DataType::kFloat32, .shape = shape, .data = x.data()};
}

// Opens when told; counts how often the engine waited for it.
class Latch : public ReadyEvent {
 public:
  void wait() override {
    ++waits;
    opened_.wait();
  }
  void open() { open_.set_value(); }
  std::atomic<int> waits{0};

 private:
  std::promise<void> open_;
  std::shared_future<void> opened_ = open_.get_future().share();
};

TEST_F(Frontend, TheDoneCallbackRunsOnceWithAnOkStatus) {
  std::vector<float> x{1, 2, 3};
  const std::vector<int64_t> shape{3};
  std::promise<Status> status;
  std::atomic<int> calls{0};
  Callbacks callbacks;
  callbacks.done = [&](const Status& s) {
    if (calls++ == 0) status.set_value(s);
  };
  Handle h = enqueue("x", Op{.type = OpType::kAllreduce}, floats(x, shape), x.data(), callbacks);
  h.wait();
  auto done = status.get_future();
  ASSERT_EQ(done.wait_for(60s), std::future_status::ready);  // hang guard only
  const Status s = done.get();
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.rank, 0);
  EXPECT_EQ(s.op, OpType::kAllreduce);
  EXPECT_TRUE(s.message.empty());
  EXPECT_TRUE(h.status().ok());
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  krug::shutdown();
  EXPECT_EQ(calls.load(), 1);
}

// An operation completed by its callback has no waiting thread to drive the loop: it must not
// sit out the batching window (the cycle time) that waiting threads rely on. With a cycle of
// 30 s it would take 30 s; the bound is a hang guard far below that, not a timing.
TEST(FrontendCallbacks, AnOperationWithOnlyADoneCallbackDoesNotWaitOutTheCycleTime) {
  ::setenv("KRUG_CYCLE_TIME", "30000", 1);
  krug::init();
  std::vector<float> x{1, 2, 3};
  std::promise<Status> status;
  Callbacks callbacks;
  callbacks.done = [&](const Status& s) { status.set_value(s); };
  Handle h = enqueue("x", Op{.type = OpType::kAllreduce}, floats(x, {3}), x.data(), callbacks);
  auto done = status.get_future();
  const bool finished = done.wait_for(10s) == std::future_status::ready;
  krug::shutdown();
  ::unsetenv("KRUG_CYCLE_TIME");
  ASSERT_TRUE(finished) << "the operation waited for the 30 s cycle";
  EXPECT_TRUE(done.get().ok());
}

TEST_F(Frontend, TheEngineReadsTheInputsOnlyAfterTheReadyEventAndWaitsForItOnce) {
  const std::vector<int64_t> shape{4};
  std::vector<std::vector<float>> data(3, std::vector<float>(4, 0.0f));
  std::vector<TensorView> inputs;
  std::vector<void*> outputs;
  for (auto& d : data) {
    inputs.push_back(floats(d, shape));
    outputs.push_back(d.data());
  }
  auto latch = std::make_shared<Latch>();
  Callbacks callbacks;
  callbacks.ready = latch;
  Handle h = enqueue_group("g", Op{.type = OpType::kAllreduce}, inputs, outputs, callbacks);
  // Nothing can complete the operation before the event opens: reading the inputs waits for it.
  EXPECT_FALSE(h.poll());
  for (size_t i = 0; i < data.size(); ++i) data[i].assign(4, static_cast<float>(i + 1));
  latch->open();
  h.wait();
  for (size_t i = 0; i < data.size(); ++i)
    EXPECT_EQ(data[i], std::vector<float>(4, static_cast<float>(i + 1))) << "tensor " << i;
  EXPECT_EQ(latch->waits.load(), 1);
}

TEST_F(Frontend, TheAllocatorIsToldWhichTensorOfTheGroupItSizes) {
  const std::vector<int64_t> shape_a{2}, shape_b{3};
  std::vector<float> a{1, 2}, b{3, 4, 5};
  std::vector<TensorView> inputs{floats(a, shape_a), floats(b, shape_b)};
  std::vector<std::vector<float>> results(2);
  std::vector<Shape> shapes(2);
  Callbacks callbacks;
  callbacks.allocate = [&](size_t tensor, const Shape& shape) -> void* {
    shapes.at(tensor) = shape;
    results.at(tensor).resize(static_cast<size_t>(shape.at(0)));
    return results[tensor].data();
  };
  enqueue_group("ag", Op{.type = OpType::kAllgather}, inputs, {}, callbacks).wait();
  EXPECT_EQ(shapes[0], Shape{2});
  EXPECT_EQ(shapes[1], Shape{3});
  EXPECT_EQ(results[0], a);
  EXPECT_EQ(results[1], b);
}

TEST_F(Frontend, ARejectedSubmissionIsAStatusThatNamesTheTensorSetAndOp) {
  std::vector<float> x{1};
  const std::vector<int64_t> shape{1};
  std::promise<Status> from_callback;
  Callbacks callbacks;
  callbacks.done = [&](const Status& s) { from_callback.set_value(s); };
  Handle h = enqueue("lonely", Op{.type = OpType::kBroadcast, .process_set = ProcessSet{7}},
                     floats(x, shape), x.data(), callbacks);
  EXPECT_TRUE(h.rejected());  // the engine refused it at submission
  EXPECT_THROW(h.wait(), Error);
  const Status s = h.status();
  EXPECT_EQ(s.code, Status::Code::kRejected);
  EXPECT_EQ(s.rank, 0);
  EXPECT_FALSE(s.host.empty());
  EXPECT_EQ(s.process_set, 7);
  EXPECT_EQ(s.op, OpType::kBroadcast);
  EXPECT_EQ(s.tensor, "lonely");
  EXPECT_NE(s.message.find("process set 7 does not exist"), std::string::npos) << s.message;
  auto done = from_callback.get_future();
  ASSERT_EQ(done.wait_for(60s), std::future_status::ready);
  EXPECT_EQ(done.get().message, s.message);
}

TEST_F(Frontend, WhatNegotiationRefusesIsAPreconditionNotAFailure) {
  // Adasum of integers: every rank's coordinator refuses it the same way, nothing is sent, and
  // the same call would fail again (TensorFlow raises FailedPreconditionError for this code;
  // an elastic run must not take it for a lost peer and retry).
  std::vector<int32_t> x{1, 2};
  const std::vector<int64_t> shape{2};
  Handle h = enqueue("adasum.ints", Op{.type = OpType::kAllreduce, .reduce_op = ReduceOp::kAdasum},
                     TensorView{.dtype = DataType::kInt32, .shape = shape, .data = x.data()},
                     x.data());
  EXPECT_THROW(h.wait(), Error);
  const Status s = h.status();
  EXPECT_EQ(s.code, Status::Code::kPrecondition) << s.message;
  EXPECT_FALSE(h.rejected());
  EXPECT_EQ(s.tensor, "adasum.ints");
  // The engine goes on.
  std::vector<float> y{3};
  Handle ok = enqueue("after", Op{.type = OpType::kAllreduce}, floats(y, {1}), y.data());
  ok.wait();
  EXPECT_TRUE(ok.status().ok());
}

TEST_F(Frontend, AnEmptyNameOrAnEmptyGroupIsRejectedBeforeEnqueueing) {
  std::vector<float> x{1};
  const std::vector<int64_t> shape{1};
  EXPECT_THROW(enqueue("", Op{}, floats(x, shape), x.data()), InvalidArgument);
  EXPECT_THROW(enqueue_group("g", Op{}, {}, {}), InvalidArgument);
  // A CUDA tensor in a build without CUDA, or on a device this process does not see.
  TensorView on_gpu = floats(x, shape);
  on_gpu.device = Device{DeviceKind::kCUDA, 64};
  EXPECT_THROW(enqueue("x", Op{}, on_gpu, x.data()), InvalidArgument);
  // Nothing was left in flight: the name is free.
  enqueue("x", Op{}, floats(x, shape), x.data()).wait();
}

}  // namespace
}  // namespace krug::frontend
