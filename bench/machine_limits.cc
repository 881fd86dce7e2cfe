// machine_limits: the memory bandwidth of this machine for the two things an allreduce on one
// host does to its bytes, so that the suite can say what fraction of the physical limit krug
// reaches.
//
//   build/bench/machine_limits [--min-bytes 64M] [--max-bytes 256M] [--repeats 5]
//
// For each buffer size (float32, factor 2), single thread, best of --repeats:
//   memcpy   memcpy(dst, src, bytes)          GB/s = bytes / time  (bytes copied per second)
//   reduce   a[i] = b[i] + c[i]               GB/s = bytes / time  (bytes of result per second)
// plus the bound they put on an allreduce's bus bandwidth. With n ranks on n cores, each rank
// reduces 1/n of the buffer from n inputs ((n-1)/n of it through the reduction) and copies the
// (n-1)/n of the result that other ranks reduced, in parallel with the others:
//   time >= (n-1)/n * bytes * (1/reduce + 1/memcpy)
//   busbw = bytes/time * 2(n-1)/n <= 2 / (1/reduce + 1/memcpy)   (the harmonic mean)
// That bound assumes every core gets this single-thread bandwidth at once; a shared memory bus
// can only lower it, so it is an upper limit.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/bench_util.h"

namespace {

struct Options {
  int64_t min_bytes = int64_t{64} << 20;
  int64_t max_bytes = int64_t{256} << 20;
  int64_t repeats = 5;
};

constexpr const char* kUsage =
    "usage: machine_limits [--min-bytes SIZE] [--max-bytes SIZE] [--repeats N]\n"
    "\n"
    "Single-thread memcpy and a[i] = b[i] + c[i] (float32) bandwidth, best of N (default 5),\n"
    "for buffers from --min-bytes (64M) to --max-bytes (256M), factor 2.\n";

Options parse_args(int argc, char** argv) {
  Options o;
  bench::Flags flags(argc, argv, kUsage);
  for (std::string flag; flags.next(&flag);) {
    const std::string& value = flags.value(flag);
    if (flag == "--min-bytes")
      o.min_bytes = bench::parse_size(flag, value);
    else if (flag == "--max-bytes")
      o.max_bytes = bench::parse_size(flag, value);
    else if (flag == "--repeats")
      o.repeats = bench::parse_int(flag, value);
    else
      throw bench::UsageError("unknown option '" + flag + "'");
  }
  if (o.min_bytes < 4096 || o.max_bytes < o.min_bytes)
    throw bench::UsageError("need 4K <= --min-bytes <= --max-bytes");
  if (o.repeats < 1) throw bench::UsageError("--repeats must be at least 1");
  return o;
}

// The reduction as krug's kernels write it: a loop the compiler vectorizes (-O3).
__attribute__((noinline)) void add(float* __restrict a, const float* __restrict b,
                                   const float* __restrict c, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + c[i];
}

template <class F>
double best_seconds(int64_t repeats, F&& f) {
  double best = std::numeric_limits<double>::infinity();
  for (int64_t r = 0; r < repeats; ++r) {
    auto t0 = bench::Clock::now();
    f();
    best = std::min(best, bench::seconds_since(t0));
  }
  return best;
}

struct Row {
  int64_t bytes;
  double memcpy_gbs, reduce_gbs;
};

Row measure(int64_t bytes, int64_t repeats) {
  const auto n = static_cast<size_t>(bytes / 4);
  // Written once before timing, so that page faults are not measured.
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  double copy = best_seconds(repeats, [&] { std::memcpy(a.data(), b.data(), n * 4); });
  double reduce = best_seconds(repeats, [&] { add(a.data(), b.data(), c.data(), n); });
  if (a[n / 2] != 3.0f) throw std::runtime_error("machine_limits: the reduction went wrong");
  return {bytes, static_cast<double>(bytes) / copy / 1e9,
          static_cast<double>(bytes) / reduce / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = bench::parse_or_exit("machine_limits", kUsage, parse_args, argc, argv);
  std::printf("# machine_limits: single thread, best of %lld, %s\n",
              static_cast<long long>(o.repeats), bench::now_string().c_str());
  std::printf("# memcpy: bytes copied / s; reduce a=b+c (float32): bytes of result / s;\n");
  std::printf(
      "# bound: 2/(1/reduce + 1/memcpy), the most allreduce busbw one core per rank allows\n");
  std::printf("# %12s %14s %14s %14s\n", "size(B)", "memcpy(GB/s)", "reduce(GB/s)", "bound(GB/s)");
  try {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
      Row r = measure(bytes, o.repeats);
      double bound = 2.0 / (1.0 / r.reduce_gbs + 1.0 / r.memcpy_gbs);
      std::printf("  %12lld %14.3f %14.3f %14.3f\n", static_cast<long long>(r.bytes), r.memcpy_gbs,
                  r.reduce_gbs, bound);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
