// Large output buffers on huge pages.
//
// An allgather or alltoall output is fresh memory on every call (the caller owns it afterwards),
// and glibc hands allocations above its mmap threshold (at most 32 MiB) straight from mmap, so
// every call faults its pages in one by one: on the VMs this project runs on, 64 MiB of 4 KiB
// faults cost tens of milliseconds, more than the collective. Asking for transparent huge pages
// before the first touch makes that 32 faults of 2 MiB. Where THP is off ("never"), or the
// range holds no whole 2 MiB page, nothing changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace krug {

// madvise(MADV_HUGEPAGE) on the 2 MiB-aligned part of [data, data + bytes). Call before the
// memory is first written. Errors are ignored: this is only advice.
void advise_huge_pages(void* data, size_t bytes);

// out.resize(bytes), with the new storage advised before the zero-fill touches it.
void resize_on_huge_pages(std::vector<uint8_t>& out, size_t bytes);

}  // namespace krug
