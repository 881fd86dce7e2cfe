// The device layer: what the engine needs of a GPU, behind an interface that names no CUDA type,
// so the engine compiles (and runs CPU tensors) in builds without CUDA.
//
// With CUDA (src/device/*.cc, *.cu) every call checks its CUDA return code and throws
// krug::Error naming the call, the device and CUDA's message. Without it (src/device_absent)
// cuda_built() is false and everything else throws an Error that says how to get CUDA.
//
// Memory here is raw: device pointers come from the framework (torch's caching allocator) or
// from DeviceBuffer; host staging memory is PinnedBuffer. Copies take any pair of pointers
// (host, pinned or device): CUDA's unified addressing tells them apart.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "krug/types.h"

namespace krug::device {

// Whether this build has the CUDA device layer, and the CUDA runtime version it was built
// against ("13.0"; empty without CUDA).
bool cuda_built();
std::string cuda_build_version();
// How many CUDA devices this process sees; 0 without CUDA, without a driver or without a GPU
// (never throws). `why` (optional) receives the reason when 0.
int device_count(std::string* why = nullptr);

// Makes `device` current on this thread for the guard's lifetime; restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// krug's own stream on one device, ordered with respect to the legacy default stream (so
// with PyTorch's default stream) both ways.
class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int device() const { return device_; }
  // The cudaStream_t, for the NCCL plane.
  void* native() const { return stream_; }
  // Waits until all work queued so far is done, polling (so that it honours `deadline`) rather
  // than blocking in the driver; throws krug::Error naming `what` on a CUDA error or when the
  // deadline passes.
  void synchronize(std::chrono::steady_clock::time_point deadline, const std::string& what) const;
  // Whether all queued work is done; throws on a CUDA error.
  bool query() const;

 private:
  int device_;
  void* stream_ = nullptr;
};

// Page-locked host memory, grown on demand and reused: the staging area between device tensors
// and the CPU data plane.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  // At least `bytes` of memory (previous contents are not kept when it grows).
  uint8_t* reserve(size_t bytes);

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Device memory on one device, grown on demand and reused (the fusion buffer of the NCCL plane).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int device) : device_(device) {}
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* reserve(size_t bytes);

 private:
  int device_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Queued on `stream`; the caller keeps both sides valid until the stream is synchronized.
void copy_async(void* dst, const void* src, size_t bytes, const Stream& stream);
void zero_async(void* dst, size_t bytes, const Stream& stream);
// data[i] *= factor for `count` elements of `dtype` in device memory (a CUDA kernel); nothing
// when factor is 1. Every dtype rounds as reduce::scale does on the CPU.
void scale_async(DataType dtype, void* data, size_t count, double factor, const Stream& stream);

// The device that owns `ptr`, or -1 for host memory (pageable or pinned). Throws on a CUDA error.
int pointer_device(const void* ptr);

}  // namespace krug::device
