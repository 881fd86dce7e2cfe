#include <gtest/gtest.h>

#include <mutex>
#include <stop_token>
#include <thread>

#include "net/socket.h"
#include "rendezvous/server.h"
#include "rendezvous/store.h"

namespace krug::rendezvous {
namespace {

using namespace std::chrono_literals;

Bytes b(const std::string& s) { return Bytes(s.begin(), s.end()); }

// Every store test runs against the in-process store and against a real server + client, so
// both implementations keep the same contract.
// Every store test runs on the in-memory store, the server, and the server with every
// connection encrypted (KRUG_ENCRYPT=1).
enum class StoreKind { kInMemory, kServer, kEncryptedServer };

class StoreTest : public ::testing::TestWithParam<StoreKind> {
 protected:
  void SetUp() override {
    if (GetParam() == StoreKind::kInMemory) return;
    server_ = std::make_unique<RendezvousServer>("127.0.0.1", 0, "secret", nullptr, protection());
  }
  net::Protection protection() const {
    return net::protection_for(GetParam() == StoreKind::kEncryptedServer);
  }
  std::shared_ptr<Store> make_store() {
    if (GetParam() == StoreKind::kInMemory) {
      if (!memory_) memory_ = std::make_shared<InMemoryStore>();
      return memory_;
    }
    return std::make_shared<RendezvousClient>("127.0.0.1", server_->port(), "secret", 5s,
                                              std::stop_token{}, protection());
  }

  std::unique_ptr<RendezvousServer> server_;
  std::shared_ptr<InMemoryStore> memory_;
};

TEST_P(StoreTest, SetThenGet) {
  auto s = make_store();
  s->set("k", b("v"));
  EXPECT_EQ(s->get("k", 1s), b("v"));
  s->set("k", b(""));
  EXPECT_EQ(s->get("k", 1s), b(""));
  EXPECT_TRUE(s->check({"k"}));
  EXPECT_FALSE(s->check({"k", "other"}));
  s->erase("k");
  EXPECT_FALSE(s->check({"k"}));
}

TEST_P(StoreTest, GetBlocksUntilAnotherThreadSets) {
  auto reader = make_store();
  auto writer = make_store();
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    writer->set("late", b("here"));
  });
  EXPECT_EQ(reader->get("late", 10s), b("here"));
  t.join();
}

TEST_P(StoreTest, MaxTimeoutMeansForever) {
  auto reader = make_store();
  auto writer = make_store();
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    writer->set("k", b("v"));
  });
  EXPECT_EQ(reader->get("k", std::chrono::milliseconds::max()), b("v"));
  reader->wait({"k"}, std::chrono::milliseconds::max());
  t.join();
}

TEST_P(StoreTest, GetTimeoutNamesTheKey) {
  auto s = make_store();
  try {
    s->get("missing-key", 50ms);
    FAIL() << "expected StoreTimeout";
  } catch (const StoreTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("missing-key"), std::string::npos) << e.what();
  }
  // The store (and for the client, its connection) stays usable after a timeout.
  s->set("x", b("1"));
  EXPECT_EQ(s->get("x", 1s), b("1"));
}

TEST_P(StoreTest, WaitTimeoutNamesOnlyTheMissingKeys) {
  auto s = make_store();
  s->set("present", b("1"));
  try {
    s->wait({"present", "absent-a", "absent-b"}, 50ms);
    FAIL() << "expected StoreTimeout";
  } catch (const StoreTimeout& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("absent-a"), std::string::npos) << msg;
    EXPECT_NE(msg.find("absent-b"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("'present'"), std::string::npos) << msg;
  }
}

TEST_P(StoreTest, WaitForSeveralKeys) {
  auto waiter = make_store();
  auto writer = make_store();
  std::thread t([&] {
    for (const char* k : {"a", "b", "c"}) {
      std::this_thread::sleep_for(20ms);
      writer->set(k, b(k));
    }
  });
  waiter->wait({"a", "b", "c"}, 10s);
  EXPECT_TRUE(waiter->check({"a", "b", "c"}));
  t.join();
}

TEST_P(StoreTest, AddIsAtomicAcrossThreads) {
  constexpr int kThreads = 4, kAdds = 1000;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([store = make_store()] {
      for (int j = 0; j < kAdds; ++j) store->add("counter", 1);
    });
  for (auto& t : threads) t.join();
  auto s = make_store();
  EXPECT_EQ(s->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(s->get("counter", 1s), b(std::to_string(kThreads * kAdds)));
  EXPECT_EQ(s->add("counter", -kThreads * kAdds), 0);
}

TEST_P(StoreTest, AddOnANonCounterFails) {
  auto s = make_store();
  s->set("text", b("abc"));
  EXPECT_THROW(s->add("text", 1), Error);
  EXPECT_EQ(s->add("fresh", 5), 5);
}

TEST_P(StoreTest, PrefixStoresAreIsolated) {
  auto inner = make_store();
  PrefixStore one("one", inner), two("two", inner);
  one.set("k", b("1"));
  two.set("k", b("2"));
  EXPECT_EQ(one.get("k", 1s), b("1"));
  EXPECT_EQ(two.get("k", 1s), b("2"));
  EXPECT_EQ(inner->get("one/k", 1s), b("1"));
  EXPECT_FALSE(one.check({"only-in-two"}));
  two.set("only-in-two", b(""));
  EXPECT_FALSE(one.check({"only-in-two"}));
  EXPECT_THROW(one.get("only-in-two", 20ms), StoreTimeout);
  EXPECT_EQ(one.add("n", 3), 3);
  EXPECT_EQ(two.add("n", 1), 1);
  one.erase("k");
  EXPECT_TRUE(two.check({"k"}));
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest,
                         ::testing::Values(StoreKind::kInMemory, StoreKind::kServer,
                                           StoreKind::kEncryptedServer),
                         [](const auto& info) {
                           switch (info.param) {
                             case StoreKind::kInMemory:
                               return "InMemory";
                             case StoreKind::kServer:
                               return "Server";
                             case StoreKind::kEncryptedServer:
                               return "EncryptedServer";
                           }
                           return "?";
                         });

TEST(RendezvousServerTest, AClientThatDoesNotEncryptIsRefusedByAnEncryptingServer) {
  RendezvousServer server(
      "127.0.0.1", 0, "s", [](const std::string&) {}, net::Protection::kEncrypt);
  try {
    RendezvousClient client("127.0.0.1", server.port(), "s", 5s);
    FAIL() << "expected the server to refuse the client";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KRUG_ENCRYPT"), std::string::npos) << e.what();
  }
}

TEST(RendezvousServerTest, WrongSecretIsRefusedAndLogged) {
  std::mutex mu;
  std::vector<std::string> lines;
  RendezvousServer server("127.0.0.1", 0, "right", [&](const std::string& line) {
    std::lock_guard lock(mu);
    lines.push_back(line);
  });
  try {
    RendezvousClient client("127.0.0.1", server.port(), "wrong", 5s);
    FAIL() << "expected the server to refuse the client";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("rejected"), std::string::npos) << msg;
    EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos) << msg;
  }
  // The server records the rejection on its own thread just after replying.
  for (int i = 0; i < 500 && server.rejected_clients() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server.rejected_clients(), 1);
  std::lock_guard lock(mu);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("wrong job secret"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("127.0.0.1"), std::string::npos) << lines[0];
}

TEST(RendezvousServerTest, ClientNamesTheServerWhenItIsGone) {
  auto server = std::make_unique<RendezvousServer>("127.0.0.1", 0, "s");
  uint16_t port = server->port();
  RendezvousClient client("127.0.0.1", port, "s", 5s);
  client.set("k", b("v"));
  server.reset();
  try {
    client.get("k", 1s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

// init() stops through its client: a get parked on the server for a key nobody sets ends once
// the stop is requested (the 120 s wait is a hang guard).
TEST(RendezvousServerTest, AStopEndsAParkedGet) {
  RendezvousServer server("127.0.0.1", 0, "s");
  std::stop_source stop;
  RendezvousClient client("127.0.0.1", server.port(), "s", 60s, stop.get_token());
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);  // lets the get park first
    stop.request_stop();
  });
  try {
    client.get("never-set", 120s);
    FAIL() << "expected the stop";
  } catch (const StoreTimeout& e) {
    FAIL() << "a stop is not a timeout: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted"), std::string::npos) << e.what();
  }
  stopper.join();
}

// init() hands its stop to the client and releases it when it returns: a stop requested later
// (the signal came as init() finished) must not break the job's store.
TEST(RendezvousServerTest, AReleasedStopLeavesRequestsAlone) {
  RendezvousServer server("127.0.0.1", 0, "s");
  std::stop_source stop;
  RendezvousClient client("127.0.0.1", server.port(), "s", 60s, stop.get_token());
  client.release_stop();
  stop.request_stop();
  client.set("k", b("v"));
  EXPECT_EQ(client.get("k", 60s), b("v"));
}

// The parked get can only end with a value once `other` has set and read a key of its own and
// then released it: were other clients blocked behind a parked get, that would wait out the
// get's deadline and the get would end in a timeout instead. No clock decides the outcome.
TEST(RendezvousServerTest, ParkedGetDoesNotBlockOtherClients) {
  RendezvousServer server("127.0.0.1", 0, "s");
  RendezvousClient waiting("127.0.0.1", server.port(), "s", 60s);
  RendezvousClient other("127.0.0.1", server.port(), "s", 60s);
  std::thread t([&] { EXPECT_EQ(waiting.get("release", 60s), b("go")); });
  std::this_thread::sleep_for(50ms);  // lets the get park first (else the test proves less)
  other.set("k", b("v"));
  EXPECT_EQ(other.get("k", 60s), b("v"));
  other.set("release", b("go"));
  t.join();
}

TEST(RendezvousServerTest, SilentPeerDoesNotBlockOthersOrShutdown) {
  auto server = std::make_unique<RendezvousServer>("127.0.0.1", 0, "s");
  // Connects but never answers the handshake.
  auto silent = net::Connection::connect("127.0.0.1", server->port(),
                                         net::Clock::now() + 5s);
  auto start = std::chrono::steady_clock::now();
  RendezvousClient client("127.0.0.1", server->port(), "s", 5s);
  client.set("k", b("v"));
  EXPECT_EQ(client.get("k", 1s), b("v"));
  server.reset();  // must not wait for the silent peer's handshake deadline
  // Waiting for it would take the server's 5 s handshake timeout from the connect on: 4 s
  // leaves the client's few round trips seconds of room on a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
}

TEST(RendezvousServerTest, JobSecretsAreRandomHex) {
  auto a = make_job_secret(), c = make_job_secret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

}  // namespace
}  // namespace krug::rendezvous
