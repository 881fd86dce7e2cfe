// copy_alignment: how fast a copy moves bytes another core has just written, by the offset of
// the two buffers within a cache line, with glibc's memcpy and with krug's data-plane copy
// (src/reduce/copy.*). The shared-memory data plane does exactly this: a rank copies its
// tensor into a page-aligned slot and the peer copies it out (docs/benchmarks.md).
//
//   build/bench/copy_alignment [--bytes 256K] [--rounds 2000]
//
// Two threads on two cores pass a buffer back and forth: A copies its buffer into the shared
// one, B copies the shared one into its own and back, A copies it out again; four copies per
// round, two of them of lines the other core wrote. Printed: bytes copied per second, for the
// private buffers at 0, 16 (what malloc returns above its mmap threshold) and 64 bytes past a
// page, the shared one page-aligned.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/bench_util.h"
#include "reduce/copy.h"

namespace {

constexpr const char* kUsage =
    "usage: copy_alignment [--bytes SIZE] [--rounds N]\n"
    "\n"
    "GB/s of copies of lines another core wrote, glibc memcpy against krug's copy, for private\n"
    "buffers 0, 16 and 64 bytes past a page (default 256K bytes, 2000 rounds).\n";

void pin_to(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core % std::max(1u, std::thread::hardware_concurrency()), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// A page-aligned view `offset` bytes into a buffer of `bytes` + two pages.
struct Buffer {
  Buffer(size_t bytes, size_t offset, char fill) : storage(bytes + 8192, fill) {
    auto base = reinterpret_cast<uintptr_t>(storage.data());
    data = reinterpret_cast<char*>((base + 4095) & ~uintptr_t{4095}) + offset;
  }
  std::vector<char> storage;
  char* data;
};

template <class Copy>
double gbs(size_t bytes, size_t offset, int64_t rounds, Copy copy) {
  Buffer shared(bytes, 0, 1), a(bytes, offset, 2), b(bytes, offset, 3);
  std::atomic<int> turn{0};
  std::thread peer([&] {
    pin_to(1);
    for (int64_t i = 0; i < rounds; ++i) {
      while (turn.load(std::memory_order_acquire) != 1) {
      }
      copy(b.data, shared.data, bytes);
      copy(shared.data, b.data, bytes);
      turn.store(0, std::memory_order_release);
    }
  });
  pin_to(0);
  const auto t0 = bench::Clock::now();
  for (int64_t i = 0; i < rounds; ++i) {
    copy(shared.data, a.data, bytes);
    turn.store(1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 0) {
    }
    copy(a.data, shared.data, bytes);
  }
  const double seconds = bench::seconds_since(t0);
  peer.join();
  if (std::memcmp(a.data, b.data, bytes) != 0)
    throw std::runtime_error("copy_alignment: copies differ");
  return 4.0 * static_cast<double>(bytes) * static_cast<double>(rounds) / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t bytes = int64_t{256} << 10, rounds = 2000;
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] == "-h" || args[i] == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (i + 1 >= args.size()) throw bench::UsageError(args[i] + " needs a value");
      if (args[i] == "--bytes")
        bytes = bench::parse_size(args[i], args[i + 1]);
      else if (args[i] == "--rounds")
        rounds = bench::parse_int(args[i], args[i + 1]);
      else
        throw bench::UsageError("unknown option '" + args[i] + "'");
      ++i;
    }
    if (bytes < 1 || rounds < 1) throw bench::UsageError("--bytes and --rounds must be >= 1");
  } catch (const bench::UsageError& e) {
    std::fprintf(stderr, "copy_alignment: %s\n\n%s", e.what(), kUsage);
    return 2;
  }
  std::printf("# copy_alignment: %lld bytes, %lld rounds, %s\n", static_cast<long long>(bytes),
              static_cast<long long>(rounds), bench::now_string().c_str());
  std::printf("# %8s %14s %14s\n", "offset", "memcpy(GB/s)", "krug(GB/s)");
  const auto n = static_cast<size_t>(bytes);
  try {
    for (size_t offset : {size_t{0}, size_t{16}, size_t{64}}) {
      const double libc =
          gbs(n, offset, rounds, [](void* d, const void* s, size_t k) { std::memcpy(d, s, k); });
      const double krug = gbs(n, offset, rounds, krug::reduce::copy);
      std::printf("  %8zu %14.2f %14.2f\n", offset, libc, krug);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
