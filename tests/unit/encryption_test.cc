// Encrypted connections (KRUG_ENCRYPT=1): the record cipher (net/cipher.h), frames after an
// encrypting handshake, and the TCP plane's records. The conformance suite runs every collective
// over encrypted TCP connections too (Conformance/Encrypted.*).
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/tcp/tcp_communicator.h"
#include "net/cipher.h"
#include "net/socket.h"
#include "rendezvous/store.h"

namespace krug {
namespace {

using namespace std::chrono_literals;
using net::Protection;

net::Deadline in(std::chrono::milliseconds d) {
  return net::Clock::now() + d;
}

std::vector<uint8_t> key(uint8_t fill) {
  return std::vector<uint8_t>(net::kKeySize, fill);
}

// A pair connected over loopback whose handshake ran with the given protections.
struct Pair {
  net::Connection client, server;
  std::optional<std::string> verdict;
};

Pair handshaken_pair(Protection client_side, Protection server_side) {
  net::Listener listener("127.0.0.1", 0);
  Pair p;
  p.client = net::Connection::connect("127.0.0.1", listener.port(), in(5s));
  p.server = std::move(*listener.accept(in(5s)));
  std::thread serving(
      [&] { p.verdict = p.server.authenticate_as_server("s3cret", in(5s), server_side); });
  try {
    p.client.authenticate_as_client("s3cret", in(5s), client_side);
  } catch (const net::NetError&) {
    serving.join();
    throw;
  }
  serving.join();
  return p;
}

TEST(Aead, OpensWhatItSealedAndNothingElse) {
  net::Aead seal(key(7), true), open(key(7), false);
  std::vector<uint8_t> text(1000);
  std::iota(text.begin(), text.end(), 0);
  std::vector<uint8_t> box(text.size());
  uint8_t tag[net::kTagSize];
  seal.seal({}, text.data(), text.size(), box.data(), tag);
  EXPECT_NE(box, text);
  EXPECT_TRUE(open.open({}, box.data(), box.size(), tag));
  EXPECT_EQ(box, text);
}

TEST(Aead, RefusesAnAlteredARepeatedOrAReorderedRecord) {
  net::Aead seal(key(1), true);
  std::vector<uint8_t> first(64, 'a'), second(64, 'b');
  uint8_t tag1[net::kTagSize], tag2[net::kTagSize];
  seal.seal({}, first.data(), first.size(), first.data(), tag1);
  seal.seal({}, second.data(), second.size(), second.data(), tag2);
  {
    net::Aead open(key(1), false);
    auto altered = first;
    altered[10] ^= 1;
    EXPECT_FALSE(open.open({}, altered.data(), altered.size(), tag1));
  }
  {
    net::Aead open(key(1), false);  // the second record where the first belongs
    auto copy = second;
    EXPECT_FALSE(open.open({}, copy.data(), copy.size(), tag2));
  }
  {
    net::Aead open(key(1), false);  // the first record twice
    auto copy = first;
    EXPECT_TRUE(open.open({}, copy.data(), copy.size(), tag1));
    copy = first;
    EXPECT_FALSE(open.open({}, copy.data(), copy.size(), tag1));
  }
  {
    net::Aead open(key(2), false);  // another key
    auto copy = first;
    EXPECT_FALSE(open.open({}, copy.data(), copy.size(), tag1));
  }
}

TEST(Encryption, FramesRoundTripAfterAnEncryptingHandshake) {
  auto p = handshaken_pair(Protection::kEncrypt, Protection::kEncrypt);
  ASSERT_FALSE(p.verdict.has_value()) << *p.verdict;
  ASSERT_NE(p.client.cipher(), nullptr);
  ASSERT_NE(p.server.cipher(), nullptr);
  std::vector<uint8_t> large(3 << 20);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<uint8_t>(i * 13);
  std::thread sender([&] {
    p.client.send_frame(std::vector<uint8_t>{1, 2, 3}, in(10s));
    p.client.send_frame(nullptr, 0, in(10s));
    p.client.send_frame(large, in(10s));
  });
  EXPECT_EQ(p.server.recv_frame(in(10s)), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_TRUE(p.server.recv_frame(in(10s)).empty());
  EXPECT_EQ(p.server.recv_frame(in(10s)), large);
  sender.join();
  p.server.send_frame(std::vector<uint8_t>{9}, in(5s));
  EXPECT_EQ(p.client.recv_frame(in(5s)), std::vector<uint8_t>{9});
}

TEST(Encryption, WhatCrossesTheWireIsNotThePayload) {
  auto p = handshaken_pair(Protection::kEncrypt, Protection::kEncrypt);
  const std::string secret_text = "gradients of layer 7: 0.125 0.25 0.5";
  p.client.send_frame(secret_text.data(), secret_text.size(), in(5s));
  // Read the raw bytes, as a machine on the path would see them.
  std::vector<char> wire(4 + secret_text.size() + net::kTagSize);
  size_t got = 0;
  while (got < wire.size()) {
    const ssize_t n = ::recv(p.server.fd(), wire.data() + got, wire.size() - got, 0);
    if (n > 0)
      got += static_cast<size_t>(n);
    else
      std::this_thread::sleep_for(1ms);
  }
  const std::string seen(wire.begin(), wire.end());
  EXPECT_EQ(seen.find("gradients"), std::string::npos);
  EXPECT_EQ(seen.find("0.125"), std::string::npos);
}

TEST(Encryption, AFrameAlteredOnTheWayFailsToOpen) {
  auto p = handshaken_pair(Protection::kEncrypt, Protection::kEncrypt);
  // Seal a frame with the client's key, flip one ciphertext bit, and put it on the wire raw.
  std::vector<uint8_t> sealed;
  const std::vector<uint8_t> payload(100, 5);
  net::append_sealed_frame(p.client.cipher()->send, payload.data(), payload.size(), sealed);
  sealed[4 + 50] ^= 0x80;
  ASSERT_EQ(::send(p.client.fd(), sealed.data(), sealed.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(sealed.size()));
  try {
    p.server.recv_frame(in(5s));
    FAIL() << "an altered frame was accepted";
  } catch (const net::NetError& e) {
    EXPECT_NE(std::string(e.what()).find("failed authentication"), std::string::npos) << e.what();
  }
}

TEST(Encryption, EndsThatDisagreeAreRejectedNamingTheSetting) {
  for (auto [client_side, server_side] :
       {std::pair{Protection::kAuthenticate, Protection::kEncrypt},
        std::pair{Protection::kEncrypt, Protection::kAuthenticate}}) {
    try {
      auto p = handshaken_pair(client_side, server_side);
      FAIL() << "the server accepted a client that does not match its encryption";
    } catch (const net::NetError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("KRUG_ENCRYPT"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("wrong job secret"), std::string::npos) << msg;
    }
  }
}

TEST(Encryption, EachConnectionHasKeysOfItsOwn) {
  // Two connections of one job: a record sealed on one does not open on the other.
  auto a = handshaken_pair(Protection::kEncrypt, Protection::kEncrypt);
  auto b = handshaken_pair(Protection::kEncrypt, Protection::kEncrypt);
  std::vector<uint8_t> text(32, 1);
  uint8_t tag[net::kTagSize];
  a.client.cipher()->send.seal({}, text.data(), text.size(), text.data(), tag);
  EXPECT_FALSE(b.server.cipher()->recv.open({}, text.data(), text.size(), tag));
}

// The TCP plane moves messages as records of 64 KiB: messages of many records, one byte, and
// odd sizes give the same bits encrypted as not.
std::vector<std::vector<float>> allreduce_on_members(int n, Protection protection) {
  auto store = std::make_shared<rendezvous::InMemoryStore>();
  std::vector<std::vector<float>> results(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto device = std::make_shared<collectives::tcp::Device>(
            "127.0.0.1", "s", r, collectives::tcp::kHandshakeTimeout, protection);
        collectives::TcpCommunicator comm(
            "set", r, n, std::make_shared<rendezvous::PrefixStore>("set/", store), device, {});
        std::vector<float> all;
        for (size_t count : {size_t{1}, size_t{16411}, size_t{300001}}) {
          std::vector<float> data(count);
          for (size_t i = 0; i < count; ++i)
            data[i] = 0.1f * static_cast<float>(r + 1) + 1e-3f * static_cast<float>(i % 97);
          comm.allreduce(data.data(), count, DataType::kFloat32, ReduceOp::kSum);
          all.insert(all.end(), data.begin(), data.end());
        }
        comm.barrier();
        results[static_cast<size_t>(r)] = std::move(all);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "member " << r;
  return results;
}

TEST(Encryption, TheTcpPlaneGivesTheSameBitsEncrypted) {
  for (int n : {2, 3, 5}) {
    const auto plain = allreduce_on_members(n, Protection::kAuthenticate);
    const auto sealed = allreduce_on_members(n, Protection::kEncrypt);
    for (int r = 0; r < n; ++r) {
      const auto& a = plain[static_cast<size_t>(r)];
      const auto& b = sealed[static_cast<size_t>(r)];
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << n << " members, member " << r;
    }
  }
}

}  // namespace
}  // namespace krug
