// Elastic rounds for workers another engine starts (run/elastic/external_rounds.h): the launcher's
// add/exit events and the workers' joins in an in-memory store become rounds, removals and the
// end of the job, as krugrun's own elastic driver forms them.
#include "run/elastic/external_rounds.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <utility>

#include "krug/types.h"
#include "rendezvous/elastic_protocol.h"
#include "rendezvous/store.h"

namespace krug {
namespace {

namespace el = rendezvous::elastic;
using namespace std::chrono_literals;
using run::ExternalRounds;

struct Job {
  rendezvous::InMemoryStore store;
  ExternalRounds rounds;
  ExternalRounds::Clock::time_point now = ExternalRounds::Clock::now();
  explicit Job(run::ExternalRoundsOptions o) : rounds(store, o) {}

  void join(const std::string& id, int64_t seq) { store.set(el::join_key(id, seq), {}); }
  std::optional<el::Assignment> assignment(const std::string& id, int64_t seq) {
    if (!store.check({el::assign_key(id, seq)})) return std::nullopt;
    auto b = store.get(el::assign_key(id, seq), 0ms);
    return el::decode_assignment(std::string(b.begin(), b.end()));
  }
  el::HostsVersion hosts() {
    auto b = store.get(el::kHostsKey, 0ms);
    return el::decode_hosts_version(std::string(b.begin(), b.end()));
  }
  std::optional<std::string> tick(std::chrono::seconds later = 0s) {
    now += later;
    return rounds.tick(now);
  }
};

TEST(ExternalRounds, FailureAdditionAndFinishBecomeRoundsAndAStop) {
  Job job({.min_np = 1, .reset_limit = -1, .elastic_timeout_s = 600});
  job.rounds.add_worker("p0", "hostA");
  job.rounds.add_worker("p1", "hostA");
  job.rounds.add_worker("p2", "hostB");
  job.join("p0", 0);
  job.join("p2", 0);
  EXPECT_FALSE(job.tick());  // p1 has not asked yet: the first round waits for every worker
  job.join("p1", 0);
  auto msg = job.tick();
  ASSERT_TRUE(msg);
  EXPECT_EQ(*msg, "round 0: 3 worker(s): p0 rank 0 (new), p1 rank 1 (new), p2 rank 2 (new)");
  auto a1 = job.assignment("p1", 0);
  ASSERT_TRUE(a1);
  EXPECT_EQ(a1->size, 3);
  EXPECT_EQ(a1->local_rank, 1);
  EXPECT_EQ(a1->local_size, 2);
  EXPECT_EQ(a1->hostname, "hostA");
  EXPECT_EQ(job.assignment("p2", 0)->cross_size, 2);

  // p1 is killed: the host version moves (a removal), the survivors re-form without it and
  // keep their relative order.
  const int64_t before = job.hosts().version;
  job.rounds.worker_exited("p1", 137);
  EXPECT_GT(job.hosts().version, before);
  EXPECT_EQ(job.hosts().last_addition, 0);
  job.join("p2", 1);
  EXPECT_FALSE(job.tick());
  job.join("p0", 1);
  msg = job.tick();
  ASSERT_TRUE(msg);
  EXPECT_EQ(*msg, "round 1: 2 worker(s): p0 rank 0->0, p2 rank 2->1");
  EXPECT_FALSE(job.assignment("p0", 1)->has_new_workers);

  // A replacement arrives: an addition, and the next round syncs it from rank 0.
  job.rounds.add_worker("p1a1", "hostA");
  EXPECT_EQ(job.hosts().last_addition, job.hosts().version);
  job.join("p0", 2);
  job.join("p2", 2);
  job.join("p1a1", 0);
  msg = job.tick();
  ASSERT_TRUE(msg);
  EXPECT_EQ(*msg, "round 2: 3 worker(s): p0 rank 0->0, p2 rank 1->1, p1a1 rank 2 (new)");
  EXPECT_TRUE(job.assignment("p1a1", 0)->has_new_workers);

  // p0 finishes training: a worker asking for another round is removed, and once every worker
  // is gone the job stops with code 0.
  job.rounds.worker_exited("p0", 0);
  job.join("p2", 3);
  job.tick();
  EXPECT_FALSE(job.assignment("p2", 3));  // p1a1 has not asked yet
  job.join("p1a1", 1);
  EXPECT_FALSE(job.tick());
  for (auto [id, seq] : {std::pair{"p2", 3}, std::pair{"p1a1", 1}}) {
    auto removed = job.assignment(id, seq);
    ASSERT_TRUE(removed);
    EXPECT_TRUE(removed->removed);
  }
  job.rounds.worker_exited("p2", 0);
  EXPECT_FALSE(job.rounds.stopped());
  job.rounds.worker_exited("p1a1", 0);
  job.tick();
  ASSERT_TRUE(job.rounds.stopped());
  EXPECT_EQ(job.rounds.stopped()->code, 0);
}

TEST(ExternalRounds, TooFewWorkersForMinNpStopAfterTheTimeout) {
  Job job({.min_np = 2, .reset_limit = -1, .elastic_timeout_s = 5});
  job.rounds.add_worker("p0", "h");
  job.join("p0", 0);
  EXPECT_FALSE(job.tick());
  EXPECT_FALSE(job.tick(3s));
  EXPECT_FALSE(job.rounds.stopped());
  job.tick(3s);
  ASSERT_TRUE(job.rounds.stopped());
  EXPECT_EQ(job.rounds.stopped()->code, 1);
  EXPECT_NE(job.rounds.stopped()->message.find("fewer than the minimum of 2"), std::string::npos);
  EXPECT_FALSE(job.assignment("p0", 0));
}

TEST(ExternalRounds, ResetLimitStopsTheJob) {
  Job job({.min_np = 1, .reset_limit = 0, .elastic_timeout_s = 600});
  job.rounds.add_worker("p0", "h");
  job.rounds.add_worker("p1", "h");
  job.join("p0", 0);
  job.join("p1", 0);
  ASSERT_TRUE(job.tick());
  job.rounds.worker_exited("p1", 1);
  job.join("p0", 1);
  EXPECT_FALSE(job.tick());
  ASSERT_TRUE(job.rounds.stopped());
  EXPECT_NE(job.rounds.stopped()->message.find("reset limit"), std::string::npos);
}

TEST(ExternalRounds, AddingAWorkerTwiceIsAnError) {
  Job job({});
  job.rounds.add_worker("p0", "h");
  EXPECT_THROW(job.rounds.add_worker("p0", "h"), Error);
}

}  // namespace
}  // namespace krug
