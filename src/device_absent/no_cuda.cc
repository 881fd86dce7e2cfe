// The device layer in a build without CUDA (device.h): cuda_built() is false, device_count() 0,
// and anything that would touch a GPU throws an Error saying how to get a CUDA build.
#include <string>

#include "device/device.h"

namespace krug::device {
namespace {

[[noreturn]] void no_cuda(const char* what) {
  throw Error(std::string(what) +
              ": this krug was built without CUDA; rebuild it on a machine with the CUDA toolkit "
              "(KRUG_WITH_CUDA=1, see docs/gpu.md) to use GPU tensors");
}

}  // namespace

bool cuda_built() {
  return false;
}
std::string cuda_build_version() {
  return "";
}

int device_count(std::string* why) {
  if (why) *why = "this krug was built without CUDA";
  return 0;
}

DeviceGuard::DeviceGuard(int) {
  no_cuda("DeviceGuard");
}
DeviceGuard::~DeviceGuard() = default;
Stream::Stream(int device) : device_(device) {
  no_cuda("Stream");
}
Stream::~Stream() = default;
void Stream::synchronize(std::chrono::steady_clock::time_point, const std::string&) const {
  no_cuda("Stream::synchronize");
}
bool Stream::query() const {
  no_cuda("Stream::query");
}
PinnedBuffer::~PinnedBuffer() = default;
uint8_t* PinnedBuffer::reserve(size_t) {
  no_cuda("PinnedBuffer");
}
DeviceBuffer::~DeviceBuffer() = default;
uint8_t* DeviceBuffer::reserve(size_t) {
  no_cuda("DeviceBuffer");
}
void copy_async(void*, const void*, size_t, const Stream&) {
  no_cuda("copy_async");
}
void zero_async(void*, size_t, const Stream&) {
  no_cuda("zero_async");
}
void scale_async(DataType, void*, size_t, double, const Stream&) {
  no_cuda("scale_async");
}
int pointer_device(const void*) {
  no_cuda("pointer_device");
}

}  // namespace krug::device
