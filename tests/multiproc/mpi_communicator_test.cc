// The MPI communicator on its own: `mpirun -np N krug_mpi_communicator_tests`, every rank a
// process running the same tests in the same order, so their collectives pair up. The
// Communicator conformance suite (tests/conformance: every collective, dtype and count, bitwise
// against rank-ordered references) as MpiConformance.*, then what is MPI's own: tiny message
// and segment sizes (pieces, pipelining), process-set communicators made under tags, invalid
// peers, and the timeout error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "collectives/mpi/mpi_backend.h"
#include "conformance/communicator_conformance.h"
#include "krug/types.h"
#include "reduce/reduce.h"

namespace krug::collectives::mpi {
namespace {

using namespace std::chrono_literals;
using conformance::input;

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

std::vector<uint8_t> reference(DataType dtype, ReduceOp op, size_t count) {
  return conformance::reference(dtype, op, count, conformance::rank_order(world().size));
}

std::string where(DataType dtype, size_t count) {
  return std::string(dtype_name(dtype)) + " x " + std::to_string(count) + " on rank " +
         std::to_string(world().rank) + " of " + std::to_string(world().size);
}

class MpiConformance : public ::testing::TestWithParam<size_t> {};

TEST_P(MpiConformance, Case) {
  auto comm = communicator(all_ranks());
  conformance::cases()[GetParam()].run(*comm, conformance::rank_order(world().size));
  comm->barrier();
}

INSTANTIATE_TEST_SUITE_P(Mpi, MpiConformance,
                         ::testing::Range(size_t{0}, conformance::cases().size()),
                         [](const auto& info) { return conformance::cases()[info.param].name; });

TEST(MpiCommunicator, HasTheWorldsRanks) {
  auto comm = communicator(all_ranks());
  EXPECT_EQ(comm->rank(), world().rank);
  EXPECT_EQ(comm->size(), world().size);
  EXPECT_STREQ(comm->backend_name(), "mpi");
  comm->barrier();
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
