// Gloo's Store speaks std::vector<char> and has no per-call timeout on get(); bridge both.
#include "rendezvous/gloo_store.h"

namespace krug::rendezvous {

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  inner_->set(key, Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  Bytes value = inner_->get(key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { inner_->wait(keys, timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  // Gloo passes zero (kNoTimeout) to mean "no limit"; ours is "the adapter's timeout".
  inner_->wait(keys, timeout.count() > 0 ? timeout : timeout_);
}

}  // namespace krug::rendezvous
