// krug's TCP data plane (src/collectives/tcp) beyond the conformance suite: how many sockets a
// member of a large set holds (the point of the plane: O(log n), not a mesh; sets of up to 16
// members use the direct rank-ordered algorithms instead), and what its listener does with
// connections that cannot prove the job secret.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "collectives/tcp/tcp_communicator.h"
#include "net/socket.h"
#include "rendezvous/store.h"

namespace krug::collectives {
namespace {

using namespace std::chrono_literals;
constexpr auto kTimeout = 60s;
constexpr const char* kSecret = "tcp plane test secret";

// Runs `body` on `n` members as threads, each with its own device, as processes of a job have.
template <typename Body>
void on_members(int n, Body body) {
  auto store = std::make_shared<rendezvous::InMemoryStore>();
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto device = std::make_shared<tcp::Device>("127.0.0.1", kSecret, r);
        TcpCommunicator::Options options;
        options.timeout = kTimeout;
        TcpCommunicator comm("set", r, n, std::make_shared<rendezvous::PrefixStore>("set/", store),
                             device, options);
        body(comm);
        comm.barrier();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "member " << r;
}

// 64 members: allreduce (both paths), reducescatter, allgatherv, broadcast from 0 and barrier
// all run over the hypercube's 6 neighbours of each member; a mesh would be 63 sockets each.
TEST(TcpPlane, SixtyFourMembersHoldSixConnectionsEach) {
  constexpr int n = 64;
  on_members(n, [&](TcpCommunicator& comm) {
    const int me = comm.rank();
    for (size_t count : {size_t{256}, size_t{1} << 18}) {
      std::vector<int32_t> data(count, me + 1);
      comm.allreduce(data.data(), count, DataType::kInt32, ReduceOp::kSum);
      EXPECT_EQ(data.front(), n * (n + 1) / 2);
      EXPECT_EQ(data.back(), n * (n + 1) / 2);
    }
    std::vector<int64_t> in(n * 3, me), out(3);
    comm.reducescatter(in.data(), out.data(), std::vector<size_t>(n, 3), DataType::kInt64,
                       ReduceOp::kSum);
    EXPECT_EQ(out[2], int64_t{n} * (n - 1) / 2);
    std::vector<uint8_t> gathered(n);
    const auto mine = static_cast<uint8_t>(me);
    comm.allgatherv(&mine, gathered.data(), std::vector<size_t>(n, 1));
    std::vector<uint8_t> want(n);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(gathered, want);
    int value = me == 0 ? 42 : -1;
    comm.broadcast(&value, sizeof value, 0);
    EXPECT_EQ(value, 42);
    comm.barrier();
    EXPECT_LE(comm.connections(), 6u) << "member " << me;
  });
}

// Non-powers of two pair their first members: member 2i+1 talks to 2i only.
TEST(TcpPlane, PairedMembersOfFortyEightTalkToTheirLeaderOnly) {
  on_members(48, [&](TcpCommunicator& comm) {
    std::vector<float> data(1000, 1.0f);
    comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(data[999], 48.0f);
    if (comm.rank() < 32 && comm.rank() % 2 == 1)
      EXPECT_EQ(comm.connections(), 1u);
    else
      EXPECT_LE(comm.connections(), 6u);  // 5 unit neighbours, and a pair's leader its partner
  });
}

// A connection that cannot prove the secret never reaches a communicator, and connections that
// stall in the handshake do not keep a legitimate one from getting through.
TEST(TcpPlane, ListenerDropsStrangersAndStallersWithoutDelayingMembers) {
  tcp::Device device("127.0.0.1", kSecret, 0);
  const auto port = static_cast<uint16_t>(std::stoi(device.address().substr(10)));
  const auto deadline = [] { return net::Clock::now() + 5s; };
  // Stallers: connected, silent.
  std::vector<net::Connection> stallers;
  for (int i = 0; i < 20; ++i)
    stallers.push_back(net::Connection::connect("127.0.0.1", port, deadline()));
  // A stranger with the wrong secret is refused, and its hello is never delivered.
  tcp::Device stranger("127.0.0.1", "not the secret", 1);
  EXPECT_THROW(stranger.dial(device.address(), "set", 1, deadline()), net::NetError);
  // Garbage instead of a handshake.
  auto garbage = net::Connection::connect("127.0.0.1", port, deadline());
  const std::vector<uint8_t> junk(100, 0xff);
  garbage.send_frame(junk, deadline());
  // A member still gets through, promptly.
  tcp::Device member("127.0.0.1", kSecret, 2);
  const auto started = net::Clock::now();
  auto dialled = member.dial(device.address(), "set", 2, deadline());
  auto taken = device.take("set", 2, deadline());
  EXPECT_TRUE(taken.valid());
  EXPECT_LT(net::Clock::now() - started, 2s);
  EXPECT_THROW(device.take("set", 1, net::Clock::now() + 200ms), net::NetError);
}

// Strangers that open hundreds of silent connections fill the listener's handshake slots (the
// rest are closed at once) until their handshakes time out; a member's dial retries meanwhile,
// and the collective completes with exact results.
TEST(TcpPlane, AMemberGetsThroughAFloodOfSilentConnections) {
  auto store = std::make_shared<rendezvous::InMemoryStore>();
  auto flooded = std::make_shared<tcp::Device>("127.0.0.1", kSecret, 1, std::chrono::seconds(1));
  const auto port = static_cast<uint16_t>(std::stoi(flooded->address().substr(10)));
  std::vector<net::Connection> flood;
  for (int i = 0; i < 300; ++i)
    flood.push_back(net::Connection::connect("127.0.0.1", port, net::Clock::now() + 5s));
  std::vector<std::string> errors(2);
  std::vector<std::vector<float>> data(2, std::vector<float>(1000));
  std::vector<std::thread> members;
  for (int r = 0; r < 2; ++r)
    members.emplace_back([&, r] {
      try {
        auto device = r == 1 ? flooded : std::make_shared<tcp::Device>("127.0.0.1", kSecret, r);
        TcpCommunicator::Options options;
        options.timeout = kTimeout;
        TcpCommunicator comm("set", r, 2, std::make_shared<rendezvous::PrefixStore>("set/", store),
                             device, options);
        std::fill(data[r].begin(), data[r].end(), r + 1.0f);
        comm.allreduce(data[r].data(), data[r].size(), DataType::kFloat32, ReduceOp::kSum);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : members) t.join();
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  for (const auto& d : data) EXPECT_EQ(d, std::vector<float>(1000, 3.0f));
}

}  // namespace
}  // namespace krug::collectives
