#include "engine/device_planes.h"

#include <fmt/format.h>

#include <chrono>

#include "collectives/hierarchical/hierarchical_communicator.h"
#include "collectives/nccl/nccl_plane.h"
#include "common/log.h"
#include "device/device.h"
#include "engine/host_staging.h"

namespace krug::engine {
namespace {

std::chrono::steady_clock::time_point deadline_after(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(seconds));
}

// Device memory on krug's stream: copies and scale kernels are queued, not waited for; the
// communicator's calls and DevicePlanes::finish() wait.
class DeviceMemory final : public Memory {
 public:
  explicit DeviceMemory(const device::Stream& stream) : stream_(stream), fusion_(stream.device()) {}
  void copy(void* dst, const void* src, size_t bytes) override {
    device::copy_async(dst, src, bytes, stream_);
  }
  void zero(void* dst, size_t bytes) override { device::zero_async(dst, bytes, stream_); }
  void scale(DataType dtype, void* data, size_t count, double factor) override {
    device::scale_async(dtype, data, count, factor, stream_);
  }
  uint8_t* fusion(size_t bytes) override {
    // The previous operation may still read the buffer on the stream; the stream orders it.
    return fusion_.reserve(bytes);
  }

 private:
  const device::Stream& stream_;
  device::DeviceBuffer fusion_;
};

// A set whose CPU allreduce is hierarchical gets the same shape for device tensors, like
// Horovod's hierarchical NCCL allreduce: NCCL inside each host (where GPUs share NVLink or PCIe),
// host staging through the CPU plane's cross-host groups, whose network NCCL would otherwise
// drive alone. Every other collective runs on the flat NCCL communicator.
std::unique_ptr<collectives::Communicator> hierarchical_or_flat(
    collectives::Communicator& cpu, std::unique_ptr<collectives::Communicator> flat,
    const std::shared_ptr<device::Stream>& stream, const collectives::nccl::Options& options,
    int rank) {
  auto* cpu_hierarchical = dynamic_cast<collectives::HierarchicalCommunicator*>(&cpu);
  if (!cpu_hierarchical) return flat;
  if (cpu.rank() == 0)
    log::at(log::Level::kInfo, rank,
            "GPU allreduce of a process set (members by host: {}): NCCL inside each host, host "
            "staging across hosts",
            cpu_hierarchical->layout().describe());
  return cpu_hierarchical->derive(
      std::move(flat),
      [&](collectives::Communicator& group,
          bool inside_host) -> std::unique_ptr<collectives::Communicator> {
        if (inside_host) return collectives::nccl::make_communicator(group, stream, options);
        return std::make_unique<HostStaging>(group, stream, options.timeout_seconds);
      },
      0);
}

// What a process set's CPU communicator carries for its device tensors.
struct SetPlanes {
  int device = -1;
  std::unique_ptr<collectives::Communicator> nccl;
  std::unique_ptr<collectives::Communicator> staging;
};

}  // namespace

struct DevicePlanes::PerDevice {
  explicit PerDevice(int device)
      : stream(std::make_shared<device::Stream>(device)), memory(*stream) {}
  std::shared_ptr<device::Stream> stream;
  DeviceMemory memory;
  device::PinnedBuffer host;  // on_host()
};

std::string_view gpu_operations_name(GpuOperations ops) {
  return ops == GpuOperations::kNccl ? "nccl" : "host";
}

GpuOperations gpu_operations(const std::string& configured, bool nccl_built) {
  if (configured == "host") return GpuOperations::kHost;
  if (configured.empty()) return nccl_built ? GpuOperations::kNccl : GpuOperations::kHost;
  if (!nccl_built)
    throw Error(
        "KRUG_GPU_OPERATIONS (or Horovod's HOROVOD_GPU_OPERATIONS / HOROVOD_GPU_ALLREDUCE) asks "
        "for NCCL, but this krug was built without NCCL; set KRUG_GPU_OPERATIONS=host or "
        "rebuild with KRUG_WITH_NCCL=1");
  return GpuOperations::kNccl;
}

std::string nccl_host_id(bool share_device, const std::string& hostname, int rank) {
  return share_device ? fmt::format("{}-krug-rank-{}", hostname, rank) : "";
}

DevicePlanes::DevicePlanes(const DeviceOptions& options)
    : options_(options),
      operations_(gpu_operations(options.gpu_operations, collectives::nccl::built())) {}

DevicePlanes::~DevicePlanes() = default;

DevicePlanes::PerDevice& DevicePlanes::device_state(int device) {
  if (device < 0) device = last_device_;
  last_device_ = device;
  auto it = devices_.find(device);
  if (it == devices_.end()) {
    std::string why;
    const int n = device::device_count(&why);
    if (device >= n)
      throw Error(
          fmt::format("rank {}: a tensor is on CUDA device {}, but this process sees {} "
                      "CUDA device(s){}",
                      options_.rank, device, n, why.empty() ? "" : ": " + why));
    it = devices_.emplace(device, std::make_unique<PerDevice>(device)).first;
  }
  return *it->second;
}

DevicePlanes::Plane DevicePlanes::plane(collectives::Communicator& cpu, int device, bool nccl_can) {
  PerDevice& d = device_state(device);
  device = d.stream->device();
  auto current = std::make_shared<device::DeviceGuard>(device);
  if (!cpu.device_plane) cpu.device_plane = std::make_shared<SetPlanes>();
  auto& set = *static_cast<SetPlanes*>(cpu.device_plane.get());
  if (set.device >= 0 && set.device != device)
    throw Error(
        fmt::format("rank {}: this process set's GPU operations ran on CUDA device {}, "
                    "and now a tensor is on device {}; keep each rank's tensors on one "
                    "device",
                    options_.rank, set.device, device));
  set.device = device;
  if (operations_ == GpuOperations::kNccl && nccl_can) {
    if (!set.nccl) {
      collectives::nccl::Options o;
      o.timeout_seconds = options_.timeout_seconds;
      o.host_id = nccl_host_id(options_.share_device, options_.hostname, options_.rank);
      set.nccl = hierarchical_or_flat(cpu, collectives::nccl::make_communicator(cpu, d.stream, o),
                                      d.stream, o, options_.rank);
    }
    return Plane{&d.memory, set.nccl.get(), device, current};
  }
  if (!set.staging)
    set.staging = std::make_unique<HostStaging>(cpu, d.stream, options_.timeout_seconds);
  return Plane{&d.memory, set.staging.get(), device, current};
}

void DevicePlanes::finish(int device, const std::string& what) {
  device_state(device).stream->synchronize(deadline_after(options_.timeout_seconds), what);
}

void DevicePlanes::on_host(int device, void* data, size_t bytes,
                           const std::function<void(void*)>& fn) {
  PerDevice& d = device_state(device);
  uint8_t* host = d.host.reserve(bytes);
  device::copy_async(host, data, bytes, *d.stream);
  d.stream->synchronize(deadline_after(options_.timeout_seconds), "a device-to-host copy");
  fn(host);
  device::copy_async(data, host, bytes, *d.stream);
  d.stream->synchronize(deadline_after(options_.timeout_seconds), "a host-to-device copy");
}

}  // namespace krug::engine
