// The ordered collectives' point-to-point messages (collectives/ordered_reduce.h) over a TCP
// communicator's links: how its small sets run the same rank-ordered reduce-scatter and
// allgather as the Gloo and MPI communicators.
#pragma once

#include "collectives/ordered_reduce.h"
#include "collectives/tcp/tcp_links.h"

namespace krug::collectives::tcp {

class LinksExchange : public Exchange {
 public:
  explicit LinksExchange(Links& links) : links_(links) {}

  int rank() const override { return links_.rank(); }
  int size() const override { return links_.size(); }
  void begin(std::span<const Region> /*regions*/, size_t /*steps*/) override {}  // no registration
  void recv(void* data, size_t bytes, int peer, size_t step) override {
    links_.post_recv(peer, data, bytes, step);
  }
  void send(const void* data, size_t bytes, int peer, size_t /*step*/) override {
    links_.post_send(peer, data, bytes);
  }
  void wait_recvs(size_t step) override { links_.wait_recvs(step); }
  void wait_sends() override { links_.wait_sends(); }

 private:
  Links& links_;
};

}  // namespace krug::collectives::tcp
