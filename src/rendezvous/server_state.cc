#include "rendezvous/server_state.h"

#include <fmt/format.h>

#include <algorithm>

#include "net/frame_length.h"
#include "net/socket.h"
#include "rendezvous/protocol.h"

namespace krug::rendezvous {
namespace {

using protocol::Op;
using protocol::Status;

Bytes status_only(Status s) { return Bytes{uint8_t(s)}; }

Bytes with_message(Status s, const std::string& message) {
  net::Writer w;
  w.u8(uint8_t(s));
  w.str(message);
  return w.take();
}

std::vector<std::string> read_keys(net::Reader& r) {
  uint32_t n = r.u32();
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < n; ++i) keys.push_back(r.str());  // str() bounds-checks each key
  return keys;
}

}  // namespace

void ServerState::handle(uint64_t client, const Bytes& request, Clock::time_point now,
                         std::vector<Reply>& out) {
  bool changed = false;
  Bytes reply;
  try {
    reply = dispatch(client, request, now, changed);
  } catch (const Error& e) {  // malformed request or a non-counter value under add()
    reply = with_message(Status::kError, e.what());
  }
  if (!reply.empty()) out.push_back({client, std::move(reply)});
  if (changed) release_satisfied(out);
}

bool ServerState::handle_frames(uint64_t client, Bytes& in, Clock::time_point now,
                                std::vector<Reply>& out) {
  size_t pos = 0;
  bool handled = false;
  constexpr size_t kLength = net::kFrameLengthSize;
  while (!parked(client) && in.size() - pos >= kLength) {
    const size_t len = net::read_frame_length(in.data() + pos);
    if (len > net::kMaxFrameSize)
      throw net::NetError(fmt::format("frame of {} bytes is too large", len));
    if (in.size() - pos - kLength < len) break;
    Bytes request(in.begin() + pos + kLength, in.begin() + pos + kLength + len);
    pos += kLength + len;
    handle(client, request, now, out);
    handled = true;
  }
  in.erase(in.begin(), in.begin() + pos);
  return handled;
}

// Returns the reply, or an empty Bytes when the request was parked.
Bytes ServerState::dispatch(uint64_t client, const Bytes& request, Clock::time_point now,
                            bool& changed) {
  net::Reader r(request);
  auto op = static_cast<Op>(r.u8());
  switch (op) {
    case Op::kSet: {
      std::string key = r.str();
      data_[key] = r.bytes();
      changed = true;
      return status_only(Status::kOk);
    }
    case Op::kGet:
    case Op::kWait: {
      std::vector<std::string> keys = op == Op::kGet ? std::vector{r.str()} : read_keys(r);
      auto timeout = clamp_wait(std::chrono::milliseconds(
          static_cast<int64_t>(std::min<uint64_t>(r.u64(), kMaxStoreWait.count()))));
      Waiter w{client, op == Op::kGet, std::move(keys), timeout, now + timeout};
      return answer_or_park(std::move(w)).value_or(Bytes{});
    }
    case Op::kAdd: {
      std::string key = r.str();
      const int64_t delta = r.i64();
      auto it = data_.find(key);
      const int64_t value = add_to_counter(key, it == data_.end() ? nullptr : &it->second, delta);
      data_[key] = encode_counter(value);
      changed = true;
      net::Writer w;
      w.u8(uint8_t(Status::kOk));
      w.i64(value);
      return w.take();
    }
    case Op::kCheck: {
      auto keys = read_keys(r);
      return Bytes{uint8_t(Status::kOk), uint8_t(present(keys) ? 1 : 0)};
    }
    case Op::kErase:
      data_.erase(r.str());
      return status_only(Status::kOk);
  }
  return with_message(Status::kError, fmt::format("unknown request op {}", int(op)));
}

std::optional<Bytes> ServerState::answer_or_park(Waiter w) {
  if (present(w.keys)) return answer(w);
  if (w.timeout.count() == 0) return timeout_reply(w);  // nothing to wait for
  waiters_.push_back(std::move(w));
  return std::nullopt;
}

bool ServerState::present(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return data_.count(k) > 0; });
}

Bytes ServerState::answer(const Waiter& w) const {
  if (!w.is_get) return status_only(Status::kOk);
  const Bytes& value = data_.at(w.keys.front());
  net::Writer out;
  out.u8(uint8_t(Status::kOk));
  out.bytes(value.data(), value.size());
  return out.take();
}

Bytes ServerState::timeout_reply(const Waiter& w) const {
  std::vector<std::string> missing;
  for (const auto& k : w.keys)
    if (!data_.count(k)) missing.push_back(k);
  return with_message(Status::kTimeout,
                      fmt::format("timed out after {} ms waiting for store key{} {}",
                                  w.timeout.count(), missing.size() == 1 ? "" : "s",
                                  quote_keys(missing)));
}

void ServerState::release_satisfied(std::vector<Reply>& out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (present(it->keys)) {
      out.push_back({it->client, answer(*it)});
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void ServerState::expire(Clock::time_point now, std::vector<Reply>& out) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    out.push_back({it->client, timeout_reply(*it)});
    it = waiters_.erase(it);
  }
}

std::optional<ServerState::Clock::time_point> ServerState::next_deadline() const {
  std::optional<Clock::time_point> next;
  for (const auto& w : waiters_)
    if (!next || w.deadline < *next) next = w.deadline;
  return next;
}

bool ServerState::parked(uint64_t client) const {
  return std::any_of(waiters_.begin(), waiters_.end(),
                     [&](const Waiter& w) { return w.client == client; });
}

void ServerState::drop_client(uint64_t client) {
  waiters_.remove_if([&](const Waiter& w) { return w.client == client; });
}

}  // namespace krug::rendezvous
