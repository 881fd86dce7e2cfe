#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <stop_token>
#include <thread>

#include "net/socket.h"

namespace krug::net {
namespace {

using namespace std::chrono_literals;

Deadline in(std::chrono::milliseconds d) { return Clock::now() + d; }

// A connected pair over loopback: (client side, server side).
std::pair<Connection, Connection> connected_pair(const std::string& host = "127.0.0.1") {
  Listener listener(host, 0);
  auto client = Connection::connect(host, listener.port(), in(5s));
  auto server = listener.accept(in(5s));
  EXPECT_TRUE(server.has_value());
  return {std::move(client), std::move(*server)};
}

TEST(NetTest, FramesRoundTripIncludingEmptyAndLarge) {
  auto [a, b] = connected_pair();
  std::vector<uint8_t> small{1, 2, 3};
  std::vector<uint8_t> large(10 << 20);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<uint8_t>(i * 31);
  // The large frame exceeds the socket buffers: send on a thread while the other side reads.
  std::thread sender([&] {
    a.send_frame(small, in(10s));
    a.send_frame(nullptr, 0, in(10s));
    a.send_frame(large, in(10s));
  });
  EXPECT_EQ(b.recv_frame(in(10s)), small);
  EXPECT_TRUE(b.recv_frame(in(10s)).empty());
  EXPECT_EQ(b.recv_frame(in(10s)), large);
  sender.join();
}

TEST(NetTest, WorksOverIPv6Loopback) {
  try {
    Listener probe("::1", 0);
  } catch (const NetError&) {
    GTEST_SKIP() << "no IPv6 loopback here";
  }
  auto [a, b] = connected_pair("::1");
  a.send_frame(std::vector<uint8_t>{42}, in(5s));
  EXPECT_EQ(b.recv_frame(in(5s)), std::vector<uint8_t>{42});
  EXPECT_NE(b.peer().find("::1"), std::string::npos);
}

TEST(NetTest, ReceiveDeadlineExpiryThrows) {
  auto [a, b] = connected_pair();
  auto start = Clock::now();
  try {
    b.recv_frame(in(100ms));
    FAIL() << "expected a timeout";
  } catch (const NetError& e) {
    EXPECT_NE(std::string(e.what()).find("timeout after"), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, 100ms);
}

TEST(NetTest, PeerCloseIsDetected) {
  auto [a, b] = connected_pair();
  a.close();
  try {
    b.recv_frame(in(5s));
    FAIL() << "expected an error";
  } catch (const NetError& e) {
    EXPECT_NE(std::string(e.what()).find("peer closed the connection"), std::string::npos)
        << e.what();
  }
}

TEST(NetTest, SendToClosedPeerThrowsInsteadOfSigpipe) {
  auto [a, b] = connected_pair();
  b.close();
  std::vector<uint8_t> chunk(1 << 20);
  EXPECT_THROW(
      {
        for (int i = 0; i < 100; ++i) a.send_frame(chunk, in(5s));
      },
      NetError);
}

TEST(NetTest, ConnectRetriesUntilTheListenerAppears) {
  uint16_t port;
  { port = Listener("127.0.0.1", 0).port(); }  // a port that is free right now
  std::optional<Listener> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);
    late.emplace("127.0.0.1", port);
  });
  auto c = Connection::connect("127.0.0.1", port, in(120s));  // a hang guard only
  starter.join();
  EXPECT_TRUE(c.valid());
}

// A loopback port bound but not listening, held while it lives: connecting to it is refused,
// and no other process can take it meanwhile. (The port of a listener closed at once could be
// taken by a test running in parallel, and then the connect succeeded.)
class RefusingPort {
 public:
  RefusingPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      throw std::runtime_error("cannot bind a loopback port");
    port_ = ntohs(addr.sin_port);
  }
  ~RefusingPort() { ::close(fd_); }
  RefusingPort(const RefusingPort&) = delete;
  RefusingPort& operator=(const RefusingPort&) = delete;
  uint16_t port() const { return port_; }

 private:
  int fd_;
  uint16_t port_ = 0;
};

TEST(NetTest, ConnectRefusedUntilDeadlineNamesThePeer) {
  RefusingPort refusing;
  const uint16_t port = refusing.port();
  try {
    Connection::connect("127.0.0.1", port, in(200ms));
    FAIL() << "expected an error";
  } catch (const NetError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
    EXPECT_NE(msg.find("connection refused"), std::string::npos) << msg;
  }
}

TEST(NetTest, AcceptReturnsNulloptAtDeadline) {
  Listener listener("127.0.0.1", 0);
  EXPECT_NE(listener.port(), 0);
  EXPECT_FALSE(listener.accept(in(50ms)).has_value());
}

// A stop requested from another thread ends a wait whose deadline is far off; the 120 s
// deadlines are hang guards, so reaching the catch at all shows the stop was seen.
TEST(NetTest, AStopEndsAReceiveLongBeforeItsDeadline) {
  auto [a, b] = connected_pair();
  std::stop_source stop;
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);  // lets the receive start waiting (else it proves less)
    stop.request_stop();
  });
  try {
    b.recv_frame(Deadline(Clock::now() + 120s, stop.get_token()));
    FAIL() << "expected the stop";
  } catch (const Stopped& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted"), std::string::npos) << e.what();
  }
  stopper.join();
}

TEST(NetTest, AStoppedAcceptThrowsRatherThanReportingATimeout) {
  Listener listener("127.0.0.1", 0);
  std::stop_source stop;
  stop.request_stop();
  EXPECT_THROW(listener.accept(Deadline(Clock::now() + 120s, stop.get_token())), Stopped);
}

TEST(NetTest, AStopEndsTheRetriesOfARefusedConnect) {
  RefusingPort refusing;
  const uint16_t port = refusing.port();
  std::stop_source stop;
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    stop.request_stop();
  });
  EXPECT_THROW(
      Connection::connect("127.0.0.1", port, Deadline(Clock::now() + 120s, stop.get_token())),
      Stopped);
  stopper.join();
}

TEST(NetTest, HandshakeAcceptsTheRightSecret) {
  auto [a, b] = connected_pair();
  std::optional<std::string> verdict = "not run";
  std::thread server([&, &b = b] { verdict = b.authenticate_as_server("s3cret", in(5s)); });
  EXPECT_NO_THROW(a.authenticate_as_client("s3cret", in(5s)));
  server.join();
  EXPECT_FALSE(verdict.has_value()) << *verdict;
  // The connection stays usable for frames after the handshake.
  a.send_frame(std::vector<uint8_t>{7}, in(5s));
  EXPECT_EQ(b.recv_frame(in(5s)), std::vector<uint8_t>{7});
}

TEST(NetTest, HandshakeRejectsAWrongSecret) {
  auto [a, b] = connected_pair();
  std::optional<std::string> verdict;
  std::thread server([&, &b = b] { verdict = b.authenticate_as_server("right", in(5s)); });
  try {
    a.authenticate_as_client("wrong", in(5s));
    ADD_FAILURE() << "expected a rejection";
  } catch (const NetError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("rejected"), std::string::npos) << msg;
    EXPECT_NE(msg.find("wrong job secret"), std::string::npos) << msg;
  }
  server.join();
  ASSERT_TRUE(verdict.has_value());
  EXPECT_NE(verdict->find("wrong job secret"), std::string::npos);
  EXPECT_FALSE(b.valid());
}

TEST(NetTest, HandshakeClientRefusesAServerThatCannotProveTheSecret) {
  auto [a, b] = connected_pair();
  // A listener on the coordinator's address that speaks the protocol and accepts anyone, but
  // does not know the job secret.
  std::thread impostor([&, &b = b] { (void)b.authenticate_as_server("", in(5s)); });
  try {
    a.authenticate_as_client("s3cret", in(5s));
    ADD_FAILURE() << "the client trusted a server without the secret";
  } catch (const NetError& e) {
    EXPECT_NE(std::string(e.what()).find("could not prove the job secret"), std::string::npos)
        << e.what();
  }
  impostor.join();
  EXPECT_FALSE(a.valid());
}

TEST(NetTest, HandshakeRejectsAReplayedAnswer) {
  // Record a real client's answer to one server nonce...
  auto [client, recorder] = connected_pair();
  std::thread honest([&, &client = client] {
    EXPECT_THROW(client.authenticate_as_client("s3cret", in(5s)), NetError);
  });
  recorder.send_frame(std::vector<uint8_t>(32, 0x42), in(5s));
  const std::vector<uint8_t> recorded = recorder.recv_frame(in(5s));
  Writer reject;
  reject.u8(0);
  reject.str("recorded");
  recorder.send_frame(reject.data(), in(5s));
  honest.join();
  // ...and replay it to a server, which sends a fresh nonce.
  auto [attacker, server] = connected_pair();
  std::optional<std::string> verdict;
  std::thread serving(
      [&, &server = server] { verdict = server.authenticate_as_server("s3cret", in(5s)); });
  (void)attacker.recv_frame(in(5s));
  attacker.send_frame(recorded, in(5s));
  (void)attacker.recv_frame(in(5s));
  serving.join();
  ASSERT_TRUE(verdict.has_value());
  EXPECT_NE(verdict->find("wrong job secret"), std::string::npos) << *verdict;
}

// A listener whose handshake slots are full closes new connections before saying anything: a
// client that dials again gets through once a slot frees, and says what happened if none does.
TEST(NetTest, DialAuthenticatedWaitsOutABusyListener) {
  Listener listener("127.0.0.1", 0);
  const auto busy_until = Clock::now() + 300ms;
  std::thread server([&] {
    for (;;) {
      auto conn = listener.accept(in(10s));
      if (!conn) return;
      if (Clock::now() < busy_until) continue;  // closed unheard, as a full listener does
      EXPECT_FALSE(conn->authenticate_as_server("s3cret", in(5s)).has_value());
      return;
    }
  });
  auto conn = dial_authenticated("127.0.0.1", listener.port(), "s3cret", in(10s));
  EXPECT_TRUE(conn.valid());
  EXPECT_GE(Clock::now(), busy_until);
  server.join();
}

TEST(NetTest, DialAuthenticatedGivesUpAtTheDeadlineAndDoesNotRetryARejection) {
  Listener busy("127.0.0.1", 0);
  std::atomic<bool> done{false};
  std::thread closer([&] {
    while (!done) (void)busy.accept(in(50ms));  // every connection closed unheard
  });
  EXPECT_THROW(dial_authenticated("127.0.0.1", busy.port(), "s3cret", in(300ms)), ListenerBusy);
  done = true;
  closer.join();

  Listener strict("127.0.0.1", 0);
  int attempts = 0;
  std::thread server([&] {
    while (auto conn = strict.accept(in(1s))) {
      ++attempts;
      (void)conn->authenticate_as_server("right", in(5s));
    }
  });
  const auto started = Clock::now();
  try {
    (void)dial_authenticated("127.0.0.1", strict.port(), "wrong", in(30s));
    ADD_FAILURE() << "a wrong secret was accepted";
  } catch (const NetError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong job secret"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - started, 5s);  // not retried until the deadline
  server.join();
  EXPECT_EQ(attempts, 1);
}

TEST(NetTest, HandshakeServerGivesUpOnASilentClient) {
  auto [a, b] = connected_pair();
  auto verdict = b.authenticate_as_server("s", in(100ms));
  ASSERT_TRUE(verdict.has_value());
  EXPECT_NE(verdict->find("timeout"), std::string::npos) << *verdict;
}

TEST(NetTest, WriterReaderRoundTrip) {
  Writer w;
  w.u8(0xab);
  w.u32(0xdeadbeef);
  w.u64(0x0123456789abcdefULL);
  w.i64(-5);
  w.f64(3.25);
  w.str("hello");
  w.str("");
  uint8_t blob[] = {9, 8, 7};
  w.bytes(blob, 3);
  auto data = w.take();
  EXPECT_EQ(data[1], 0xef);  // little-endian on the wire
  Reader r(data);
  EXPECT_EQ(r.u8(), 0xab);
  EXPECT_EQ(r.u32(), 0xdeadbeefu);
  EXPECT_EQ(r.u64(), 0x0123456789abcdefULL);
  EXPECT_EQ(r.i64(), -5);
  EXPECT_EQ(r.f64(), 3.25);
  EXPECT_EQ(r.str(), "hello");
  EXPECT_EQ(r.str(), "");
  EXPECT_EQ(r.bytes(), (std::vector<uint8_t>{9, 8, 7}));
  EXPECT_TRUE(r.done());
}

TEST(NetTest, ReaderThrowsOnTruncatedInput) {
  Writer w;
  w.str("a longer string");
  auto data = w.take();
  for (size_t cut = 0; cut < data.size(); ++cut) {
    Reader r(data.data(), cut);
    EXPECT_THROW(r.str(), NetError) << "cut at " << cut;
  }
  Reader r(data.data(), 2);
  try {
    r.u64();
    FAIL();
  } catch (const NetError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated message"), std::string::npos);
  }
}

TEST(NetTest, HostnameIsNotEmpty) { EXPECT_FALSE(hostname().empty()); }

}  // namespace
}  // namespace krug::net
