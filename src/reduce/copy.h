// Bulk copies for the data plane.
#pragma once

#include <cstddef>

namespace krug::reduce {

// memcpy for buffers that do not overlap, as fast whatever the two addresses' offsets within a
// cache line. glibc copies 2 KiB to 512 KiB with `rep movsb`, which on AMD Zen runs about 8x
// slower when source and destination sit at different offsets within 64 bytes (3.6 against
// 30 GB/s here, docs/benchmarks.md): exactly the case of a malloc'd tensor (16 bytes past a
// page) against a page-aligned shared-memory slot. Large copies therefore use a vector loop
// where the CPU has AVX, memcpy otherwise and for small sizes.
void copy(void* dst, const void* src, size_t bytes);

// copy() into memory that is not read again soon and belongs to an output larger than the
// caches (a gathered tensor of megabytes): non-temporal stores, which skip reading each
// destination line before writing it and leave the caches to what is still being worked on.
// The caller decides from the whole output's size. Ranges must not overlap.
void copy_streaming(void* dst, const void* src, size_t bytes);

// Outputs from this size on are written with copy_streaming: beyond what one core's share of
// the last-level cache keeps (this machine: 32 MiB L3 for 2 cores).
inline constexpr size_t kStreamingOutputBytes = size_t{8} << 20;

// The copy for pieces of an output of `output_bytes` in all: copy_streaming from
// kStreamingOutputBytes on, copy below.
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
CopyFn copy_for_output(size_t output_bytes);

// Whether [a, a + bytes) and [b, b + bytes) share a byte.
bool overlaps(const void* a, const void* b, size_t bytes);

// memmove with copy()'s speed when the two ranges do not overlap.
void move(void* dst, const void* src, size_t bytes);

}  // namespace krug::reduce
