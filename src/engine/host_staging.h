// Host staging: a Communicator over device memory that runs each collective on a CPU
// communicator through pinned host buffers (device -> pinned, the CPU plane, pinned -> device),
// all copies on krug's stream. For GPUs without NCCL, KRUG_GPU_OPERATIONS=host, and the
// reductions NCCL lacks. Several ranks may share one GPU.
#pragma once

#include <chrono>
#include <memory>

#include "collectives/communicator.h"
#include "device/device.h"

namespace krug::engine {

class HostStaging final : public collectives::Communicator {
 public:
  // `cpu` must outlive it.
  HostStaging(collectives::Communicator& cpu, std::shared_ptr<const device::Stream> stream,
              double timeout_seconds);

  int rank() const override { return cpu_.rank(); }
  int size() const override { return cpu_.size(); }
  const char* backend_name() const override { return "host staging"; }

  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override;
  void barrier() override { cpu_.barrier(); }
  void sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                size_t recv_bytes, int recv_from) override;

 private:
  uint8_t* to_host(device::PinnedBuffer& buffer, const void* src, size_t bytes, size_t room);
  void to_device(void* dst, const void* src, size_t bytes);
  void sync(const char* what);

  collectives::Communicator& cpu_;
  std::shared_ptr<const device::Stream> stream_;
  std::chrono::steady_clock::duration timeout_;
  device::PinnedBuffer in_, out_;
};

}  // namespace krug::engine
