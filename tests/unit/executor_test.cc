// The executor against a fake communicator: what it hands the data plane (fused buffers, parts,
// byte counts per rank) and what it makes of the results (scale factors, output shapes, memory
// from the allocator), without a network or a second rank.
#include "engine/executor.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace krug::engine {
namespace {

// A member of a set of `size` ranks that all hold the same data: a sum multiplies by `size`,
// a gather repeats this rank's bytes. Records what it was asked.
class FakeCommunicator : public collectives::Communicator {
 public:
  FakeCommunicator(int rank, int size, bool parts) : rank_(rank), size_(size), parts_(parts) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    EXPECT_EQ(dtype, DataType::kFloat32);
    EXPECT_EQ(op, ReduceOp::kSum);
    auto* f = static_cast<float*>(data);
    allreduced.assign(f, f + count);
    allreduce_data = data;
    for (size_t i = 0; i < count; ++i) f[i] *= static_cast<float>(size_);
  }
  bool has_allreduce_parts() const override { return parts_; }
  void allreduce_parts(const std::vector<collectives::FusedPart>& parts, DataType, ReduceOp,
                       double prescale, double postscale) override {
    seen_parts = parts;
    for (const auto& p : parts) {
      if (!p.out) continue;
      const auto* in = static_cast<const float*>(p.in);
      auto* out = static_cast<float*>(p.out);
      for (size_t i = 0; i < p.count; ++i)
        out[i] = static_cast<float>(in[i] * prescale * size_ * postscale);
    }
  }
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType,
                     ReduceOp) override {
    scattered = counts;
    size_t offset = 0;
    for (int r = 0; r < rank_; ++r) offset += counts[static_cast<size_t>(r)];
    const auto* f = static_cast<const float*>(in) + offset;
    auto* o = static_cast<float*>(out);
    for (size_t i = 0; i < counts[static_cast<size_t>(rank_)]; ++i)
      o[i] = f[i] * static_cast<float>(size_);
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    gathered = bytes;
    auto* o = static_cast<uint8_t*>(out);
    for (size_t b : bytes) {
      std::memcpy(o, in, std::min(b, bytes[static_cast<size_t>(rank_)]));
      o += b;
    }
  }
  void broadcast(void*, size_t bytes, int root) override {
    broadcast_bytes = bytes;
    broadcast_root = root;
  }
  void alltoallv(const void*, const std::vector<size_t>& send, void*,
                 const std::vector<size_t>& recv) override {
    sent = send;
    received = recv;
  }
  void barrier() override {}
  void sendrecv(const void*, size_t, int, void*, size_t, int) override {
    ADD_FAILURE() << "the executor sends nothing point to point";
  }
  const char* backend_name() const override { return "fake"; }

  std::vector<float> allreduced;
  void* allreduce_data = nullptr;
  std::vector<collectives::FusedPart> seen_parts;
  std::vector<size_t> scattered, gathered, sent, received;
  size_t broadcast_bytes = 0;
  int broadcast_root = -1;

 private:
  int rank_, size_;
  bool parts_;
};

TensorArgs args_for(std::vector<float>& in, std::vector<float>& out, std::vector<int64_t> shape) {
  TensorArgs a;
  a.request.shape = std::move(shape);
  a.input = in.data();
  a.output = out.data();
  return a;
}

TEST(Executor, AFusedAllreduceCopiesInScalesAveragesAndCopiesOut) {
  FakeCommunicator comm(0, 2, false);
  std::vector<float> a_in{1, 2}, a_out(2), b_in{3, 4, 5}, b_out(3);
  TensorArgs a = args_for(a_in, a_out, {2}), b = args_for(b_in, b_out, {3});
  // A joined rank's tensor (no arguments here) sits between them and contributes zeros.
  std::vector<FusedTensor> tensors{{&a, 2, nullptr}, {nullptr, 1, nullptr}, {&b, 3, nullptr}};
  Executor executor;
  executor.allreduce(comm, Reduction{.op = ReduceOp::kAverage, .prescale = 3.0, .postscale = 0.5},
                     tensors);
  EXPECT_EQ(comm.allreduced, (std::vector<float>{3, 6, 0, 9, 12, 15}));  // prescaled, fused
  EXPECT_EQ(a_out, (std::vector<float>{1.5f, 3}));  // * 3 (pre), * 2 (sum), / 2 (avg), * 0.5
  EXPECT_EQ(b_out, (std::vector<float>{4.5f, 6, 7.5f}));
  EXPECT_EQ(a_in, (std::vector<float>{1, 2}));  // inputs untouched
}

TEST(Executor, ASingleTensorIsReducedInItsOutputWithoutTheFusionBuffer) {
  FakeCommunicator comm(0, 4, false);
  std::vector<float> in{1, 2, 3}, out(3);
  TensorArgs a = args_for(in, out, {3});
  std::vector<FusedTensor> tensors{{&a, 3, nullptr}};
  Executor executor;
  executor.allreduce(comm, Reduction{.op = ReduceOp::kSum}, tensors);
  EXPECT_EQ(comm.allreduce_data, out.data());
  EXPECT_EQ(out, (std::vector<float>{4, 8, 12}));
}

TEST(Executor, ADataPlaneWithPartsGetsTheTensorsInPlaceAndTheScaleFactors) {
  FakeCommunicator comm(0, 2, true);
  std::vector<float> a_in{1, 2}, a_out(2);
  TensorArgs a = args_for(a_in, a_out, {2});
  std::vector<FusedTensor> tensors{{&a, 2, nullptr}, {nullptr, 5, nullptr}};
  Executor executor;
  executor.allreduce(comm, Reduction{.op = ReduceOp::kAverage, .postscale = 3.0}, tensors);
  ASSERT_EQ(comm.seen_parts.size(), 2u);
  EXPECT_EQ(comm.seen_parts[0].in, a_in.data());
  EXPECT_EQ(comm.seen_parts[0].out, a_out.data());
  EXPECT_EQ(comm.seen_parts[1].in, nullptr);
  EXPECT_EQ(comm.seen_parts[1].count, 5u);
  EXPECT_TRUE(comm.allreduced.empty());          // no fused allreduce
  EXPECT_EQ(a_out, (std::vector<float>{3, 6}));  // * 2 (sum) / 2 (avg) * 3 (post)
}

TEST(Executor, AllgatherSizesTheOutputFromEveryRanksRowsAndAsksTheAllocator) {
  FakeCommunicator comm(1, 2, false);
  std::vector<float> in{7, 8, 9, 10, 11, 12}, unused;
  TensorArgs a = args_for(in, unused, {3, 2});
  std::vector<int64_t> asked;
  std::vector<float> result;
  a.allocate_output = [&](const std::vector<int64_t>& shape) -> void* {
    asked = shape;
    result.resize(static_cast<size_t>(shape[0] * shape[1]));
    return result.data();
  };
  OpResult out;
  const std::vector<int64_t> rows{2, 3};
  Executor executor;
  executor.allgather(comm, DataType::kFloat32, rows, a, out);
  EXPECT_EQ(asked, (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(out.shape, (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(comm.gathered, (std::vector<size_t>{16, 24}));
  EXPECT_TRUE(out.data.empty());  // the allocator's memory, not the handle's
}

TEST(Executor, ReducescatterGivesLowerRanksTheExtraRowsAndAverages) {
  FakeCommunicator comm(1, 2, false);
  std::vector<float> in{1, 2, 3, 4, 5}, unused;
  TensorArgs a = args_for(in, unused, {5});
  OpResult out;
  Executor executor;
  executor.reducescatter(comm, Reduction{.op = ReduceOp::kAverage, .prescale = 2.0}, a, out);
  EXPECT_EQ(comm.scattered, (std::vector<size_t>{3, 2}));
  EXPECT_EQ(out.shape, (std::vector<int64_t>{2}));
  ASSERT_EQ(out.data.size(), 2 * sizeof(float));
  const auto* f = reinterpret_cast<const float*>(out.data.data());
  EXPECT_EQ(f[0], 8.0f);  // 4 * 2 (pre) * 2 (sum) / 2 (avg)
  EXPECT_EQ(f[1], 10.0f);
  EXPECT_EQ(in, (std::vector<float>{1, 2, 3, 4, 5}));  // the prescale worked on a copy
}

TEST(Executor, AlltoallSendsAndReceivesTheRowsOfItsRowAndColumn) {
  FakeCommunicator comm(0, 2, false);
  std::vector<float> in(6), unused;
  TensorArgs a = args_for(in, unused, {3, 2});
  OpResult out;
  const std::vector<int64_t> rows{1, 2,   // rank 0 sends 1 row to 0, 2 rows to 1
                                  4, 0};  // rank 1 sends 4 rows to 0
  Executor executor;
  executor.alltoall(comm, DataType::kFloat32, rows, a, out);
  EXPECT_EQ(comm.sent, (std::vector<size_t>{8, 16}));
  EXPECT_EQ(comm.received, (std::vector<size_t>{8, 32}));
  EXPECT_EQ(out.received_splits, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(out.shape, (std::vector<int64_t>{5, 2}));
}

TEST(Executor, BroadcastCopiesAnOutOfPlaceInputFirst) {
  FakeCommunicator comm(0, 2, false);
  std::vector<float> in{1, 2, 3}, out(3);
  TensorArgs a = args_for(in, out, {3});
  const std::vector<int64_t> shape{3};
  Executor executor;
  executor.broadcast(comm, DataType::kFloat32, shape, 1, a);
  EXPECT_EQ(out, in);
  EXPECT_EQ(comm.broadcast_bytes, 12u);
  EXPECT_EQ(comm.broadcast_root, 1);
}

}  // namespace
}  // namespace krug::engine
