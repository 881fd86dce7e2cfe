#include "engine/host_staging.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace krug::engine {

HostStaging::HostStaging(collectives::Communicator& cpu,
                         std::shared_ptr<const device::Stream> stream, double timeout_seconds)
    : cpu_(cpu),
      stream_(std::move(stream)),
      timeout_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(timeout_seconds))) {}

void HostStaging::sync(const char* what) {
  stream_->synchronize(std::chrono::steady_clock::now() + timeout_,
                       std::string("host staging of ") + what);
}

// `bytes` of device memory into `buffer` (which gets at least `room` bytes); waits for the copy.
uint8_t* HostStaging::to_host(device::PinnedBuffer& buffer, const void* src, size_t bytes,
                              size_t room) {
  uint8_t* host = buffer.reserve(std::max(bytes, room));
  if (bytes > 0) {
    device::copy_async(host, src, bytes, *stream_);
    sync("a device-to-host copy");
  }
  return host;
}

// Waits for the copy too: the pinned buffer is the next collective's.
void HostStaging::to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  device::copy_async(dst, src, bytes, *stream_);
  sync("a host-to-device copy");
}

void HostStaging::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  const size_t bytes = count * dtype_size(dtype);
  uint8_t* host = to_host(in_, data, bytes, bytes);
  cpu_.allreduce(host, count, dtype, op);
  to_device(data, host, bytes);
}

void HostStaging::reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                                DataType dtype, ReduceOp op) {
  const size_t esize = dtype_size(dtype);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t mine = counts.at(static_cast<size_t>(rank())) * esize;
  uint8_t* host_in = to_host(in_, in, total * esize, total * esize);
  uint8_t* host_out = out_.reserve(mine);
  cpu_.reducescatter(host_in, host_out, counts, dtype, op);
  to_device(out, host_out, mine);
}

void HostStaging::allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) {
  const size_t mine = bytes_per_rank.at(static_cast<size_t>(rank()));
  const size_t total = std::accumulate(bytes_per_rank.begin(), bytes_per_rank.end(), size_t{0});
  uint8_t* host_in = to_host(in_, in, mine, mine);
  uint8_t* host_out = out_.reserve(total);
  cpu_.allgatherv(host_in, host_out, bytes_per_rank);
  to_device(out, host_out, total);
}

void HostStaging::broadcast(void* data, size_t bytes, int root) {
  const bool is_root = rank() == root;
  uint8_t* host = is_root ? to_host(in_, data, bytes, bytes) : in_.reserve(bytes);
  cpu_.broadcast(host, bytes, root);
  if (!is_root) to_device(data, host, bytes);
}

void HostStaging::alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                            const std::vector<size_t>& recv_bytes) {
  const size_t sent = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t{0});
  const size_t received = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
  uint8_t* host_in = to_host(in_, in, sent, sent);
  uint8_t* host_out = out_.reserve(received);
  cpu_.alltoallv(host_in, send_bytes, host_out, recv_bytes);
  to_device(out, host_out, received);
}

void HostStaging::sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                           size_t recv_bytes, int recv_from) {
  uint8_t* host_in = send_to >= 0 ? to_host(in_, send_data, send_bytes, send_bytes) : nullptr;
  uint8_t* host_out = recv_from >= 0 ? out_.reserve(recv_bytes) : nullptr;
  cpu_.sendrecv(host_in, send_bytes, send_to, host_out, recv_bytes, recv_from);
  if (recv_from >= 0) to_device(recv_data, host_out, recv_bytes);
}

}  // namespace krug::engine
