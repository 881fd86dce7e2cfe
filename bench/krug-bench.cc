// krug-bench: bandwidth of krug's collectives over a sweep of message sizes, in the manner of
// nccl-tests.
//
//   krugrun -np 2 build/bench/krug-bench allreduce [--min-bytes 4] [--max-bytes 256M]
//       [--factor 2] [--iters N] [--warmup N] [--dtype float32] [--op sum] [--root 0]
//       [--inplace] [--check 0|1] [--target-seconds 0.2]
//
// For every size: warm up, time `iters` back-to-back synchronous operations, and report the
// average time per operation, taking the slowest rank (an allreduce of the time with op Max).
// Bandwidths follow nccl-tests (doc/PERFORMANCE.md there):
//   algbw = bytes / time
//   busbw = algbw * 2(n-1)/n   allreduce
//           algbw * (n-1)/n    allgather (bytes = the whole gathered tensor)
//           algbw              broadcast
// After timing, one more operation runs on freshly filled inputs (and poisoned outputs) and its
// result is compared with the value computed locally; #wrong counts wrong elements over all
// ranks. Every size uses its own tensor name; the timed iterations reuse it, so from the second
// one on the engine answers from its response cache.
#include <krug/krug.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/bench_util.h"
#include "common/krug_main.h"

namespace {

enum class Collective { kAllreduce, kAllgather, kBroadcast };

struct Options {
  Collective collective = Collective::kAllreduce;
  std::string collective_name;
  int64_t min_bytes = 4;
  int64_t max_bytes = int64_t{256} << 20;
  int64_t factor = 2;
  std::optional<int64_t> iters;   // unset: scaled to target_seconds per size
  std::optional<int64_t> warmup;  // unset: 1 (plus the timing estimate)
  double target_seconds = 0.2;
  krug::DataType dtype = krug::DataType::kFloat32;
  krug::ReduceOp op = krug::ReduceOp::kSum;
  int root = 0;
  bool inplace = false;
  bool check = true;
};

constexpr const char* kUsage =
    "usage: krugrun -np N krug-bench allreduce|allgather|broadcast [options]\n"
    "\n"
    "  --min-bytes SIZE       smallest message (default 4); SIZE takes K, M, G suffixes (x1024)\n"
    "  --max-bytes SIZE       largest message (default 256M)\n"
    "  --factor F             multiply the size by F between steps (default 2)\n"
    "  --iters N              timed iterations per size (default: enough for --target-seconds,\n"
    "                         at least 3)\n"
    "  --warmup N             untimed iterations per size before the timing estimate\n"
    "                         (default 1)\n"
    "  --target-seconds S     timed seconds per size when --iters is not given (default 0.2)\n"
    "  --dtype T              uint8 int8 int16 int32 int64 float16 bfloat16 float32 float64\n"
    "                         (default float32)\n"
    "  --op OP                allreduce reduction: sum average min max product (default sum)\n"
    "  --root R               broadcast root (default 0)\n"
    "  --inplace              allreduce with output == input (default: out of place)\n"
    "  --check 0|1            verify the results (default 1)\n"
    "\n"
    "Sizes are the bytes of one rank's tensor (allreduce, broadcast) or of the whole gathered\n"
    "tensor (allgather, each rank contributing 1/N of it).\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "krug-bench: %s\n\n%s", message.c_str(), kUsage);
  std::exit(2);
}

krug::DataType parse_dtype(const std::string& text) {
  static constexpr krug::DataType kTypes[] = {
      krug::DataType::kUInt8,    krug::DataType::kInt8,    krug::DataType::kInt16,
      krug::DataType::kInt32,    krug::DataType::kInt64,   krug::DataType::kFloat16,
      krug::DataType::kBFloat16, krug::DataType::kFloat32, krug::DataType::kFloat64};
  for (auto t : kTypes)
    if (krug::dtype_name(t) == text) return t;
  usage_error("--dtype: '" + text +
              "' is not one of uint8 int8 int16 int32 int64 float16 "
              "bfloat16 float32 float64");
}

krug::ReduceOp parse_op(const std::string& text) {
  if (text == "sum") return krug::ReduceOp::kSum;
  if (text == "average" || text == "avg") return krug::ReduceOp::kAverage;
  if (text == "min") return krug::ReduceOp::kMin;
  if (text == "max") return krug::ReduceOp::kMax;
  if (text == "product" || text == "prod") return krug::ReduceOp::kProduct;
  usage_error("--op: '" + text + "' is not one of sum average min max product");
}

Options parse_args(int argc, char** argv) {
  Options o;
  std::vector<std::string> args(argv + 1, argv + argc);
  bool have_collective = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (flag.empty() || flag[0] != '-') {
      if (have_collective) usage_error("unexpected argument '" + flag + "'");
      have_collective = true;
      o.collective_name = flag;
      if (flag == "allreduce")
        o.collective = Collective::kAllreduce;
      else if (flag == "allgather")
        o.collective = Collective::kAllgather;
      else if (flag == "broadcast")
        o.collective = Collective::kBroadcast;
      else
        usage_error("unknown collective '" + flag + "' (allreduce, allgather or broadcast)");
      continue;
    }
    std::string value;
    bool has_inline = false;
    if (size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_inline = true;
    }
    if (flag == "--inplace") {
      if (has_inline) usage_error("--inplace takes no value");
      o.inplace = true;
      continue;
    }
    if (!has_inline) {
      if (i + 1 >= args.size()) usage_error(flag + " needs a value");
      value = args[++i];
    }
    if (flag == "--min-bytes" || flag == "-b")
      o.min_bytes = bench::parse_size(flag, value);
    else if (flag == "--max-bytes" || flag == "-e")
      o.max_bytes = bench::parse_size(flag, value);
    else if (flag == "--factor" || flag == "-f")
      o.factor = bench::parse_int(flag, value);
    else if (flag == "--iters" || flag == "-n")
      o.iters = bench::parse_int(flag, value);
    else if (flag == "--warmup" || flag == "-w")
      o.warmup = bench::parse_int(flag, value);
    else if (flag == "--dtype" || flag == "-d")
      o.dtype = parse_dtype(value);
    else if (flag == "--op" || flag == "-o")
      o.op = parse_op(value);
    else if (flag == "--root" || flag == "-r")
      o.root = static_cast<int>(bench::parse_int(flag, value));
    else if (flag == "--check" || flag == "-c")
      o.check = bench::parse_int(flag, value) != 0;
    else if (flag == "--target-seconds") {
      char* end = nullptr;
      o.target_seconds = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(o.target_seconds > 0))
        usage_error("--target-seconds: '" + value + "' is not a positive number");
    } else {
      usage_error("unknown option '" + flag + "'");
    }
  }
  if (!have_collective)
    usage_error("name the collective to run: allreduce, allgather or broadcast");
  if (o.min_bytes < 1) usage_error("--min-bytes must be at least 1");
  if (o.max_bytes < o.min_bytes) usage_error("--max-bytes must be at least --min-bytes");
  if (o.factor < 2) usage_error("--factor must be at least 2");
  if (o.iters && *o.iters < 1) usage_error("--iters must be at least 1");
  if (o.warmup && *o.warmup < 0) usage_error("--warmup must not be negative");
  if (o.root < 0) usage_error("--root must not be negative");
  if (o.inplace && o.collective != Collective::kAllreduce)
    usage_error("--inplace applies to allreduce only");
  return o;
}

// ---- element codecs --------------------------------------------------------------------------

// float <-> IEEE binary16 / bfloat16, round to nearest even. The benchmark's values are small
// integers (exact in every type), so these only need to be right, not fast.
uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (abs < 0x38800000u) {                                               // subnormal or zero
    int shift = 126 - static_cast<int>(abs >> 23);                       // 14 + (113 - exp)
    if (shift > 24) return static_cast<uint16_t>(sign);
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t half = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t h = ((abs - 0x38000000u) >> 13);
  uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float half_bits_to_float(uint16_t h) {
  uint32_t sign = (uint32_t{h} & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  } else {
    x = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_bits_to_float(uint16_t b) {
  uint32_t x = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

template <class T>
struct PlainCodec {
  using Storage = T;
  static Storage encode(double v) { return static_cast<T>(v); }
  static double decode(Storage s) { return static_cast<double>(s); }
};
struct HalfCodec {
  using Storage = uint16_t;
  static Storage encode(double v) { return float_to_half_bits(static_cast<float>(v)); }
  static double decode(Storage s) { return half_bits_to_float(s); }
};
struct BFloat16Codec {
  using Storage = uint16_t;
  static Storage encode(double v) { return float_to_bf16_bits(static_cast<float>(v)); }
  static double decode(Storage s) { return bf16_bits_to_float(s); }
};

template <class F>
auto with_codec(krug::DataType dtype, F&& f) {
  using krug::DataType;
  switch (dtype) {
    case DataType::kUInt8:
      return f(PlainCodec<uint8_t>{});
    case DataType::kInt8:
      return f(PlainCodec<int8_t>{});
    case DataType::kInt16:
      return f(PlainCodec<int16_t>{});
    case DataType::kInt32:
      return f(PlainCodec<int32_t>{});
    case DataType::kInt64:
      return f(PlainCodec<int64_t>{});
    case DataType::kUInt16:
      return f(PlainCodec<uint16_t>{});
    case DataType::kUInt32:
      return f(PlainCodec<uint32_t>{});
    case DataType::kUInt64:
      return f(PlainCodec<uint64_t>{});
    case DataType::kFloat16:
      return f(HalfCodec{});
    case DataType::kBFloat16:
      return f(BFloat16Codec{});
    case DataType::kFloat32:
      return f(PlainCodec<float>{});
    case DataType::kFloat64:
      return f(PlainCodec<double>{});
    case DataType::kBool:
      break;
  }
  throw std::logic_error("krug-bench: unsupported dtype");
}

// ---- test data -------------------------------------------------------------------------------

// Element i of rank r's input is value(r, i): small positive integers, exact in every dtype, so
// that sums (up to 8 * ranks) and products (up to 2^ranks) are exact too. The pattern repeats
// every kPeriod elements, so expected results are a table of kPeriod entries.
constexpr size_t kPeriod = 14;

double value(krug::ReduceOp op, int r, size_t i) {
  if (op == krug::ReduceOp::kProduct)
    return 1.0 + static_cast<double>((i + static_cast<size_t>(r)) % 2);
  return 1.0 + static_cast<double>((3 * i + 5 * static_cast<size_t>(r)) % 7);
}

std::vector<double> rank_pattern(krug::ReduceOp op, int r) {
  std::vector<double> p(kPeriod);
  for (size_t i = 0; i < kPeriod; ++i) p[i] = value(op, r, i);
  return p;
}

std::vector<double> reduced_pattern(krug::ReduceOp op, int n) {
  std::vector<double> p(kPeriod);
  for (size_t i = 0; i < kPeriod; ++i) {
    double acc = value(op, 0, i);
    for (int r = 1; r < n; ++r) {
      double v = value(op, r, i);
      switch (op) {
        case krug::ReduceOp::kSum:
        case krug::ReduceOp::kAverage:
          acc += v;
          break;
        case krug::ReduceOp::kMin:
          acc = std::min(acc, v);
          break;
        case krug::ReduceOp::kMax:
          acc = std::max(acc, v);
          break;
        case krug::ReduceOp::kProduct:
          acc *= v;
          break;
        case krug::ReduceOp::kAdasum:  // not element-wise; the bench never selects it
          break;
      }
    }
    p[i] = op == krug::ReduceOp::kAverage ? acc / n : acc;
  }
  return p;
}

// Writes `count` elements of the repeating pattern.
void fill(krug::DataType dtype, void* dst, size_t count, const std::vector<double>& pattern) {
  with_codec(dtype, [&](auto codec) {
    using C = decltype(codec);
    using S = typename C::Storage;
    S* d = static_cast<S*>(dst);
    size_t head = std::min(count, kPeriod);
    for (size_t i = 0; i < head; ++i) d[i] = C::encode(pattern[i]);
    // Double the filled prefix (a multiple of kPeriod) until the buffer is full.
    for (size_t done = head; done < count;) {
      size_t n = std::min(done, count - done);
      std::memcpy(d + done, d, n * sizeof(S));
      done += n;
    }
  });
}

// Largest error allowed when comparing with the exact result (computed in double).
double tolerance(krug::DataType dtype, krug::ReduceOp op, double expected) {
  using krug::DataType;
  double scale = std::max(1.0, std::fabs(expected));
  switch (dtype) {
    case DataType::kFloat16:
      return 1e-3 * scale;
    case DataType::kBFloat16:
      return 1e-2 * scale;
    case DataType::kFloat32:
      return 1e-6 * scale;
    case DataType::kFloat64:
      return 1e-12 * scale;
    default:  // integers: exact, except that an average is rounded to an integer
      return op == krug::ReduceOp::kAverage ? 0.5 + 1e-9 : 0.0;
  }
}

// Number of elements of `data` that differ from the repeating `pattern`.
int64_t count_wrong(krug::DataType dtype, krug::ReduceOp op, const void* data, size_t count,
                    const std::vector<double>& pattern) {
  std::vector<double> tol(kPeriod);
  for (size_t i = 0; i < kPeriod; ++i) tol[i] = tolerance(dtype, op, pattern[i]);
  return with_codec(dtype, [&](auto codec) {
    using C = decltype(codec);
    using S = typename C::Storage;
    const S* d = static_cast<const S*>(data);
    int64_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      size_t k = i % kPeriod;
      double got = C::decode(d[i]);
      if (!(std::fabs(got - pattern[k]) <= tol[k])) ++wrong;  // NaN counts as wrong
    }
    return wrong;
  });
}

// ---- cross-rank agreement --------------------------------------------------------------------

double allreduce_scalar(const char* name, double v, krug::ReduceOp op) {
  krug::ReduceOptions o;
  o.op = op;
  krug::allreduce(name, &v, &v, krug::DataType::kFloat64, {1}, o);
  return v;
}
double max_across_ranks(double v) {
  return allreduce_scalar("krug-bench/max", v, krug::ReduceOp::kMax);
}
double sum_across_ranks(double v) {
  return allreduce_scalar("krug-bench/sum", v, krug::ReduceOp::kSum);
}

// ---- one size --------------------------------------------------------------------------------

struct Buffers {
  std::unique_ptr<uint8_t[]> input, output;
};

struct SizeResult {
  int64_t bytes = 0;  // size column: per-rank tensor, or the whole gathered tensor
  int64_t count = 0;  // elements of that
  int64_t iters = 0;
  double seconds = 0;  // per operation, slowest rank
  int64_t wrong = -1;  // -1: not checked
};

class Bench {
 public:
  Bench(const Options& o, int rank, int size) : o_(o), rank_(rank), size_(size) {
    esize_ = static_cast<int64_t>(krug::dtype_size(o.dtype));
    int64_t max_elems = std::max<int64_t>(1, o.max_bytes / esize_);
    // Allgather: this rank's share in, the whole gathered tensor out (into one buffer reused
    // from call to call, as MPI_Allgather's receive buffer is).
    const bool gather = o.collective == Collective::kAllgather;
    if (gather) max_elems = std::max<int64_t>(1, max_elems / size);
    const auto buffer = [&](int64_t elems) {
      return std::make_unique_for_overwrite<uint8_t[]>(static_cast<size_t>(elems * esize_));
    };
    bufs_.input = buffer(max_elems);
    if (gather)
      bufs_.output = buffer(max_elems * size);
    else if (o.collective == Collective::kAllreduce && !o.inplace)
      bufs_.output = buffer(max_elems);
    reduce_options_.op = o.op;
  }

  // Elements of this rank's tensor for a nominal size in bytes.
  int64_t elements_for(int64_t bytes) const {
    int64_t n = std::max<int64_t>(1, bytes / esize_);
    if (o_.collective == Collective::kAllgather) n = std::max<int64_t>(1, n / size_);
    return n;
  }

  SizeResult run(int64_t elems) {
    SizeResult r;
    name_ = "krug-bench/" + o_.collective_name + "/" + std::string(krug::dtype_name(o_.dtype)) +
            "/" + std::to_string(elems);
    elems_ = elems;
    shape_ = {elems};
    r.count = o_.collective == Collective::kAllgather ? elems * size_ : elems;
    r.bytes = r.count * esize_;
    prepare_inputs();

    // Warm-up: the first operation negotiates the name and fills the response cache. Every
    // rank runs as many operations as the slowest rank's estimate asks for.
    bench::Timing timing;
    timing.iters = o_.iters;
    timing.warmup = o_.warmup.value_or(1);
    timing.target_seconds = o_.target_seconds;
    const auto timed = bench::time_operation(
        timing, [this] { once(); }, max_across_ranks, [] { krug::barrier(); });
    r.iters = timed.iters;
    r.seconds = timed.seconds;

    if (o_.check) r.wrong = static_cast<int64_t>(sum_across_ranks(static_cast<double>(verify())));
    return r;
  }

 private:
  size_t bytes() const { return static_cast<size_t>(elems_ * esize_); }
  size_t output_bytes() const {
    return o_.collective == Collective::kAllgather ? bytes() * static_cast<size_t>(size_) : bytes();
  }

  void prepare_inputs() {
    int source = o_.collective == Collective::kBroadcast ? o_.root : rank_;
    fill(o_.dtype, bufs_.input.get(), static_cast<size_t>(elems_), rank_pattern(o_.op, source));
    if (bufs_.output) std::memset(bufs_.output.get(), 0, output_bytes());
  }

  void once() {
    switch (o_.collective) {
      case Collective::kAllreduce: {
        void* out = o_.inplace ? bufs_.input.get() : bufs_.output.get();
        krug::allreduce(name_, bufs_.input.get(), out, o_.dtype, shape_, reduce_options_);
        break;
      }
      case Collective::kAllgather:
        // Every rank's tensor has the same shape, as MPI_Allgather's (a rank whose shape differs
        // makes it throw).
        krug::allgather(name_, bufs_.input.get(), bufs_.output.get(), o_.dtype, shape_);
        break;
      case Collective::kBroadcast:
        krug::broadcast(name_, bufs_.input.get(), o_.dtype, shape_, o_.root);
        break;
    }
  }

  // One more operation on fresh inputs, with the output poisoned (zero is never a valid result);
  // returns this rank's wrong elements.
  int64_t verify() {
    prepare_inputs();
    if (o_.collective == Collective::kBroadcast && rank_ != o_.root)
      std::memset(bufs_.input.get(), 0, bytes());
    once();
    const size_t n = static_cast<size_t>(elems_);
    switch (o_.collective) {
      case Collective::kAllreduce: {
        const void* out = o_.inplace ? bufs_.input.get() : bufs_.output.get();
        return count_wrong(o_.dtype, o_.op, out, n, reduced_pattern(o_.op, size_));
      }
      case Collective::kAllgather: {
        int64_t wrong = 0;
        for (int r = 0; r < size_; ++r)
          wrong +=
              count_wrong(o_.dtype, o_.op, bufs_.output.get() + static_cast<size_t>(r) * bytes(), n,
                          rank_pattern(o_.op, r));
        return wrong;
      }
      case Collective::kBroadcast:
        return count_wrong(o_.dtype, o_.op, bufs_.input.get(), n, rank_pattern(o_.op, o_.root));
    }
    return 0;
  }

  const Options& o_;
  int rank_, size_;
  int64_t esize_ = 0;
  Buffers bufs_;
  krug::ReduceOptions reduce_options_;
  std::string name_;
  int64_t elems_ = 0;
  // Made once per size, as a training step keeps its tensors' shapes: a vector made every call
  // would time the allocator too.
  krug::Shape shape_;
};

double bus_factor(Collective c, int n) {
  switch (c) {
    case Collective::kAllreduce:
      return 2.0 * (n - 1) / n;
    case Collective::kAllgather:
      return static_cast<double>(n - 1) / n;
    case Collective::kBroadcast:
      return 1.0;
  }
  return 1.0;
}

int run(const Options& o) {
  const int rank = krug::rank(), size = krug::size();
  if (o.collective == Collective::kBroadcast && o.root >= size)
    usage_error("--root " + std::to_string(o.root) + " is not a rank of this " +
                std::to_string(size) + "-rank job");
  const bool is_allreduce = o.collective == Collective::kAllreduce;
  const bool print = rank == 0;

  if (print) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    std::printf("# krug-bench %s: %d ranks, dtype %s%s%s, %s, host %s\n", o.collective_name.c_str(),
                size, std::string(krug::dtype_name(o.dtype)).c_str(), is_allreduce ? ", op " : "",
                is_allreduce ? std::string(krug::reduce_op_name(o.op)).c_str() : "",
                bench::now_string().c_str(), host);
    char target[32];
    std::snprintf(target, sizeof target, "%g", o.target_seconds);
    std::string line =
        "# sizes " + bench::human_bytes(o.min_bytes) + " .. " + bench::human_bytes(o.max_bytes) +
        ", factor " + std::to_string(o.factor) + ", iters " +
        (o.iters ? std::to_string(*o.iters)
                 : "auto (~" + std::string(target) + " s per size, at least 3)") +
        ", warmup " + std::to_string(o.warmup.value_or(1)) + (o.iters ? "" : " + timing estimate");
    if (is_allreduce) line += o.inplace ? ", in place" : ", out of place";
    if (o.collective == Collective::kBroadcast) line += ", root " + std::to_string(o.root);
    line += o.check ? ", check on" : ", check off";
    std::printf("%s\n", line.c_str());
    std::printf(
        "# time: average per operation of the slowest rank; GB/s = 1e9 bytes/s; "
        "busbw = algbw * %s\n",
        o.collective == Collective::kAllreduce   ? "2(n-1)/n"
        : o.collective == Collective::kAllgather ? "(n-1)/n"
                                                 : "1");
    std::printf("#\n");
    std::printf("# %12s %12s %9s %8s %5s %6s %12s %12s %12s %8s\n", "size(B)", "count", "type",
                "redop", "root", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    std::fflush(stdout);
  }

  Bench bench(o, rank, size);
  double busbw_sum = 0;
  int rows = 0;
  int64_t total_wrong = 0;
  int64_t last_elems = -1;
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes;) {
    int64_t elems = bench.elements_for(bytes);
    if (elems != last_elems) {  // sizes below one element per rank collapse into one row
      last_elems = elems;
      SizeResult r = bench.run(elems);
      double algbw = static_cast<double>(r.bytes) / r.seconds / 1e9;
      double busbw = algbw * bus_factor(o.collective, size);
      busbw_sum += busbw;
      ++rows;
      if (r.wrong > 0) total_wrong += r.wrong;
      if (print) {
        std::string redop = is_allreduce ? std::string(krug::reduce_op_name(o.op)) : "none";
        int root = o.collective == Collective::kBroadcast ? o.root : -1;
        std::string wrong = r.wrong < 0 ? "N/A" : std::to_string(r.wrong);
        std::printf("  %12" PRId64 " %12" PRId64 " %9s %8s %5d %6" PRId64
                    " %12.3f %12.3f %12.3f %8s\n",
                    r.bytes, r.count, std::string(krug::dtype_name(o.dtype)).c_str(), redop.c_str(),
                    root, r.iters, r.seconds * 1e6, algbw, busbw, wrong.c_str());
        std::fflush(stdout);
      }
    }
    if (bytes > o.max_bytes / o.factor) break;
    bytes *= o.factor;
  }
  if (print) {
    std::printf("# Out of bounds values : %" PRId64 " %s\n", total_wrong,
                !o.check           ? "(not checked)"
                : total_wrong == 0 ? "OK"
                                   : "FAILED");
    std::printf("# Avg bus bandwidth    : %.3f GB/s\n", rows > 0 ? busbw_sum / rows : 0.0);
    std::printf("#\n");
    std::fflush(stdout);
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = bench::parse_or_exit("krug-bench", kUsage, parse_args, argc, argv);
  return bench::run_on_krug("krug-bench", [&] { return run(o); });
}
