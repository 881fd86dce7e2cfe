// The MPI communicator on its own: `mpirun -np N krug_mpi_communicator_tests`, every rank a
// process running the same tests in the same order, so their collectives pair up. Results are
// checked against references each rank computes from every rank's (closed-form) input, reduced
// in rank order with krug's kernels: bitwise, for every dtype, counts {0, 1, 7, 1000, 1 << 20},
// tiny message and segment sizes (pieces, pipelining), process-set communicators,
// point-to-point, and the timeout error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "collectives/mpi/mpi_backend.h"
#include "krug/types.h"
#include "reduce/reduce.h"

namespace krug::collectives::mpi {
namespace {

using namespace std::chrono_literals;

constexpr DataType kAllTypes[] = {DataType::kUInt8,    DataType::kInt8,    DataType::kInt16,
                                  DataType::kInt32,    DataType::kInt64,   DataType::kFloat16,
                                  DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                                  DataType::kBool};

const WorldTopology& world() {
  static const WorldTopology topology = world_topology();
  return topology;
}

// Every test makes its communicators in the same order on every rank; the tag only has to
// differ between creations that may overlap.
int next_tag() {
  static int tag = 100;
  return tag++;
}

Options test_options() {
  Options o;
  o.timeout = 20s;  // a broken test fails with an error instead of waiting for ctest's limit
  return o;
}

std::unique_ptr<Communicator> communicator(const std::vector<int32_t>& ranks,
                                           const Options& options = test_options()) {
  const int tag = next_tag();
  auto it = std::find(ranks.begin(), ranks.end(), world().rank);
  if (it == ranks.end()) return nullptr;
  return make_communicator(ranks, static_cast<int>(it - ranks.begin()), tag, options);
}

std::vector<int32_t> all_ranks() {
  std::vector<int32_t> r(world().size);
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// Rank r's input: element i of `dtype` from a small integer pattern (exact in every dtype),
// or, for float32 / float64, full-mantissa values whose sums round.
std::vector<uint8_t> input(int r, DataType dtype, size_t count) {
  std::vector<uint8_t> out(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    const uint32_t h =
        static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(r + 1) * 40503u;
    const int small = static_cast<int>(h % 7) - 3 + (dtype == DataType::kUInt8 ? 3 : 0);
    const double wide = std::ldexp(1.0 + (h % 1000003u) / 1000003.0, static_cast<int>(h % 9) - 4);
    void* p = out.data() + i * dtype_size(dtype);
    auto put = [&](auto v) { std::memcpy(p, &v, sizeof(v)); };
    switch (dtype) {
      case DataType::kUInt8:
        put(static_cast<uint8_t>(small));
        break;
      case DataType::kInt8:
        put(static_cast<int8_t>(small));
        break;
      case DataType::kInt16:
        put(static_cast<int16_t>(small));
        break;
      case DataType::kInt32:
        put(static_cast<int32_t>(small));
        break;
      case DataType::kInt64:
        put(static_cast<int64_t>(small));
        break;
      case DataType::kFloat16:
        put(reduce::float_to_half(static_cast<float>(small) / 4));
        break;
      case DataType::kBFloat16:
        put(reduce::float_to_bfloat16(static_cast<float>(small) / 4));
        break;
      case DataType::kFloat32:
        put(static_cast<float>(wide));
        break;
      case DataType::kFloat64:
        put(wide);
        break;
      case DataType::kBool:
        put(static_cast<uint8_t>(h % 3 == 0));
        break;
    }
  }
  return out;
}

// `inputs` (one per rank) reduced in rank order.
std::vector<uint8_t> reference(DataType dtype, ReduceOp op, size_t count,
                               const std::vector<std::vector<uint8_t>>& inputs) {
  std::vector<uint8_t> acc = inputs[0];
  for (size_t r = 1; r < inputs.size(); ++r)
    reduce::reduce_into(dtype, op, acc.data(), inputs[r].data(), count);
  return acc;
}

std::vector<std::vector<uint8_t>> every_input(DataType dtype, size_t count) {
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < world().size; ++r) inputs.push_back(input(r, dtype, count));
  return inputs;
}

std::vector<uint8_t> reference(DataType dtype, ReduceOp op, size_t count) {
  return reference(dtype, op, count, every_input(dtype, count));
}

std::string where(DataType dtype, size_t count) {
  return std::string(dtype_name(dtype)) + " x " + std::to_string(count) + " on rank " +
         std::to_string(world().rank) + " of " + std::to_string(world().size);
}

TEST(MpiCommunicator, HasTheWorldsRanks) {
  auto comm = communicator(all_ranks());
  EXPECT_EQ(comm->rank(), world().rank);
  EXPECT_EQ(comm->size(), world().size);
  EXPECT_STREQ(comm->backend_name(), "mpi");
  comm->barrier();
}

TEST(MpiCommunicator, AllreduceEveryDtypeAndCountInRankOrder) {
  auto comm = communicator(all_ranks());
  for (DataType dtype : kAllTypes)
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{1} << 20}) {
      const auto inputs = every_input(dtype, count);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        auto data = inputs[world().rank];
        comm->allreduce(data.data(), count, dtype, op);
        EXPECT_TRUE(data == reference(dtype, op, count, inputs))
            << reduce_op_name(op) << " " << where(dtype, count);
      }
    }
}

// Tiny messages and segments: buffers go in many pieces and many pipeline steps, and the
// result must not change by a bit.
TEST(MpiCommunicator, AllreduceInPiecesAndSegmentsIsBitwiseTheSame) {
  Options tiny = test_options();
  tiny.max_message_bytes = 24;
  tiny.segment_bytes = 40;
  auto comm = communicator(all_ranks(), tiny);
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16})
    for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
      auto data = input(world().rank, dtype, count);
      comm->allreduce(data.data(), count, dtype, ReduceOp::kSum);
      EXPECT_TRUE(data == reference(dtype, ReduceOp::kSum, count)) << where(dtype, count);
    }
}

// Where a tensor sits in a fused buffer changes which rank reduces its elements and how they
// are cut; the sum of each element must stay the rank-ordered one.
TEST(MpiCommunicator, AllreduceIsLayoutIndependent) {
  auto comm = communicator(all_ranks());
  const size_t count = 1001;
  const auto want = reference(DataType::kFloat32, ReduceOp::kSum, count);
  for (size_t offset : {size_t{0}, size_t{1}, size_t{333}, size_t{4097}}) {
    auto x = input(world().rank, DataType::kFloat32, count);
    std::vector<uint8_t> fused((offset + count + 5) * sizeof(float), 0);
    std::memcpy(fused.data() + offset * sizeof(float), x.data(), x.size());
    comm->allreduce(fused.data(), offset + count + 5, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(std::memcmp(fused.data() + offset * sizeof(float), want.data(), want.size()), 0)
        << "offset " << offset << " on rank " << world().rank;
  }
}

TEST(MpiCommunicator, ReducescatterUnevenCounts) {
  auto comm = communicator(all_ranks());
  const int n = world().size;
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = r % 3 == 1 ? 0 : 5 + 3 * r;
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t before = std::accumulate(counts.begin(), counts.begin() + world().rank, size_t{0});
  for (DataType dtype : {DataType::kInt32, DataType::kBFloat16, DataType::kFloat64}) {
    const auto in = input(world().rank, dtype, total);
    const auto all = reference(dtype, ReduceOp::kSum, total);
    const size_t esize = dtype_size(dtype);
    std::vector<uint8_t> out(counts[world().rank] * esize + 1, 0xEE);
    comm->reducescatter(in.data(), out.data(), counts, dtype, ReduceOp::kSum);
    EXPECT_EQ(std::memcmp(out.data(), all.data() + before * esize, counts[world().rank] * esize), 0)
        << where(dtype, total);
    EXPECT_EQ(out.back(), 0xEE) << "wrote past this rank's chunk";
  }
}

TEST(MpiCommunicator, AllgathervUnevenAndEmptyInPieces) {
  Options small = test_options();
  small.max_message_bytes = 7;
  auto comm = communicator(all_ranks(), small);
  const int n = world().size;
  std::vector<size_t> bytes(n);
  for (int r = 0; r < n; ++r) bytes[r] = r == 1 ? 0 : 3 + 11 * r;
  std::vector<uint8_t> want;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < bytes[r]; ++i) want.push_back(static_cast<uint8_t>(r * 31 + i));
  std::vector<uint8_t> mine(
      want.begin() + std::accumulate(bytes.begin(), bytes.begin() + world().rank, size_t{0}),
      want.begin() + std::accumulate(bytes.begin(), bytes.begin() + world().rank + 1, size_t{0}));
  std::vector<uint8_t> out(want.size(), 0);
  comm->allgatherv(mine.data(), out.data(), bytes);
  EXPECT_EQ(out, want);
}

TEST(MpiCommunicator, BroadcastFromEveryRootInPieces) {
  Options small = test_options();
  small.max_message_bytes = 1000;
  auto comm = communicator(all_ranks(), small);
  for (int root = 0; root < world().size; ++root) {
    auto data = input(world().rank, DataType::kFloat64, 12345);
    comm->broadcast(data.data(), data.size(), root);
    EXPECT_EQ(data, input(root, DataType::kFloat64, 12345)) << "root " << root;
  }
}

TEST(MpiCommunicator, AlltoallvUnevenSplits) {
  auto comm = communicator(all_ranks());
  const int n = world().size, me = world().rank;
  // Rank s sends (s + 2 d) % 4 bytes to rank d, each byte 16 s + d.
  auto amount = [](int s, int d) { return static_cast<size_t>((s + 2 * d) % 4); };
  std::vector<size_t> send(n), recv(n);
  std::vector<uint8_t> in, want;
  for (int d = 0; d < n; ++d) {
    send[d] = amount(me, d);
    in.insert(in.end(), send[d], static_cast<uint8_t>(16 * me + d));
  }
  for (int s = 0; s < n; ++s) {
    recv[s] = amount(s, me);
    want.insert(want.end(), recv[s], static_cast<uint8_t>(16 * s + me));
  }
  std::vector<uint8_t> out(want.size());
  comm->alltoallv(in.data(), send, out.data(), recv);
  EXPECT_EQ(out, want);
}

TEST(MpiCommunicator, SendrecvAroundTheRing) {
  Options small = test_options();
  small.max_message_bytes = 64;
  auto comm = communicator(all_ranks(), small);
  const int n = world().size, me = world().rank;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}}) {
    std::vector<uint8_t> out(bytes, static_cast<uint8_t>(me)), in(bytes, 0xFF);
    comm->sendrecv(out.data(), bytes, (me + 1) % n, in.data(), bytes, (me + n - 1) % n);
    EXPECT_EQ(in, std::vector<uint8_t>(bytes, static_cast<uint8_t>((me + n - 1) % n)))
        << bytes << " bytes";
  }
  EXPECT_THROW(comm->sendrecv(nullptr, 0, n, nullptr, 0, -1), Error);
  EXPECT_THROW(comm->sendrecv(nullptr, 0, me, nullptr, 0, -1), Error);
}

// Process sets: only members create their communicator; sets of disjoint ranks are created
// at the same time under different tags, and each reduces over its own members only.
TEST(MpiCommunicator, ProcessSetCommunicators) {
  const int n = world().size, me = world().rank;
  std::vector<int32_t> evens, odds;
  for (int r = 0; r < n; ++r) (r % 2 ? odds : evens).push_back(r);
  auto even_comm = communicator(evens);
  auto odd_comm = communicator(odds);
  auto ends = communicator(n > 1 ? std::vector<int32_t>{0, n - 1} : std::vector<int32_t>{0});
  Communicator& mine = me % 2 ? *odd_comm : *even_comm;
  int64_t x = me + 1;
  mine.allreduce(&x, 1, DataType::kInt64, ReduceOp::kSum);
  int64_t want = 0;
  for (int r = me % 2; r < n; r += 2) want += r + 1;
  EXPECT_EQ(x, want);
  EXPECT_EQ(mine.size(), static_cast<int>(me % 2 ? odds.size() : evens.size()));
  if (ends) {
    int32_t y = me;
    ends->allreduce(&y, 1, DataType::kInt32, ReduceOp::kMax);
    EXPECT_EQ(y, n - 1);
  } else {
    EXPECT_TRUE(me != 0 && me != n - 1);
  }
}

// A receive from a rank that never sends fails after the timeout, naming that rank; the other
// ranks meet it again on a fresh communicator.
TEST(MpiCommunicator, SilentPeerTimesOutNamingIt) {
  if (world().size < 2) GTEST_SKIP() << "needs two ranks";
  Options quick = test_options();
  quick.timeout = 300ms;
  auto comm = communicator(all_ranks(), quick);
  auto after = communicator(all_ranks());
  if (world().rank == 0) {
    uint64_t word = 0;
    try {
      comm->recv(&word, sizeof(word), 1);
      ADD_FAILURE() << "a receive nobody sends to completed";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("timed out on rank 0 of"), std::string::npos) << m;
      EXPECT_NE(m.find("receive from rank 1"), std::string::npos) << m;
      EXPECT_NE(m.find("300 ms"), std::string::npos) << m;
    }
  }
  after->barrier();
}

}  // namespace
}  // namespace krug::collectives::mpi
