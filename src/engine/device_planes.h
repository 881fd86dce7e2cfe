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

using EnvLookup = std::function<const char*(const char*)>;

// KRUG_GPU_OPERATIONS (host or nccl, any case); else Horovod's HOROVOD_GPU_OPERATIONS or
// HOROVOD_GPU_ALLREDUCE (NCCL means nccl; MPI and GLOO mean host staging through the CPU plane);
// unset: nccl when this build has NCCL, else host. Throws krug::Error for another value, or for
// nccl in a build without NCCL.
GpuOperations gpu_operations(const EnvLookup& getenv, bool nccl_built);

// The NCCL_HOSTID this rank sets before making NCCL communicators: with KRUG_GPU_SHARE_DEVICE=1
// (testing several ranks on one GPU) one per rank, so that NCCL 2.28, which refuses two ranks of
// a communicator on one GPU of one host, takes each rank for its own host; else empty (NCCL's
// own host detection). Throws for a malformed KRUG_GPU_SHARE_DEVICE.
std::string nccl_host_id(const EnvLookup& getenv, const std::string& hostname, int rank);

struct DeviceOptions {
  double timeout_seconds = 30.0;  // KRUG_TIMEOUT_SECONDS: every wait for the GPU or a peer
  int rank = 0;                   // global rank (NCCL_HOSTID in test mode)
  std::string hostname;
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
