// The data planes of device (CUDA) tensors, beside the executor: for each operation, the memory
// operations (CUDA copies and scale kernels on krug's stream) and the communicator to run it on:
//   nccl  an NCCL communicator over the process set's ranks, made on first use (its unique id
//         travels over the set's CPU communicator, krug's authenticated data plane)
//   host  host staging: each collective copies device memory into pinned host buffers, runs on
//         the process set's CPU communicator, and copies the result back
// KRUG_GPU_OPERATIONS picks one for every process set; reductions NCCL cannot do (int16, bool,
// Adasum) are staged whatever it says. Every rank derives the same choice from the same
// response, so the ranks of a set always meet on the same plane.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "collectives/communicator.h"
#include "engine/memory.h"

namespace krug::engine {

enum class GpuOperations : uint8_t { kHost = 0, kNccl = 1 };
std::string_view gpu_operations_name(GpuOperations ops);

// The plane KRUG_GPU_OPERATIONS names ("host", "nccl"; the knob table maps Horovod's names
// onto these), or where it is unset ("") nccl when this build has NCCL, else host. Throws
// krug::Error for nccl in a build without NCCL.
GpuOperations gpu_operations(const std::string& configured, bool nccl_built);

// The NCCL_HOSTID this rank sets before making NCCL communicators: with KRUG_GPU_SHARE_DEVICE
// (testing several ranks on one GPU) one per rank, so that NCCL 2.28, which refuses two ranks of
// a communicator on one GPU of one host, takes each rank for its own host; else empty (NCCL's
// own host detection).
std::string nccl_host_id(bool share_device, const std::string& hostname, int rank);

struct DeviceOptions {
  double timeout_seconds = 30.0;  // KRUG_TIMEOUT_SECONDS: every wait for the GPU or a peer
  int rank = 0;                   // global rank (NCCL_HOSTID in test mode)
  std::string hostname;
  std::string gpu_operations;  // KRUG_GPU_OPERATIONS: "host", "nccl" or "" (the default)
  bool share_device = false;   // KRUG_GPU_SHARE_DEVICE
};

class DevicePlanes {
 public:
  explicit DevicePlanes(const DeviceOptions& options);
  ~DevicePlanes();
  DevicePlanes(const DevicePlanes&) = delete;
  DevicePlanes& operator=(const DevicePlanes&) = delete;

  struct Plane {
    Memory* memory;
    collectives::Communicator* comm;
    int device;  // the device it runs on
    // Keeps `device` current on this thread while the operation runs (the thread may be a
    // user's, driving the engine's loop while it waits), then restores the previous one.
    std::shared_ptr<void> current;
  };
  // Where an operation on tensors of CUDA device `device` (-1: this rank has none, a joined
  // rank: the device it used last) over `cpu`'s ranks runs. `nccl_can`: NCCL supports the
  // operation's reduction. Collective on first use of a set with NCCL.
  Plane plane(collectives::Communicator& cpu, int device, bool nccl_can);
  // Waits until the device's stream has done the operation's work (the deadline is the timeout).
  void finish(int device, const std::string& what);
  // Runs `fn` on a host copy of `bytes` of device memory at `data`, then copies it back: for the
  // algorithms that exist only on the CPU (Adasum).
  void on_host(int device, void* data, size_t bytes, const std::function<void(void*)>& fn);

  GpuOperations operations() const { return operations_; }

 private:
  struct PerDevice;
  PerDevice& device_state(int device);

  DeviceOptions options_;
  GpuOperations operations_;
  int last_device_ = 0;
  std::map<int, std::unique_ptr<PerDevice>> devices_;
};

}  // namespace krug::engine
