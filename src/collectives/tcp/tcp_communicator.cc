#include "collectives/tcp/tcp_communicator.h"

#include <fmt/format.h>

#include "collectives/tcp/tcp_exchange.h"
#include "net/socket.h"

namespace krug::collectives {

TcpCommunicator::TcpCommunicator(std::string name, int rank, int size,
                                 std::shared_ptr<rendezvous::Store> store,
                                 std::shared_ptr<tcp::Device> device, const Options& options)
    : links_(std::move(name), rank, size, std::move(store), std::move(device), options.timeout),
      direct_(size <= options.direct_max_members),
      reducer_(options.segment_bytes) {}

template <typename Call>
void TcpCommunicator::guarded(const char* what, Call&& call) {
  try {
    call();
  } catch (const net::NetError& e) {
    throw Error(fmt::format("tcp {} failed on rank {} of {}: {}", what, rank(), size(), e.what()));
  }
}

void TcpCommunicator::reduce_in_place(void* data, size_t count, DataType dtype, ReduceOp op) {
  if (!direct_) return tcp::allreduce(links_, buffers_, data, count, dtype, op);
  tcp::LinksExchange reduce_scatter(links_), allgather(links_);
  reducer_.allreduce(reduce_scatter, allgather, data, count, dtype, op);
}

void TcpCommunicator::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  guarded("allreduce", [&] { reduce_in_place(data, count, dtype, op); });
}

void TcpCommunicator::reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                                    DataType dtype, ReduceOp op) {
  guarded("reducescatter", [&] {
    if (!direct_) return tcp::reduce_scatter(links_, buffers_, in, out, counts, dtype, op);
    tcp::LinksExchange exchange(links_);
    reducer_.reduce_scatter(exchange, in, out, counts, dtype, op);
  });
}

void TcpCommunicator::allgatherv(const void* in, void* out,
                                 const std::vector<size_t>& bytes_per_rank) {
  guarded("allgather", [&] {
    if (!direct_) return tcp::allgatherv(links_, in, out, bytes_per_rank);
    tcp::LinksExchange exchange(links_);
    collectives::allgatherv(exchange, in, out, bytes_per_rank);
  });
}

void TcpCommunicator::broadcast(void* data, size_t bytes, int root) {
  guarded("broadcast", [&] { tcp::broadcast(links_, data, bytes, root); });
}

void TcpCommunicator::alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                                const std::vector<size_t>& recv_bytes) {
  guarded("alltoall", [&] { tcp::alltoallv(links_, in, send_bytes, out, recv_bytes); });
}

void TcpCommunicator::barrier() {
  // One byte through allreduce's rounds: the same peers, so no socket of its own.
  uint8_t token = 0;
  guarded("barrier",
          [&] { tcp::allreduce(links_, buffers_, &token, 1, DataType::kUInt8, ReduceOp::kMax); });
}

void TcpCommunicator::sendrecv(const void* send_data, size_t send_bytes, int send_to,
                               void* recv_data, size_t recv_bytes, int recv_from) {
  if (sendrecv_with_self(send_data, send_bytes, send_to, recv_data, recv_bytes, recv_from)) return;
  const tcp::Send s{send_to, send_data, send_to < 0 ? 0 : send_bytes};
  const tcp::Recv r{recv_from, recv_data, recv_from < 0 ? 0 : recv_bytes};
  guarded(describe_sendrecv(send_bytes, send_to, recv_bytes, recv_from).c_str(), [&] {
    links_.round({&s, 1}, {&r, 1});
  });
}

}  // namespace krug::collectives
