// Communicator over Gloo's TCP transport.
//
// Broadcast, allgatherv, alltoallv and barrier are Gloo's own algorithms. Allreduce and
// reducescatter are krug's: a direct reduce-scatter where each rank owns a chunk and reduces
// the contributions in rank order (Gloo's ring sums in an order that depends on where a tensor
// lands in the fusion buffer, which breaks bitwise reproducibility), then a direct allgather.
// Both move (n-1)/n of the buffer per rank, like a ring, and use krug's kernels for every dtype.
// The algorithms are shared with the MPI backend (collectives/exchange_communicator.h); this
// backend supplies its messages (collectives/gloo/gloo_exchange.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "collectives/exchange_communicator.h"
#include "rendezvous/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace krug::collectives {

// One TCP device per engine; contexts for every process set share it.
std::shared_ptr<gloo::transport::Device> make_gloo_device(const std::string& hostname,
                                                          const std::string& iface);

class GlooCommunicator : public ExchangeCommunicator {
 public:
  // Collective over the `size` ranks that use the same store namespace.
  GlooCommunicator(int rank, int size, std::shared_ptr<rendezvous::Store> store,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::chrono::milliseconds timeout);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  void sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                size_t recv_bytes, int recv_from) override;
  const char* backend_name() const override { return "gloo"; }

 protected:
  std::unique_ptr<Exchange> exchange(Phase phase) override;
  void guarded(const char* what, const std::function<void()>& call) override;

 private:
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;
  uint64_t slot_counter_ = 0;
  // Point-to-point messages sent to / received from each peer: the slot of the n-th message in
  // one direction of a pair. Kept apart from slot_counter_, which every rank advances together.
  std::vector<uint64_t> sent_to_;
  std::vector<uint64_t> received_from_;
};

}  // namespace krug::collectives
