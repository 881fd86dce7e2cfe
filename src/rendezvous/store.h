// Key-value store used for bootstrap: ranks publish addresses and wait for each other's.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <map>
#include <string>
#include <vector>

#include "krug/types.h"

namespace krug::rendezvous {

using Bytes = std::vector<uint8_t>;

class StoreTimeout : public Error {
 public:
  using Error::Error;
};

// Counters written by add() are stored as decimal text ("42"), so get() on them is readable
// and every store implementation agrees on the encoding.
Bytes encode_counter(int64_t value);
// Throws krug::Error naming the key if the stored value is not a decimal integer.
int64_t decode_counter(const std::string& key, const Bytes& value);
// add() on a counter: `stored` (its current value, if the key exists) plus `delta`. Throws
// krug::Error naming the key when the sum does not fit in 64 bits, or what decode_counter throws.
int64_t add_to_counter(const std::string& key, const Bytes* stored, int64_t delta);

// Longest wait any store honours: keeps now + timeout from overflowing the clock when a caller
// passes milliseconds::max() to mean "forever".
inline constexpr std::chrono::milliseconds kMaxStoreWait = std::chrono::hours(24 * 365);
inline std::chrono::milliseconds clamp_wait(std::chrono::milliseconds t) {
  return std::clamp(t, std::chrono::milliseconds(0), kMaxStoreWait);
}

// "'a', 'b'" for error messages.
std::string quote_keys(const std::vector<std::string>& keys);

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits until the key exists; throws StoreTimeout naming the key after `timeout`.
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the integer stored at key (0 if absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists; throws StoreTimeout naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual void erase(const std::string& key) = 0;
};

// Thread-safe in-process store: lets tests run N ranks as threads of one process.
class InMemoryStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  void erase(const std::string& key) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
};

// A view of another store with every key prefixed (one namespace per process set / epoch).
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
      : prefix_(std::move(prefix)), inner_(std::move(inner)) {}
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  void erase(const std::string& key) override;

 private:
  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace krug::rendezvous
