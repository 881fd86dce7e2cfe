#include "common/huge_pages.h"

#include <sys/mman.h>

namespace krug {
namespace {

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

}  // namespace

void advise_huge_pages(void* data, size_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (start + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (start + bytes) & ~(kHugePage - 1);
  if (data == nullptr || end <= first) return;
  (void)::madvise(reinterpret_cast<void*>(first), end - first, MADV_HUGEPAGE);
}

void resize_on_huge_pages(std::vector<uint8_t>& out, size_t bytes) {
  if (bytes > out.capacity() && bytes >= kHugePage) {
    out.reserve(bytes);  // allocates without touching the new pages
    advise_huge_pages(out.data(), bytes);
  }
  out.resize(bytes);
}

}  // namespace krug
