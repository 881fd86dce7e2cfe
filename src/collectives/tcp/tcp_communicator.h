// Communicator over krug's own TCP data plane: authenticated connections made when first
// needed (tcp_links.h), collectives whose members each talk to O(log n) peers
// (tcp_algorithms.h). It is the plane between hosts: unlike a full mesh, a job of thousands of
// ranks neither runs out of ports nor spends its start connecting every pair.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/tcp/tcp_algorithms.h"
#include "collectives/tcp/tcp_device.h"
#include "collectives/tcp/tcp_links.h"
#include "rendezvous/store.h"

namespace krug::collectives {

class TcpCommunicator : public Communicator {
 public:
  // Member `rank` of the `size` members of communicator `name` (unique in the job, the same on
  // every member; its store namespace is a good one). `store`: that communicator's namespace.
  // Makes no connection: each is made on first use.
  TcpCommunicator(std::string name, int rank, int size, std::shared_ptr<rendezvous::Store> store,
                  std::shared_ptr<tcp::Device> device, std::chrono::milliseconds timeout);

  int rank() const override { return links_.rank(); }
  int size() const override { return links_.size(); }
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  // The tree of tcp_algorithms.h.
  bool reduces_in_rank_order() const override { return false; }
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override;
  void barrier() override;
  void sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                size_t recv_bytes, int recv_from) override;
  const char* backend_name() const override { return "tcp"; }

  // Sockets this member holds now (for tests and the scale benchmark).
  size_t connections() const { return links_.connections(); }

 private:
  template <typename Call>
  void guarded(const char* what, Call&& call);

  tcp::Links links_;
  tcp::Buffers buffers_;
};

}  // namespace krug::collectives
