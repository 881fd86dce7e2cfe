// scale_async(): the device twin of reduce::scale (src/reduce/scale.cc), with the same rounding:
// float32, float16 and bfloat16 in float with the factor rounded to float (as Horovod's float32
// kernel), float64 in double, integers truncated toward zero and saturated, NaN to 0.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>

#include "device/cuda_check.h"
#include "device/device.h"

namespace krug::device {
namespace {

// Double holds every bound exactly but the 64-bit maxima, which round up past any value of the
// type (to 2^63 and 2^64), so comparing in double is exact.
template <typename T>
__device__ T scale_int(T v, double factor, T lo, T hi) {
  const double x = trunc(static_cast<double>(v) * factor);
  if (isnan(x)) return 0;
  if (x <= static_cast<double>(lo)) return lo;
  if (x >= static_cast<double>(hi)) return hi;
  return static_cast<T>(x);
}

template <typename T>
__global__ void scale_int_kernel(T* p, size_t n, double factor, T lo, T hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = scale_int(p[i], factor, lo, hi);
}

__global__ void scale_float_kernel(float* p, size_t n, float factor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] *= factor;
}

__global__ void scale_double_kernel(double* p, size_t n, double factor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] *= factor;
}

__global__ void scale_half_kernel(__half* p, size_t n, float factor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = __float2half_rn(__half2float(p[i]) * factor);
}

__global__ void scale_bf16_kernel(__nv_bfloat16* p, size_t n, float factor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(__bfloat162float(p[i]) * factor);
}

// A grid-stride loop: enough blocks to fill the GPU, never more than the data needs.
unsigned blocks_for(size_t n) {
  constexpr size_t kThreads = 256;
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
}

template <typename T>
void launch_int(void* data, size_t n, double factor, cudaStream_t s) {
  constexpr T lo = std::numeric_limits<T>::min();
  constexpr T hi = std::numeric_limits<T>::max();
  scale_int_kernel<T><<<blocks_for(n), 256, 0, s>>>(static_cast<T*>(data), n, factor, lo, hi);
}

}  // namespace

void scale_async(DataType dtype, void* data, size_t count, double factor, const Stream& stream) {
  if (factor == 1.0 || count == 0) return;
  auto s = static_cast<cudaStream_t>(stream.native());
  DeviceGuard guard(stream.device());
  switch (dtype) {
    case DataType::kUInt8:
      launch_int<uint8_t>(data, count, factor, s);
      break;
    case DataType::kInt8:
      launch_int<int8_t>(data, count, factor, s);
      break;
    case DataType::kInt16:
      launch_int<int16_t>(data, count, factor, s);
      break;
    case DataType::kInt32:
      launch_int<int32_t>(data, count, factor, s);
      break;
    case DataType::kInt64:
      launch_int<int64_t>(data, count, factor, s);
      break;
    case DataType::kUInt16:
      launch_int<uint16_t>(data, count, factor, s);
      break;
    case DataType::kUInt32:
      launch_int<uint32_t>(data, count, factor, s);
      break;
    case DataType::kUInt64:
      launch_int<uint64_t>(data, count, factor, s);
      break;
    case DataType::kFloat16:
      scale_half_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<__half*>(data), count,
                                                          static_cast<float>(factor));
      break;
    case DataType::kBFloat16:
      scale_bf16_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<__nv_bfloat16*>(data), count,
                                                          static_cast<float>(factor));
      break;
    case DataType::kFloat32:
      scale_float_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<float*>(data), count,
                                                           static_cast<float>(factor));
      break;
    case DataType::kFloat64:
      scale_double_kernel<<<blocks_for(count), 256, 0, s>>>(static_cast<double*>(data), count,
                                                            factor);
      break;
    case DataType::kBool:
      return;
  }
  check(cudaGetLastError(), "scale kernel launch", stream.device());
}

}  // namespace krug::device
