#include "engine/memory.h"

#include <cstring>

#include "common/huge_pages.h"
#include "reduce/copy.h"
#include "reduce/reduce.h"

namespace krug::engine {

void HostMemory::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) reduce::copy(dst, src, bytes);
}

void HostMemory::zero(void* dst, size_t bytes) {
  if (bytes > 0) std::memset(dst, 0, bytes);
}

void HostMemory::scale(DataType dtype, void* data, size_t count, double factor) {
  reduce::scale(dtype, data, count, factor);
}

uint8_t* HostMemory::fusion(size_t bytes) {
  if (fusion_.size() < bytes) fusion_.resize(bytes);
  return fusion_.data();
}

void HostMemory::fresh_output(void* data, size_t bytes) {
  advise_huge_pages(data, bytes);  // a framework's fresh tensor: not touched yet
}

}  // namespace krug::engine
