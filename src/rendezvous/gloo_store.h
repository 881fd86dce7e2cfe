// Adapts a krug Store to Gloo's rendezvous Store interface, so Gloo contexts bootstrap through
// krug's authenticated rendezvous.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>

#include "rendezvous/store.h"

namespace krug::rendezvous {

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<krug::rendezvous::Store> inner, std::chrono::milliseconds timeout)
      : inner_(std::move(inner)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<krug::rendezvous::Store> inner_;
  std::chrono::milliseconds timeout_;
};

}  // namespace krug::rendezvous
