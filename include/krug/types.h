// Value types shared by every krug API: data types, reduction ops and the error type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace krug {

// Element type of a tensor. Values are part of the wire format: append only.
enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kBFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
  kUInt16 = 10,
  kUInt32 = 11,
  kUInt64 = 12,
};
inline constexpr int kNumDataTypes = 13;

// Size of one element in bytes.
size_t dtype_size(DataType dtype);
// Lower-case name ("float32"), used in error messages and the timeline.
std::string_view dtype_name(DataType dtype);
bool is_floating(DataType dtype);

// Reduction applied by allreduce / reducescatter. Values are part of the wire format.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  // Adaptive summation (Maleki et al., 2020): not element-wise. Allreduce only, floating-point
  // dtypes only, process sets whose size is a power of two; applied per tensor of a fused buffer.
  kAdasum = 5,
};
std::string_view reduce_op_name(ReduceOp op);

// Thrown by the synchronous API and by Handle::wait() when an operation fails. The message says
// what failed, on which rank/host, and what to do.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A bad argument found before anything was enqueued: nothing was sent, no other rank is
// affected. Bindings raise it as their language's argument error (ValueError in Python).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

}  // namespace krug
