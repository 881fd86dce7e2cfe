// In-process stores: InMemoryStore (ranks as threads in tests) and PrefixStore (namespaces).
#include "rendezvous/store.h"

#include <fmt/format.h>

#include <charconv>

namespace krug::rendezvous {

Bytes encode_counter(int64_t value) {
  std::string s = std::to_string(value);
  return Bytes(s.begin(), s.end());
}

int64_t decode_counter(const std::string& key, const Bytes& value) {
  int64_t v = 0;
  const char* begin = reinterpret_cast<const char*>(value.data());
  const char* end = begin + value.size();
  auto [ptr, ec] = std::from_chars(begin, end, v);
  if (value.empty() || ec != std::errc() || ptr != end)
    throw Error(fmt::format("store key '{}' holds {} bytes that are not a decimal counter",
                            key, value.size()));
  return v;
}

int64_t add_to_counter(const std::string& key, const Bytes* stored, int64_t delta) {
  if (!stored) return delta;
  const int64_t current = decode_counter(key, *stored);
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum))
    throw Error(fmt::format("store key '{}': adding {} to counter {} overflows 64 bits", key, delta,
                            current));
  return sum;
}

std::string quote_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

void InMemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

Bytes InMemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, clamp_wait(timeout), [&] { return data_.count(key) > 0; }))
    throw StoreTimeout(fmt::format("timed out after {} ms waiting for store key '{}'",
                                   timeout.count(), key));
  return data_[key];
}

int64_t InMemoryStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard lock(mu_);
    auto it = data_.find(key);
    value = add_to_counter(key, it == data_.end() ? nullptr : &it->second, delta);
    data_[key] = encode_counter(value);
  }
  cv_.notify_all();
  return value;
}

void InMemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  auto all_present = [&] {
    for (const auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  };
  if (cv_.wait_for(lock, clamp_wait(timeout), all_present)) return;
  std::vector<std::string> missing;
  for (const auto& k : keys)
    if (!data_.count(k)) missing.push_back(k);
  throw StoreTimeout(fmt::format("timed out after {} ms waiting for store key{} {}",
                                 timeout.count(), missing.size() == 1 ? "" : "s",
                                 quote_keys(missing)));
}

bool InMemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  for (const auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

void InMemoryStore::erase(const std::string& key) {
  std::lock_guard lock(mu_);
  data_.erase(key);
}

namespace {
std::vector<std::string> prefixed(const std::string& prefix, const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix + "/" + k);
  return out;
}
}  // namespace

void PrefixStore::set(const std::string& key, const Bytes& value) {
  inner_->set(prefix_ + "/" + key, value);
}
Bytes PrefixStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return inner_->get(prefix_ + "/" + key, timeout);
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(prefix_ + "/" + key, delta);
}
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  inner_->wait(prefixed(prefix_, keys), timeout);
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  return inner_->check(prefixed(prefix_, keys));
}
void PrefixStore::erase(const std::string& key) { inner_->erase(prefix_ + "/" + key); }

}  // namespace krug::rendezvous
