// The device layer over the CUDA runtime (device.h). Kernels are in scale_kernels.cu.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "device/cuda_check.h"
#include "device/device.h"

namespace krug::device {

void check(cudaError_t status, const char* call, int device) {
  if (status == cudaSuccess) return;
  const std::string where = device >= 0 ? fmt::format(" on CUDA device {}", device) : "";
  throw Error(fmt::format("{}{} failed: {} ({})", call, where, cudaGetErrorName(status),
                          cudaGetErrorString(status)));
}

bool cuda_built() {
  return true;
}

std::string cuda_build_version() {
  return fmt::format("{}.{}", CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
}

int device_count(std::string* why) {
  int n = 0;
  cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    if (why)
      *why = fmt::format("cudaGetDeviceCount failed: {} ({})", cudaGetErrorName(status),
                         cudaGetErrorString(status));
    (void)cudaGetLastError();  // clear it, so that the next call is not blamed for it
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)";
  return n;
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice", device);
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_)
    (void)cudaSetDevice(previous_);  // a destructor cannot report; the next check() would
}

Stream::Stream(int device) : device_(device) {
  DeviceGuard guard(device);
  // A blocking stream: it is ordered after work already queued on the legacy default stream, and
  // that stream after it. PyTorch queues on the default stream unless told otherwise, so a tensor
  // its caching allocator hands out (or one it is still writing) is safe to touch here; work on
  // a framework's side stream is ordered by the ready event instead.
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamDefault), "cudaStreamCreateWithFlags", device);
  stream_ = s;
}

Stream::~Stream() {
  if (!stream_) return;
  DeviceGuard guard(device_);
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

bool Stream::query() const {
  cudaError_t status = cudaStreamQuery(static_cast<cudaStream_t>(stream_));
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaStreamQuery", device_);
  return true;
}

void Stream::synchronize(std::chrono::steady_clock::time_point deadline,
                         const std::string& what) const {
  // Spin briefly (small operations finish in microseconds), then yield between polls.
  for (int spins = 0;; ++spins) {
    if (query()) return;
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(
          fmt::format("{}: CUDA device {} did not finish krug's stream before the "
                      "deadline (KRUG_TIMEOUT_SECONDS)",
                      what, device_));
    if (spins > 1000) std::this_thread::yield();
  }
}

PinnedBuffer::~PinnedBuffer() {
  if (data_) (void)cudaFreeHost(data_);
}

uint8_t* PinnedBuffer::reserve(size_t bytes) {
  if (bytes > size_ || !data_) {
    if (data_) check(cudaFreeHost(data_), "cudaFreeHost");
    data_ = nullptr;
    size_ = 0;
    const size_t want = std::max<size_t>(bytes, 4096);
    check(cudaHostAlloc(&data_, want, cudaHostAllocPortable), "cudaHostAlloc");
    size_ = want;
  }
  return static_cast<uint8_t*>(data_);
}

DeviceBuffer::~DeviceBuffer() {
  if (!data_) return;
  DeviceGuard guard(device_);
  (void)cudaFree(data_);
}

uint8_t* DeviceBuffer::reserve(size_t bytes) {
  if (bytes > size_ || !data_) {
    DeviceGuard guard(device_);
    if (data_) check(cudaFree(data_), "cudaFree", device_);
    data_ = nullptr;
    size_ = 0;
    const size_t want = std::max<size_t>(bytes, 4096);
    check(cudaMalloc(&data_, want), "cudaMalloc", device_);
    size_ = want;
  }
  return static_cast<uint8_t*>(data_);
}

void copy_async(void* dst, const void* src, size_t bytes, const Stream& stream) {
  if (bytes == 0 || dst == src) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                        static_cast<cudaStream_t>(stream.native())),
        "cudaMemcpyAsync", stream.device());
}

void zero_async(void* dst, size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream.native())),
        "cudaMemsetAsync", stream.device());
}

int pointer_device(const void* ptr) {
  cudaPointerAttributes attr{};
  check(cudaPointerGetAttributes(&attr, ptr), "cudaPointerGetAttributes");
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? attr.device : -1;
}

}  // namespace krug::device
