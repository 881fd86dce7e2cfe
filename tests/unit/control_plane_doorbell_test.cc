// The control plane's doorbells over shared-memory mailboxes, with two ranks as threads: a
// request list sent with its doorbell held back rings only when the sender rings it (at once
// when forced, else after the grace), and not at all for a coordinator that took the list
// meanwhile; a list sent without holding rings at once.
#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "engine/control_plane.h"
#include "transport/shm_segment.h"

namespace krug::engine {
namespace {

using namespace std::chrono_literals;

// Whether the peer's socket becomes readable (a doorbell, here) within `wait`.
bool rings_within(const ControlPlane& plane, int peer, std::chrono::milliseconds wait) {
  pollfd p{plane.fds().at(peer), POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(wait.count())) > 0;
}

controller::RequestList hits(int rank, uint32_t id) {
  controller::RequestList list;
  list.rank = rank;
  list.cache_hits = {id};
  return list;
}

class Doorbells : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string job =
        "doorbell" + std::to_string(::getpid()) + "x" + std::to_string(std::random_device{}());
    auto segment = [&](int rank) {
      return [&, rank](size_t bytes) {
        return std::make_unique<transport::Segment>(rank, 2, bytes, job, store_, 10s);
      };
    };
    auto make = [&](int rank) {
      return std::make_unique<ControlPlane>(rank, 2, "127.0.0.1", "host", store_, "secret",
                                            net::Protection::kAuthenticate, 10s,
                                            /*mailboxes=*/true, segment(rank));
    };
    std::thread worker([&] { worker_ = make(1); });
    coordinator_ = make(0);
    worker.join();
    ASSERT_TRUE(coordinator_->uses_mailboxes());
    ASSERT_TRUE(worker_->uses_mailboxes());
  }

  // The coordinator reads what rang and the list behind it.
  void take_doorbell_and_list(uint32_t id) {
    coordinator_->read_socket(1);
    auto list = coordinator_->next_request_list(1);
    ASSERT_TRUE(list.has_value());
    EXPECT_EQ(list->cache_hits, std::vector<uint32_t>{id});
  }

  rendezvous::InMemoryStore store_;
  std::unique_ptr<ControlPlane> coordinator_, worker_;
};

TEST_F(Doorbells, AHeldDoorbellRingsWhenForcedOrAfterTheGrace) {
  ASSERT_TRUE(coordinator_->prepare_to_sleep());
  worker_->send_to_coordinator(hits(1, 7), /*hold_doorbell=*/true);
  EXPECT_FALSE(rings_within(*coordinator_, 1, 20ms)) << "held back";
  worker_->ring_doorbells(/*force=*/true);
  EXPECT_TRUE(rings_within(*coordinator_, 1, 5000ms));
  take_doorbell_and_list(7);

  ASSERT_TRUE(coordinator_->prepare_to_sleep());
  worker_->send_to_coordinator(hits(1, 8), /*hold_doorbell=*/true);
  std::this_thread::sleep_for(1ms);  // far past the grace
  worker_->ring_doorbells(/*force=*/false);
  EXPECT_TRUE(rings_within(*coordinator_, 1, 5000ms));
  take_doorbell_and_list(8);
}

TEST_F(Doorbells, NoneRingsForACoordinatorThatTookTheListMeanwhile) {
  ASSERT_TRUE(coordinator_->prepare_to_sleep());
  worker_->send_to_coordinator(hits(1, 7), /*hold_doorbell=*/true);
  auto list = coordinator_->next_request_list(1);  // a thread of rank 0 looked in time
  ASSERT_TRUE(list.has_value());
  worker_->ring_doorbells(/*force=*/true);
  EXPECT_FALSE(rings_within(*coordinator_, 1, 50ms));
}

TEST_F(Doorbells, AListNotHeldRingsAtOnceAndAnAwakeCoordinatorHearsNone) {
  ASSERT_TRUE(coordinator_->prepare_to_sleep());
  worker_->send_to_coordinator(hits(1, 7));
  EXPECT_TRUE(rings_within(*coordinator_, 1, 5000ms));
  take_doorbell_and_list(7);

  coordinator_->awake();
  worker_->send_to_coordinator(hits(1, 9));
  EXPECT_FALSE(rings_within(*coordinator_, 1, 50ms));
  auto list = coordinator_->next_request_list(1);
  ASSERT_TRUE(list.has_value());
  EXPECT_EQ(list->cache_hits, std::vector<uint32_t>{9});
}

}  // namespace
}  // namespace krug::engine
