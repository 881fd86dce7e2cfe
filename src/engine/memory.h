// Where the executor's tensors live: the few operations it applies to them besides the
// communicator's (copies into and out of the fusion buffer, the scale factors, zeros for a joined
// rank), for host memory or for one CUDA device's (device_planes.h). The executor's logic (which
// bytes go where) is written once against this interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "krug/types.h"

namespace krug::engine {

class Memory {
 public:
  virtual ~Memory() = default;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void scale(DataType dtype, void* data, size_t count, double factor) = 0;
  // A buffer of at least `bytes`, reused from operation to operation.
  virtual uint8_t* fusion(size_t bytes) = 0;
  // A framework just allocated `bytes` at `data` for an output.
  virtual void fresh_output(void* /*data*/, size_t /*bytes*/) {}
};

// Host memory: the vectorized kernels of src/reduce.
class HostMemory final : public Memory {
 public:
  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* dst, size_t bytes) override;
  void scale(DataType dtype, void* data, size_t count, double factor) override;
  uint8_t* fusion(size_t bytes) override;
  void fresh_output(void* data, size_t bytes) override;

 private:
  // Reused from response to response: a step allocates nothing of the fused size (on glibc,
  // an allocation of a kilobyte or more first consolidates every small free chunk).
  std::vector<uint8_t> fusion_;
};

}  // namespace krug::engine
