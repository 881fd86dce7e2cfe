// Negotiation as a pure function: request lists in, ordered fused responses out. No network.
#include "controller/negotiator.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "net/socket.h"

namespace krug::controller {
namespace {

Request allreduce(const std::string& name, int64_t n, DataType dtype = DataType::kFloat32) {
  Request q;
  q.name = name;
  q.op = OpType::kAllreduce;
  q.dtype = dtype;
  q.shape = {n};
  return q;
}

RequestList from(int rank, std::vector<Request> requests) {
  RequestList l;
  l.rank = rank;
  l.requests = std::move(requests);
  return l;
}

class NegotiatorTest : public ::testing::Test {
 protected:
  ResponseCache cache{100};
  Clock::time_point now = Clock::now();
};

// Arrival times are recorded only when asked (elastic jobs): the readiness statistics see the
// late rank then, and stay empty otherwise.
TEST_F(NegotiatorTest, ReadinessIsTrackedOnlyWhenAsked) {
  for (bool track : {false, true}) {
    Negotiator n(2, 1 << 20, cache);
    if (track) n.track_readiness();
    n.add(from(0, {allreduce("r", 4)}), now);
    n.add(from(1, {allreduce("r", 4)}), now + std::chrono::milliseconds(30));
    ASSERT_EQ(n.compute().size(), 1u);
    EXPECT_EQ(n.readiness().tensors(), track ? 1 : 0);
    EXPECT_EQ(n.readiness().lateness_us()[1], track ? 30'000 : 0);
  }
}

TEST_F(NegotiatorTest, NothingIsReadyUntilEveryRankAsked) {
  Negotiator n(3, 1 << 20, cache);
  n.add(from(0, {allreduce("a", 4)}), now);
  n.add(from(2, {allreduce("a", 4)}), now);
  EXPECT_TRUE(n.compute().empty());
  n.add(from(1, {allreduce("a", 4)}), now);
  auto out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].names, std::vector<std::string>{"a"});
  EXPECT_FALSE(n.has_pending());
}

TEST_F(NegotiatorTest, ReadyAllreducesFuseUpToTheThresholdInArrivalOrder) {
  Negotiator n(2, 3 * 400, cache);  // room for three 100-float tensors
  std::vector<Request> reqs;
  for (auto name : {"w", "b", "c", "d"}) reqs.push_back(allreduce(name, 100));
  n.add(from(1, reqs), now);
  n.add(from(0, reqs), now);
  auto out = n.compute();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].names, (std::vector<std::string>{"w", "b", "c"}));
  EXPECT_EQ(out[1].names, (std::vector<std::string>{"d"}));
}

TEST_F(NegotiatorTest, DifferentDtypesAreNotFused) {
  Negotiator n(2, 1 << 20, cache);
  std::vector<Request> reqs = {allreduce("f", 8), allreduce("d", 8, DataType::kFloat64),
                               allreduce("f2", 8)};
  n.add(from(0, reqs), now);
  n.add(from(1, reqs), now);
  auto out = n.compute();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].names, (std::vector<std::string>{"f", "f2"}));
  EXPECT_EQ(out[1].names, (std::vector<std::string>{"d"}));
}

TEST_F(NegotiatorTest, MismatchedShapesGiveOneErrorNamingTensorAndRanks) {
  Negotiator n(3, 1 << 20, cache);
  n.add(from(0, {allreduce("g", 4)}), now);
  n.add(from(1, {allreduce("g", 5)}), now);
  n.add(from(2, {allreduce("g", 4)}), now);
  auto out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type, ResponseType::kError);
  EXPECT_NE(out[0].error.find("Mismatched shapes for allreduce 'g'"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("ranks 0, 2: [4]"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("rank 1: [5]"), std::string::npos) << out[0].error;
}

TEST_F(NegotiatorTest, MismatchedBroadcastRootIsAnError) {
  Negotiator n(2, 1 << 20, cache);
  Request a = allreduce("p", 3);
  a.op = OpType::kBroadcast;
  Request b = a;
  b.root = 1;
  n.add(from(0, {a}), now);
  n.add(from(1, {b}), now);
  auto out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NE(out[0].error.find("Mismatched root ranks"), std::string::npos) << out[0].error;
}

TEST_F(NegotiatorTest, SteadyStateUsesTheCache) {
  Negotiator n(2, 1 << 20, cache);
  n.add(from(0, {allreduce("x", 4)}), now);
  n.add(from(1, {allreduce("x", 4)}), now);
  auto first = n.compute();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_FALSE(first[0].from_cache);
  ASSERT_EQ(first[0].cache_ids.size(), 1u);
  // Next step: both ranks only send the id.
  RequestList hits;
  hits.cache_hits = {first[0].cache_ids[0]};
  hits.rank = 0;
  n.add(hits, now);
  hits.rank = 1;
  n.add(hits, now);
  auto second = n.compute();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_TRUE(second[0].from_cache);
  EXPECT_EQ(second[0].cache_ids, first[0].cache_ids);
  EXPECT_EQ(second[0].op, OpType::kAllreduce);
  // Ids and parameters only: every rank's cache has the names.
  EXPECT_TRUE(second[0].names.empty());
  cache.expand(second[0]);
  EXPECT_EQ(second[0].names, std::vector<std::string>{"x"});
  EXPECT_EQ(second[0].shapes, (std::vector<std::vector<int64_t>>{{4}}));
  // Over the wire a cached response is ids only.
  ResponseList list;
  list.responses = second;
  auto decoded = decode_response_list(encode(list));
  EXPECT_TRUE(decoded.responses[0].names.empty());
  EXPECT_EQ(decoded.responses[0].cache_ids, second[0].cache_ids);
}

// Cache hits are counted per id while nothing else is pending. Whatever else arrives (a new
// name, a join) moves them into the general table first: nothing is lost, the order of first
// arrival holds, and stalls name the missing ranks either way.
TEST_F(NegotiatorTest, CountedHitsMeetTheGeneralPathWithoutLosingAnything) {
  Negotiator n(3, 1 << 20, cache);
  std::vector<Request> reqs = {allreduce("a", 2), allreduce("b", 3, DataType::kInt32),
                               allreduce("c", 4)};
  for (int rank = 0; rank < 3; ++rank) n.add(from(rank, reqs), now);
  auto first = n.compute();
  ASSERT_EQ(first.size(), 2u);         // a+c fused, b alone
  const uint32_t a = 0, b = 2, c = 1;  // ids follow the fused list: a, c, then b
  ASSERT_EQ(first[0].cache_ids, (std::vector<uint32_t>{a, c}));
  ASSERT_EQ(first[1].cache_ids, (std::vector<uint32_t>{b}));

  auto hits = [](int rank, std::vector<uint32_t> ids) {
    RequestList l;
    l.rank = rank;
    l.cache_hits = std::move(ids);
    return l;
  };
  // Counted: c and a from ranks 0 and 2; rank 1 is late.
  n.add(hits(0, {c, a}), now);
  n.add(hits(2, {c, a}), now);
  EXPECT_TRUE(n.has_pending());
  EXPECT_TRUE(n.compute().empty());
  auto stalls = n.stalls(now + std::chrono::seconds(61), 60);
  ASSERT_EQ(stalls.size(), 2u);
  EXPECT_EQ(stalls[0].name, "c");
  EXPECT_EQ(stalls[0].missing_ranks, std::vector<int32_t>{1});
  EXPECT_EQ(stalls[0].ready_ranks, (std::vector<int32_t>{0, 2}));

  // A new name arrives: the counted hits move into the general table, then rank 1 catches up
  // with hits and the new name, and everything completes in first-arrival order (c, a, new).
  n.add(from(0, {allreduce("new", 5)}), now);
  n.add(hits(1, {a, c}), now);
  n.add(from(1, {allreduce("new", 5)}), now);
  n.add(from(2, {allreduce("new", 5)}), now);
  auto second = n.compute();
  std::vector<std::string> names;
  for (auto& r : second) {
    cache.expand(r);
    names.insert(names.end(), r.names.begin(), r.names.end());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"c", "a", "new"}));
  EXPECT_FALSE(n.has_pending());

  // Counted again, then a rank joins: the counted allreduce still completes, with rank 2
  // contributing zeros.
  n.add(hits(0, {b}), now);
  n.add(hits(1, {b}), now);
  Request join;
  join.name = "__join";
  join.op = OpType::kJoin;
  n.add(from(2, {join}), now);
  auto third = n.compute();
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].cache_ids, std::vector<uint32_t>{b});
  EXPECT_EQ(third[0].dtype, DataType::kInt32);
  EXPECT_TRUE(n.has_pending());  // rank 2's join waits for ranks 0 and 1
}

// The step fast path: ranks that send the same list of hits are counted once per list, and the
// result is what counting per hit gives: however the lists split, repeat or arrive late.
TEST_F(NegotiatorTest, IdenticalHitListsCountedPerListAgreeWithThePerHitPath) {
  constexpr int kRanks = 70;  // more than one word of rank bits
  Negotiator n(kRanks, 1 << 20, cache);
  const std::vector<Request> reqs = {allreduce("a", 2), allreduce("b", 3), allreduce("c", 4)};
  for (int rank = 0; rank < kRanks; ++rank) n.add(from(rank, reqs), now);
  auto first = n.compute();
  ASSERT_EQ(first.size(), 1u);
  const std::vector<uint32_t> ids = first[0].cache_ids;  // a, b, c fused
  auto hits = [](int rank, std::vector<uint32_t> list) {
    RequestList l;
    l.rank = rank;
    l.cache_hits = std::move(list);
    return l;
  };
  // Every rank the same list: one fused response, in the list's order.
  for (int rank = 0; rank < kRanks; ++rank) n.add(hits(rank, ids), now);
  auto same = n.compute();
  ASSERT_EQ(same.size(), 1u);
  EXPECT_EQ(same[0].cache_ids, ids);
  EXPECT_FALSE(n.has_pending());

  // Rank 69 late: nothing runs, the stall names it, and its list next cycle completes the step.
  for (int rank = 0; rank < kRanks - 1; ++rank) n.add(hits(rank, ids), now);
  auto stalls = n.stalls(now + std::chrono::seconds(61), 60);
  ASSERT_EQ(stalls.size(), 3u);
  EXPECT_EQ(stalls[0].missing_ranks, std::vector<int32_t>{kRanks - 1});
  EXPECT_TRUE(n.compute().empty());
  n.add(hits(kRanks - 1, ids), now);
  auto late = n.compute();
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].cache_ids, ids);

  // Half the ranks send the hits in two lists, the others in one: still one step's worth.
  for (int rank = 0; rank < kRanks; ++rank) {
    if (rank % 2) {
      n.add(hits(rank, {ids[0]}), now);
      n.add(hits(rank, {ids[1], ids[2]}), now);
    } else {
      n.add(hits(rank, ids), now);
    }
  }
  auto split = n.compute();
  std::vector<uint32_t> got;
  for (const auto& r : split) got.insert(got.end(), r.cache_ids.begin(), r.cache_ids.end());
  EXPECT_EQ(got, ids);
  EXPECT_FALSE(n.has_pending());

  // A list sent twice leaves the fast path for the general one, which completes the step as
  // the per-hit path always did.
  n.add(hits(0, ids), now);
  n.add(hits(0, ids), now);
  for (int rank = 1; rank < kRanks; ++rank) n.add(hits(rank, ids), now);
  got.clear();
  for (auto& r : n.compute()) {
    EXPECT_EQ(r.type, ResponseType::kOp);
    cache.expand(r);
    EXPECT_EQ(r.names.size(), r.cache_ids.size());
    got.insert(got.end(), r.cache_ids.begin(), r.cache_ids.end());
  }
  EXPECT_EQ(got, ids);
  EXPECT_FALSE(n.has_pending());
}

TEST_F(NegotiatorTest, NewCacheIdsIncreaseAlongTheFusedList) {
  // Fusion pulls a later float32 tensor into the first response; ids must still follow the
  // list order, which is the order every rank inserts them.
  Negotiator n(2, 1 << 20, cache);
  std::vector<Request> reqs = {allreduce("f0", 2), allreduce("i", 2, DataType::kInt32),
                               allreduce("d", 2, DataType::kFloat64), allreduce("f1", 2)};
  n.add(from(0, reqs), now);
  n.add(from(1, reqs), now);
  auto out = n.compute();
  ASSERT_EQ(out.size(), 3u);
  std::vector<uint32_t> ids;
  for (const auto& r : out) {
    ASSERT_EQ(r.cache_ids.size(), r.names.size());
    ids.insert(ids.end(), r.cache_ids.begin(), r.cache_ids.end());
  }
  EXPECT_EQ(ids, (std::vector<uint32_t>{0, 1, 2, 3}));
  ResponseCache worker_cache(100);  // a worker replaying the list must accept it
  for (const auto& r : out)
    for (size_t i = 0; i < r.names.size(); ++i) worker_cache.insert(r.cache_ids[i], cache_form(r, i));
  EXPECT_EQ(worker_cache.size(), 4u);
}

TEST_F(NegotiatorTest, GroupIsReleasedOnlyWhenComplete) {
  Negotiator n(2, 1 << 20, cache);
  Request a = allreduce("g.0", 2), b = allreduce("g.1", 2);
  a.group = b.group = "g";
  a.group_size = b.group_size = 2;
  n.add(from(0, {a, b}), now);
  n.add(from(1, {a}), now);
  EXPECT_TRUE(n.compute().empty());  // g.0 is ready everywhere, but g.1 is not
  n.add(from(1, {b}), now);
  auto out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].names, (std::vector<std::string>{"g.0", "g.1"}));
}

TEST_F(NegotiatorTest, JoinedRanksLetAllreduceProceedAndJoinCompletesWhenAllJoined) {
  Negotiator n(3, 1 << 20, cache);
  Request join;
  join.name = "__join";
  join.op = OpType::kJoin;
  n.add(from(2, {join}), now);
  n.add(from(0, {allreduce("late", 4)}), now);
  n.add(from(1, {allreduce("late", 4)}), now);
  auto out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type, ResponseType::kOp);
  EXPECT_EQ(out[0].shapes[0], (std::vector<int64_t>{4}));  // rank 2 needs it to send zeros
  // Rank 2 waits in join for the others: the stall inspector names it and them.
  EXPECT_TRUE(n.has_pending());
  EXPECT_TRUE(n.stalls(now + std::chrono::seconds(59), 60).empty());
  auto stalls = n.stalls(now + std::chrono::seconds(61), 60);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].op, OpType::kJoin);
  EXPECT_EQ(stalls[0].ready_ranks, std::vector<int32_t>{2});
  EXPECT_EQ(stalls[0].missing_ranks, (std::vector<int32_t>{0, 1}));
  n.add(from(0, {join}), now);
  n.add(from(1, {join}), now);
  out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].op, OpType::kJoin);
  EXPECT_EQ(out[0].last_joined_rank, 1);
  EXPECT_FALSE(n.has_pending());
}

TEST_F(NegotiatorTest, AllgatherCollectsFirstDimensionsPerRank) {
  Negotiator n(3, 1 << 20, cache);
  for (int r = 0; r < 3; ++r) {
    Request q = allreduce("ag", 0);
    q.op = OpType::kAllgather;
    q.shape = {r * 2 + 1, 3};
    n.add(from(r, {q}), now);
  }
  auto out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rank_dims, (std::vector<int64_t>{1, 3, 5}));
}

TEST_F(NegotiatorTest, ProcessSetsAreNegotiatedTogetherAndIndependently) {
  Negotiator n(4, 1 << 20, cache);
  Request add;
  add.name = "__add_process_set[1,3]";
  add.op = OpType::kAddProcessSet;
  add.set_ranks = {1, 3};
  for (int r = 0; r < 4; ++r) n.add(from(r, {add}), now);
  auto out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  const int32_t id = out[0].process_set;
  EXPECT_EQ(n.members(id), (std::vector<int32_t>{1, 3}));
  Request in_set = allreduce("odd", 2);
  in_set.process_set = id;
  n.add(from(1, {in_set}), now);
  n.add(from(3, {in_set}), now);
  out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].process_set, id);
  // A rank outside the set gets an immediate error.
  n.add(from(0, {in_set}), now);
  out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type, ResponseType::kError);
}

TEST_F(NegotiatorTest, StallsNameTheMissingRanks) {
  Negotiator n(3, 1 << 20, cache);
  n.add(from(0, {allreduce("slow", 1)}), now);
  n.add(from(2, {allreduce("slow", 1)}), now);
  auto stalls = n.stalls(now + std::chrono::seconds(61), 60);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].missing_ranks, std::vector<int32_t>{1});
  EXPECT_EQ(stalls[0].ready_ranks, (std::vector<int32_t>{0, 2}));
  EXPECT_NE(describe(stalls).find("waiting 61 s for ranks [1]"), std::string::npos) << describe(stalls);
  EXPECT_TRUE(n.stalls(now + std::chrono::seconds(10), 60).empty());
}

TEST(MessageCodecTest, RequestListRoundTrips) {
  RequestList l;
  l.rank = 3;
  Request q = allreduce("weights/conv1", 7, DataType::kBFloat16);
  q.shape = {7, 0, 2};
  q.splits = {1, 2, 4};
  q.prescale = 0.5;
  q.group = "grp";
  q.group_size = 4;
  l.requests = {q, allreduce("b", 1)};
  l.cache_hits = {0, 5, 99};
  l.fatal_error = "boom";
  auto d = decode_request_list(encode(l));
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.requests, l.requests);
  EXPECT_EQ(d.cache_hits, l.cache_hits);
  EXPECT_EQ(d.fatal_error, "boom");
}

// Cache ids travel as runs of consecutive ids, in their order: a step of many cached tensors
// costs the coordinator a few bytes per rank, not four per tensor.
TEST(MessageCodecTest, CacheHitsGoAsRunsAndKeepTheirOrder) {
  RequestList l;
  l.cache_hits = {5, 6, 7, 2, 3, 100, 7};
  EXPECT_EQ(decode_request_list(encode(l)).cache_hits, l.cache_hits);
  RequestList small, large;
  for (uint32_t id = 0; id < 10; ++id) small.cache_hits.push_back(id);
  for (uint32_t id = 0; id < 1000; ++id) large.cache_hits.push_back(id);
  EXPECT_EQ(encode(large).size(), encode(small).size());
  EXPECT_EQ(decode_request_list(encode(large)).cache_hits, large.cache_hits);
}

// A run's length is not bounded by the message's size, so the decoder bounds it: four billion
// ids in 8 bytes must not become a 16 GB allocation.
TEST(MessageCodecTest, AHugeRunOfCacheIdsIsRejected) {
  RequestList l;
  l.cache_hits = {0x01020304};
  auto bytes = encode(l);
  // The list's only run: its first id (little-endian), then its length, 1.
  const std::vector<uint8_t> one_run = {4, 3, 2, 1, 1, 0, 0, 0};
  auto at = std::search(bytes.begin(), bytes.end(), one_run.begin(), one_run.end());
  ASSERT_NE(at, bytes.end());
  std::fill(at + 4, at + 8, 0xff);
  EXPECT_THROW(decode_request_list(bytes), net::NetError);
}

TEST(MessageCodecTest, ResponseListRoundTripsAndRejectsGarbage) {
  ResponseList l;
  Response r;
  r.names = {"a", "b"};
  r.shapes = {{1}, {2, 3}};
  r.rank_dims = {4, 5};
  r.error = "x";
  l.responses = {r};
  l.shutdown = true;
  l.shutdown_reason = "rank 2 called shutdown()";
  l.stalls = {{.name = "w",
               .op = OpType::kBroadcast,
               .process_set = 2,
               .ready_ranks = {0, 2},
               .missing_ranks = {1},
               .waited_seconds = 61.5}};
  auto d = decode_response_list(encode(l));
  EXPECT_EQ(d.responses[0], r);
  EXPECT_EQ(d.shutdown_reason, l.shutdown_reason);
  EXPECT_EQ(d.stalls, l.stalls);
  std::vector<uint8_t> garbage = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_THROW(decode_response_list(garbage), Error);
  auto truncated = encode(l);
  truncated.resize(truncated.size() / 2);
  EXPECT_THROW(decode_response_list(truncated), Error);
}

TEST(ResponseCacheTest, IdsAreStableAndChangedParametersGetANewId) {
  ResponseCache cache(2);
  Request a = allreduce("a", 4);
  ASSERT_EQ(cache.next_id(), 0u);
  cache.insert(0, cache_form(a));
  EXPECT_EQ(cache.find(cache_form(a)), 0u);
  Request a5 = allreduce("a", 5);
  EXPECT_FALSE(cache.find(cache_form(a5)).has_value());
  cache.insert(1, cache_form(a5));
  EXPECT_EQ(cache.find(cache_form(a5)), 1u);
  EXPECT_FALSE(cache.find(cache_form(a)).has_value());  // the name now means the new shape
  EXPECT_EQ(cache.at(0).shape, (std::vector<int64_t>{4}));  // but id 0 still means the old one
  EXPECT_FALSE(cache.next_id().has_value());             // capacity reached
  EXPECT_THROW(cache.at(7), Error);
  Request grouped = a;
  grouped.group = "g";
  EXPECT_FALSE(ResponseCache::cacheable(grouped));
}

}  // namespace
}  // namespace krug::controller

namespace krug::controller {
namespace {

// CPU and CUDA tensors of one name across ranks fail on every rank, naming both; tensors of the
// two kinds are never fused into one buffer (they are different memory).
TEST_F(NegotiatorTest, DevicesMustAgreeAndAreNeverFusedAcross) {
  Negotiator n(2, 1 << 20, cache);
  Request cuda = allreduce("g", 4);
  cuda.device = kCudaMemory;
  n.add(from(0, {cuda}), now);
  n.add(from(1, {allreduce("g", 4)}), now);
  auto out = n.compute();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type, ResponseType::kError);
  EXPECT_NE(out[0].error.find("Mismatched devices"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("CUDA"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("CPU"), std::string::npos) << out[0].error;

  Negotiator m(2, 1 << 20, cache);
  Request a = allreduce("a", 4);
  Request b = allreduce("b", 4);
  b.device = kCudaMemory;
  for (int r : {0, 1}) m.add(from(r, {a, b}), now);
  out = m.compute();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].device, kHostMemory);
  EXPECT_EQ(out[1].device, kCudaMemory);
}

}  // namespace
}  // namespace krug::controller
