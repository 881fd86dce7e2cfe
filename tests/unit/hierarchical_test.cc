// The hierarchical allreduce: host layouts (pure), and the communicator with ranks as threads
// over real Gloo communicators, against the flat communicator and against the association it
// promises (fold over hosts of the fold inside each host), for even, uneven, interleaved and
// degenerate layouts and element counts {0, 1, 7, 1000, 1<<20}.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <thread>

#include "collectives/gloo/gloo_communicator.h"
#include "collectives/hierarchical/hierarchical_communicator.h"
#include "rendezvous/store.h"

namespace krug::collectives {
namespace {

using namespace std::chrono_literals;

// ---- Host layouts

TEST(HostLayout, GroupsMembersByHostInOrderOfTheirLowestMember) {
  auto layout = HostLayout::from_host_names({"b", "a", "b", "c", "a"});
  ASSERT_EQ(layout.hosts, (std::vector<std::vector<int>>{{0, 2}, {1, 4}, {3}}));
  EXPECT_EQ(layout.members(), 5);
  EXPECT_EQ(layout.host_of(4), 1);
  EXPECT_EQ(layout.local_index(4), 1);
  EXPECT_EQ(layout.local_index(3), 0);
  EXPECT_EQ(layout.max_local_size(), 2);
  EXPECT_TRUE(layout.has_hierarchy());
  EXPECT_EQ(layout.describe(), "[0 2] [1 4] [3]");
  EXPECT_THROW(layout.host_of(5), Error);
}

TEST(HostLayout, HierarchyNeedsSeveralHostsAndTwoMembersOnOne) {
  EXPECT_FALSE(HostLayout::from_host_names({"a", "a", "a"}).has_hierarchy());  // one host
  EXPECT_FALSE(HostLayout::from_host_names({"a", "b", "c"}).has_hierarchy());  // one each
  EXPECT_FALSE(HostLayout::from_host_names({"a"}).has_hierarchy());
  EXPECT_TRUE(HostLayout::from_host_names({"a", "b", "b"}).has_hierarchy());
  EXPECT_TRUE(HostLayout::from_host_names({"a", "b", "a", "b"}).has_hierarchy());
}

// memcmp of two possibly empty buffers (an empty vector's data() may be null).
bool same_bits(const void* a, const void* b, size_t bytes) {
  return bytes == 0 || std::memcmp(a, b, bytes) == 0;
}

// ---- Inputs: reproducible on every thread without communication.

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t draw(int rank, size_t i, uint64_t salt) {
  return mix(mix(salt * 1000003 + static_cast<uint64_t>(rank)) + i);
}

// A float of varied magnitude and sign: sums of these round differently when re-associated.
template <typename T>
T random_float(int rank, size_t i, uint64_t salt) {
  const uint64_t bits = draw(rank, i, salt);
  const double unit = static_cast<double>(bits >> 11) / 9007199254740992.0;  // [0, 1)
  const int exponent = static_cast<int>(bits % 16) - 8;
  return static_cast<T>((unit - 0.5) * std::ldexp(1.0, exponent));
}

template <typename T>
T apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    default: throw Error("test: op");
  }
}

// The association the hierarchical communicator promises: hosts in layout order, each host's
// members in set order, both left folds.
template <typename T>
T hierarchical_reference(const HostLayout& layout, ReduceOp op,
                         const std::function<T(int)>& value_of_member) {
  T total{};
  for (size_t h = 0; h < layout.hosts.size(); ++h) {
    T host = value_of_member(layout.hosts[h][0]);
    for (size_t k = 1; k < layout.hosts[h].size(); ++k)
      host = apply(op, host, value_of_member(layout.hosts[h][k]));
    total = h == 0 ? host : apply(op, total, host);
  }
  return total;
}

// ---- Ranks as threads: a flat and a hierarchical communicator each.

struct Comms {
  GlooCommunicator& flat;
  HierarchicalCommunicator& hier;
  int rank;
};

// Which allreduce path the hierarchical communicator takes for every buffer.
enum class Path { kTwoD, kAllgather };

void run_layout(const std::vector<std::string>& hosts, Path path,
                const std::function<void(Comms&)>& body) {
  const int size = static_cast<int>(hosts.size());
  const auto layout = HostLayout::from_host_names(hosts);
  auto store = std::make_shared<rendezvous::InMemoryStore>();
  std::vector<std::string> failures(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto device = make_gloo_device("127.0.0.1", "");
        auto gloo = [&](const std::string& scope, int rank, int n) {
          return std::make_unique<GlooCommunicator>(
              rank, n, std::make_shared<rendezvous::PrefixStore>(scope + "/", store), device, 30s);
        };
        GlooCommunicator flat(r, size, std::make_shared<rendezvous::PrefixStore>("ref/", store),
                              device, 30s);
        HierarchicalCommunicator hier(
            layout, r, gloo("flat", r, size),
            [&](const std::string& scope, int rank, int n) { return gloo("hier/" + scope, rank, n); },
            path == Path::kTwoD ? 0 : std::numeric_limits<size_t>::max());
        Comms comms{flat, hier, r};
        body(comms);
        // Nobody tears down its end of a mesh while a peer still works on it.
        flat.barrier();
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

struct LayoutCase {
  std::string name;
  std::vector<std::string> hosts;
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.name; }

// Both paths must give the same bits: each is checked against the same promised association.
class HierarchicalAllreduce
    : public ::testing::TestWithParam<std::tuple<LayoutCase, int64_t, Path>> {};

// Integers, and floats whose every partial result is exact: bitwise the flat communicator's
// result, for every element-wise op.
TEST_P(HierarchicalAllreduce, ExactValuesMatchTheFlatRingBitForBit) {
  const auto& [layout_case, count_param, path] = GetParam();
  const size_t count = static_cast<size_t>(count_param);
  run_layout(layout_case.hosts, path, [&](Comms& c) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
      SCOPED_TRACE(static_cast<int>(op));
      auto value = [&](int rank, size_t i) -> int32_t {
        const uint64_t d = draw(rank, i, static_cast<uint64_t>(op));
        if (op == ReduceOp::kProduct) return d % 3 == 0 ? -1 : static_cast<int32_t>(d % 3);
        return static_cast<int32_t>(d % 2001) - 1000;
      };
      std::vector<int32_t> ints(count), ints_flat(count);
      std::vector<float> floats(count), floats_flat(count);
      for (size_t i = 0; i < count; ++i) {
        ints[i] = ints_flat[i] = value(c.rank, i);
        floats[i] = floats_flat[i] = static_cast<float>(value(c.rank, i));
      }
      c.hier.allreduce(ints.data(), count, DataType::kInt32, op);
      c.flat.allreduce(ints_flat.data(), count, DataType::kInt32, op);
      c.hier.allreduce(floats.data(), count, DataType::kFloat32, op);
      c.flat.allreduce(floats_flat.data(), count, DataType::kFloat32, op);
      ASSERT_EQ(ints, ints_flat);
      ASSERT_TRUE(same_bits(floats.data(), floats_flat.data(), count * sizeof(float)));
      // And both are the true result (the flat ring is checked elsewhere; this guards the test).
      for (size_t i = 0; i < count; i += 1 + count / 64) {
        int64_t want = value(0, i);
        for (int r = 1; r < c.flat.size(); ++r)
          want = apply<int64_t>(op, want, value(r, i));
        ASSERT_EQ(ints[i], want) << "element " << i;
      }
    }
  });
}

uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ull;
  return h;
}

// General floats: exactly the promised association, and within the rounding bound of the flat
// ring's rank-ordered sum. Each rank checks every n-th element against the reference; a hash
// of the whole result, compared across ranks, covers the rest.
template <typename T>
void check_random_floats(Comms& c, const HostLayout& layout, size_t count, DataType dtype) {
  const uint64_t salt = 77 + sizeof(T);
  std::vector<T> hier(count), flat(count);
  for (size_t i = 0; i < count; ++i) hier[i] = flat[i] = random_float<T>(c.rank, i, salt);
  c.hier.allreduce(hier.data(), count, dtype, ReduceOp::kSum);
  c.flat.allreduce(flat.data(), count, dtype, ReduceOp::kSum);
  const int n = c.flat.size();
  const double eps = std::numeric_limits<T>::epsilon();
  std::vector<T> inputs(n);
  for (size_t i = static_cast<size_t>(c.rank); i < count; i += n) {
    for (int r = 0; r < n; ++r) inputs[r] = random_float<T>(r, i, salt);
    const T want = hierarchical_reference<T>(layout, ReduceOp::kSum, [&](int r) { return inputs[r]; });
    ASSERT_EQ(0, std::memcmp(&hier[i], &want, sizeof(T)))
        << "element " << i << ": got " << hier[i] << ", promised association gives " << want;
    double magnitude = 0;
    for (T x : inputs) magnitude += std::fabs(static_cast<double>(x));
    ASSERT_LE(std::fabs(static_cast<double>(hier[i]) - static_cast<double>(flat[i])),
              2.0 * (n - 1) * eps * magnitude)
        << "element " << i;
  }
  if (!layout.has_hierarchy()) {
    // One host, or one member per host: the association is the flat one.
    ASSERT_TRUE(same_bits(hier.data(), flat.data(), count * sizeof(T)));
  }
  const uint64_t mine = fnv1a(hier.data(), count * sizeof(T));
  std::vector<uint64_t> all(n);
  c.flat.allgatherv(&mine, all.data(), std::vector<size_t>(n, sizeof(uint64_t)));
  for (int r = 0; r < n; ++r) ASSERT_EQ(all[r], mine) << "rank " << r << " got other bits";
}

TEST_P(HierarchicalAllreduce, RandomFloatsFollowTheHostAssociation) {
  const auto& [layout_case, count_param, path] = GetParam();
  const size_t count = static_cast<size_t>(count_param);
  const auto layout = HostLayout::from_host_names(layout_case.hosts);
  run_layout(layout_case.hosts, path, [&](Comms& c) {
    check_random_floats<float>(c, layout, count, DataType::kFloat32);
    check_random_floats<double>(c, layout, count, DataType::kFloat64);
  });
}

// A tensor reduced alone and inside a bigger buffer at an odd offset gives the same bits.
TEST_P(HierarchicalAllreduce, FusionLayoutDoesNotChangeBits) {
  const auto& [layout_case, count_param, path] = GetParam();
  const size_t count = static_cast<size_t>(count_param);
  run_layout(layout_case.hosts, path, [&](Comms& c) {
    constexpr size_t kPad = 1237;
    std::vector<float> alone(count), fused(kPad + count + 3);
    for (size_t i = 0; i < fused.size(); ++i) fused[i] = random_float<float>(c.rank, i, 5);
    for (size_t i = 0; i < count; ++i) alone[i] = fused[kPad + i];
    c.hier.allreduce(alone.data(), count, DataType::kFloat32, ReduceOp::kSum);
    c.hier.allreduce(fused.data(), fused.size(), DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(same_bits(alone.data(), fused.data() + kPad, count * sizeof(float)));
  });
}

const LayoutCase kLayouts[] = {
    {"hosts2x2", {"A", "A", "B", "B"}},
    {"hosts3_sizes1_2_3", {"A", "B", "B", "C", "C", "C"}},
    {"hosts2_sizes3_1", {"A", "A", "A", "B"}},
    {"interleaved2x2", {"A", "B", "A", "B"}},
    {"hosts1x4", {"A", "A", "A", "A"}},
    {"hosts4x1", {"A", "B", "C", "D"}},
};

INSTANTIATE_TEST_SUITE_P(LayoutsAndCounts, HierarchicalAllreduce,
                         ::testing::Combine(::testing::ValuesIn(kLayouts),
                                            ::testing::Values(0, 1, 7, 1000, 1 << 20),
                                            ::testing::Values(Path::kTwoD, Path::kAllgather)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_count" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) == Path::kTwoD ? "_2d" : "_allgather");
                         });

// Everything but allreduce goes to the flat communicator: the conformance suite
// (communicator_conformance_test.cc) runs every collective over it.

TEST(HierarchicalCommunicator, RejectsAFlatCommunicatorOfAnotherShape) {
  auto layout = HostLayout::from_host_names({"A", "A", "B", "B"});
  auto store = std::make_shared<rendezvous::InMemoryStore>();
  auto one = std::make_unique<GlooCommunicator>(0, 1, store, make_gloo_device("127.0.0.1", ""), 5s);
  try {
    HierarchicalCommunicator hier(layout, 0, std::move(one),
                                  [](const std::string&, int, int) -> std::unique_ptr<Communicator> {
                                    throw Error("test: no sub-communicator expected");
                                  });
    ADD_FAILURE() << "accepted a flat communicator of one rank for four members";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[0 1] [2 3]"), std::string::npos) << e.what();
  }
}

// A communicator that does nothing but fail where told: for the error path, without a network.
class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(int rank, int size, bool fail) : rank_(rank), size_(size), fail_(fail) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce(void*, size_t, DataType, ReduceOp) override { maybe_fail("allreduce"); }
  void reducescatter(const void*, void*, const std::vector<size_t>&, DataType, ReduceOp) override {
    maybe_fail("reducescatter");
  }
  void allgatherv(const void*, void*, const std::vector<size_t>&) override {
    maybe_fail("allgather");
  }
  void broadcast(void*, size_t, int) override {}
  void alltoallv(const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&) override {}
  void barrier() override {}
  void sendrecv(const void*, size_t, int, void*, size_t, int) override {}
  const char* backend_name() const override { return "fake"; }

 private:
  void maybe_fail(const char* what) {
    if (fail_) throw Error(std::string("fake ") + what + " failed: peer gone");
  }
  int rank_, size_;
  bool fail_;
};

TEST(HierarchicalCommunicator, AFailureNamesTheStepTheGroupAndTheMember) {
  auto layout = HostLayout::from_host_names({"A", "A", "B", "B"});
  for (size_t bound : {size_t{0}, std::numeric_limits<size_t>::max()}) {
    std::vector<std::string> scopes;
    HierarchicalCommunicator hier(
        layout, 3, std::make_unique<FakeCommunicator>(3, 4, false),
        [&](const std::string& scope, int rank, int size) -> std::unique_ptr<Communicator> {
          scopes.push_back(scope);
          return std::make_unique<FakeCommunicator>(rank, size, scope.rfind("cross/", 0) == 0);
        },
        bound);
    // Member 3 is the second on host B: its host's group, then the group of slice 1.
    EXPECT_EQ(scopes, (std::vector<std::string>{"local/1", "cross/1"}));
    std::vector<float> x(1000);
    try {
      hier.allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
      ADD_FAILURE() << "the failing cross-host group went unnoticed";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("members by host: [0 1] [2 3]"), std::string::npos) << m;
      EXPECT_NE(m.find(bound == 0 ? "allreduce across hosts (group of slice 1)"
                                  : "allgather across hosts (group of slice 1)"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("member 3"), std::string::npos) << m;
      EXPECT_NE(m.find("peer gone"), std::string::npos) << m;
    }
  }
}

// On a host with fewer members, each member serves several slices' groups, in slice order.
TEST(HierarchicalCommunicator, AMemberOfASmallHostJoinsEverySliceItOwns) {
  auto layout = HostLayout::from_host_names({"A", "A", "A", "B", "C", "C"});
  auto scopes_of = [&](int index) {
    std::vector<std::string> scopes;
    HierarchicalCommunicator hier(
        layout, index, std::make_unique<FakeCommunicator>(index, 6, false),
        [&](const std::string& scope, int rank, int size) -> std::unique_ptr<Communicator> {
          scopes.push_back(scope + " " + std::to_string(rank) + "/" + std::to_string(size));
          return std::make_unique<FakeCommunicator>(rank, size, false);
        });
    return scopes;
  };
  EXPECT_EQ(scopes_of(1), (std::vector<std::string>{"local/0 1/3", "cross/1 0/3"}));
  EXPECT_EQ(scopes_of(3), (std::vector<std::string>{"cross/0 1/3", "cross/1 1/3", "cross/2 1/3"}));
  EXPECT_EQ(scopes_of(5), (std::vector<std::string>{"local/2 1/2", "cross/1 2/3"}));
  EXPECT_EQ(scopes_of(4), (std::vector<std::string>{"local/2 0/2", "cross/0 2/3", "cross/2 2/3"}));
}

// derive(): the same groups, each made from this communicator's group of the same members.
TEST(HierarchicalCommunicator, DeriveMakesEachGroupFromTheMatchingGroupOfThisOne) {
  auto layout = HostLayout::from_host_names({"A", "A", "A", "B", "C", "C"});
  for (int index = 0; index < 6; ++index) {
    std::map<const Communicator*, std::string> scope_of;
    std::vector<std::string> scopes;
    HierarchicalCommunicator cpu(
        layout, index, std::make_unique<FakeCommunicator>(index, 6, false),
        [&](const std::string& scope, int rank, int size) -> std::unique_ptr<Communicator> {
          auto group = std::make_unique<FakeCommunicator>(rank, size, false);
          scope_of[group.get()] = scope;
          scopes.push_back(scope);
          return group;
        });
    std::vector<std::string> derived_from;
    auto derived = cpu.derive(
        std::make_unique<FakeCommunicator>(index, 6, false),
        [&](Communicator& group, bool inside_host) -> std::unique_ptr<Communicator> {
          const std::string& scope = scope_of.at(&group);
          EXPECT_EQ(inside_host, scope.rfind("local/", 0) == 0) << scope;
          derived_from.push_back(scope);
          return std::make_unique<FakeCommunicator>(group.rank(), group.size(), false);
        },
        0);
    EXPECT_EQ(derived_from, scopes) << "member " << index;
    EXPECT_EQ(derived->layout().describe(), "[0 1 2] [3] [4 5]");
    EXPECT_EQ(derived->rank(), index);
  }
}

// Forwards every call to another communicator, counting its reductions (reduce-scatter and
// allreduce: the two-dimensional path's; the latency-bound path only gathers).
class Forwarding : public Communicator {
 public:
  Forwarding(Communicator& to, int* calls) : to_(to), calls_(calls) {}
  int rank() const override { return to_.rank(); }
  int size() const override { return to_.size(); }
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    count_call();
    to_.allreduce(data, count, dtype, op);
  }
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override {
    count_call();
    to_.reducescatter(in, out, counts, dtype, op);
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    to_.allgatherv(in, out, bytes);
  }
  void broadcast(void* data, size_t bytes, int root) override { to_.broadcast(data, bytes, root); }
  void alltoallv(const void* in, const std::vector<size_t>& send, void* out,
                 const std::vector<size_t>& recv) override {
    to_.alltoallv(in, send, out, recv);
  }
  void barrier() override { to_.barrier(); }
  void sendrecv(const void* s, size_t sb, int to, void* r, size_t rb, int from) override {
    to_.sendrecv(s, sb, to, r, rb, from);
  }
  const char* backend_name() const override { return "forwarding"; }

 private:
  void count_call() {
    if (calls_) ++*calls_;
  }
  Communicator& to_;
  int* calls_;
};

// A derived communicator with no latency-bound path moves every buffer, however small, through
// its groups' collectives alone (as device memory needs), with the CPU communicator's results.
TEST(HierarchicalCommunicator, ADerivedCommunicatorAllreducesThroughItsGroupsOnly) {
  const std::vector<std::string> hosts{"A", "A", "B", "B", "B"};
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
    run_layout(hosts, Path::kAllgather, [&](Comms& c) {
      int group_calls = 0;
      auto derived = c.hier.derive(
          std::make_unique<Forwarding>(c.flat, nullptr),
          [&](Communicator& group, bool) -> std::unique_ptr<Communicator> {
            return std::make_unique<Forwarding>(group, &group_calls);
          },
          0);
      std::vector<int32_t> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = (c.rank + 1) * int32_t(i % 11);
      derived->allreduce(x.data(), count, DataType::kInt32, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(x[i], (1 + 2 + 3 + 4 + 5) * int32_t(i % 11)) << "element " << i;
      // A reduce-scatter inside the host (every host here has two members or more), an
      // allreduce across hosts; the CPU communicator would have gathered these small buffers.
      EXPECT_GE(group_calls, 2) << "rank " << c.rank << ", " << count << " elements";
    });
  }
}

}  // namespace
}  // namespace krug::collectives
