// RendezvousClient: one authenticated connection, one request in flight at a time.
#include <fmt/format.h>
#include <openssl/rand.h>

#include <mutex>

#include "net/socket.h"
#include "rendezvous/protocol.h"
#include "rendezvous/server.h"

namespace krug::rendezvous {
namespace {

using protocol::Op;
using protocol::Status;

// Non-blocking requests get this long; a healthy server answers in microseconds, so hitting it
// means the server is wedged. Blocking get/wait add their own timeout on top.
constexpr std::chrono::seconds kRequestSlack(30);

void put_keys(net::Writer& w, const std::vector<std::string>& keys) {
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
}

}  // namespace

struct RendezvousClient::Impl {
  std::string address;
  std::mutex mu;
  std::stop_token stop;  // guarded by mu
  net::Connection conn;
  bool broken = false;  // a failed exchange leaves the stream mid-frame: never reuse it

  // Sends one request and returns the reply after its status byte; throws on failure.
  Bytes call(net::Writer& request, std::chrono::milliseconds server_wait) {
    std::lock_guard lock(mu);
    if (broken)
      throw Error(fmt::format("rendezvous server {}: connection lost after an earlier error",
                              address));
    Bytes reply;
    try {
      net::Deadline deadline(net::Clock::now() + clamp_wait(server_wait) + kRequestSlack, stop);
      conn.send_frame(request.data(), deadline);
      reply = conn.recv_frame(deadline);
    } catch (const net::NetError& e) {
      broken = true;
      conn.close();
      throw Error(fmt::format("rendezvous server {}: {}", address, e.what()));
    }
    net::Reader r(reply);
    auto status = static_cast<Status>(r.u8());
    if (status == Status::kOk) return Bytes(reply.begin() + 1, reply.end());
    std::string message = fmt::format("rendezvous server {}: {}", address, r.str());
    if (status == Status::kTimeout) throw StoreTimeout(message);
    throw Error(message);
  }
};

RendezvousClient::RendezvousClient(const std::string& host, uint16_t port,
                                   const std::string& secret,
                                   std::chrono::milliseconds connect_timeout, std::stop_token stop,
                                   net::Protection protection)
    : impl_(std::make_unique<Impl>()) {
  impl_->address = fmt::format("{}:{}", host, port);
  impl_->stop = std::move(stop);
  net::Deadline deadline(net::Clock::now() + connect_timeout, impl_->stop);
  try {
    impl_->conn = net::dial_authenticated(host, port, secret, deadline, protection);
  } catch (const net::NetError& e) {
    throw Error(fmt::format("cannot join rendezvous server {}: {}", impl_->address, e.what()));
  }
}

RendezvousClient::~RendezvousClient() = default;

void RendezvousClient::release_stop() {
  std::lock_guard lock(impl_->mu);
  impl_->stop = {};
}

void RendezvousClient::set(const std::string& key, const Bytes& value) {
  net::Writer w;
  w.u8(uint8_t(Op::kSet));
  w.str(key);
  w.bytes(value.data(), value.size());
  impl_->call(w, {});
}

Bytes RendezvousClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  net::Writer w;
  w.u8(uint8_t(Op::kGet));
  w.str(key);
  w.u64(static_cast<uint64_t>(clamp_wait(timeout).count()));
  auto reply = impl_->call(w, timeout);
  return net::Reader(reply).bytes();
}

int64_t RendezvousClient::add(const std::string& key, int64_t delta) {
  net::Writer w;
  w.u8(uint8_t(Op::kAdd));
  w.str(key);
  w.i64(delta);
  auto reply = impl_->call(w, {});
  return net::Reader(reply).i64();
}

void RendezvousClient::wait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  net::Writer w;
  w.u8(uint8_t(Op::kWait));
  put_keys(w, keys);
  w.u64(static_cast<uint64_t>(clamp_wait(timeout).count()));
  impl_->call(w, timeout);
}

bool RendezvousClient::check(const std::vector<std::string>& keys) {
  net::Writer w;
  w.u8(uint8_t(Op::kCheck));
  put_keys(w, keys);
  auto reply = impl_->call(w, {});
  return net::Reader(reply).u8() != 0;
}

void RendezvousClient::erase(const std::string& key) {
  net::Writer w;
  w.u8(uint8_t(Op::kErase));
  w.str(key);
  impl_->call(w, {});
}

std::string make_job_secret() {
  uint8_t raw[32];
  if (RAND_bytes(raw, sizeof(raw)) != 1) throw Error("RAND_bytes failed to make a job secret");
  std::string hex;
  for (uint8_t b : raw) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace krug::rendezvous
