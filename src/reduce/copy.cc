#include "reduce/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace krug::reduce {
namespace {

// Below this glibc's memcpy uses vector moves itself.
constexpr size_t kVectorLoopBytes = 2048;

#if defined(__x86_64__)
bool has_avx() {
  static const bool supported = __builtin_cpu_supports("avx");
  return supported;
}

// 4 x 32 bytes per iteration, unaligned loads; `Streaming`: non-temporal stores, which need a
// 32-byte aligned destination, so the head up to that goes the usual way.
template <bool Streaming>
__attribute__((target("avx"))) void copy_avx(uint8_t* dst, const uint8_t* src, size_t bytes) {
  size_t i = Streaming ? (32 - reinterpret_cast<uintptr_t>(dst) % 32) % 32 : 0;
  std::memcpy(dst, src, i);
  for (; i + 128 <= bytes; i += 128) {
    for (size_t k = 0; k < 128; k += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + k));
      if constexpr (Streaming)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + k), v);
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + k), v);
    }
  }
  std::memcpy(dst + i, src + i, bytes - i);  // under 128 bytes: no rep movsb
  // Streaming stores are weakly ordered: whatever this thread publishes next (a counter the
  // peers wait on, a completed handle) must not become visible before them.
  if constexpr (Streaming) _mm_sfence();
}
#endif

// The vector loop where it pays (AVX, at least kVectorLoopBytes), memcpy otherwise.
template <bool Streaming>
void copy_with(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  if (bytes >= kVectorLoopBytes && has_avx()) {
    copy_avx<Streaming>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes);
    return;
  }
#endif
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

}  // namespace

void copy(void* dst, const void* src, size_t bytes) { copy_with<false>(dst, src, bytes); }

void copy_streaming(void* dst, const void* src, size_t bytes) {
  copy_with<true>(dst, src, bytes);
}

CopyFn copy_for_output(size_t output_bytes) {
  return output_bytes >= kStreamingOutputBytes ? copy_streaming : copy;
}

bool overlaps(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

void move(void* dst, const void* src, size_t bytes) {
  if (!overlaps(dst, src, bytes))
    copy(dst, src, bytes);
  else if (dst != src)
    std::memmove(dst, src, bytes);
}

}  // namespace krug::reduce
