// Pieces shared by the benchmarks that sit beside krug-bench (krug-step, mpi_bench,
// machine_limits): size parsing, the timing loop, the gradient-list file and the output lines.
// Header-only and free of krug and MPI, so the peer benchmarks build without either; each
// program supplies its own "slowest rank" and "barrier" as callables.
//
// The timing loop is krug-bench's (bench/krug-bench.cc), so that every tool's time(us) column
// means the same thing: warm up, estimate one operation (a batch when it is short), run enough
// operations for about `target_seconds` (at least 3), and report the average of the slowest rank.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Thrown for a malformed command line; main() prints it with the usage text and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses the command line with parse(argc, argv), or prints the tool's usage error and exits 2:
// the first step of every tool here.
template <class Parse>
auto parse_or_exit(const char* tool, const char* usage, Parse&& parse, int argc, char** argv) {
  try {
    return parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n\n%s", tool, e.what(), usage);
    std::exit(2);
  }
}

// Walks a tool's flags: `-h` / `--help` prints the usage and exits 0; a flag that needs a value
// takes the next argument, or the walk throws UsageError naming the flag.
class Flags {
 public:
  Flags(int argc, char** argv, const char* usage) : args_(argv + 1, argv + argc), usage_(usage) {}
  // The next flag, or false at the end.
  bool next(std::string* flag) {
    if (next_ >= args_.size()) return false;
    *flag = args_[next_++];
    if (*flag == "-h" || *flag == "--help") {
      std::fputs(usage_, stdout);
      std::exit(0);
    }
    return true;
  }
  // The value of the flag `next` just gave.
  const std::string& value(const std::string& flag) {
    if (next_ >= args_.size()) throw UsageError(flag + " needs a value (see --help)");
    return args_[next_++];
  }

 private:
  std::vector<std::string> args_;
  const char* usage_;
  size_t next_ = 0;
};

inline int64_t parse_int(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0)
    throw UsageError(flag + ": '" + text + "' is not an integer");
  return v;
}

inline double parse_positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v > 0))
    throw UsageError(flag + ": '" + text + "' is not a positive number");
  return v;
}

// "4", "64K", "256M", "1G" (binary multiples, as krug-bench and nccl-tests read them).
inline int64_t parse_size(const std::string& flag, const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0) throw UsageError(flag + ": '" + text + "' is not a size (e.g. 4, 64K, 256M)");
  std::string suffix = text.substr(digits);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = -1;
  if (suffix.empty() || suffix == "B") shift = 0;
  if (suffix == "K" || suffix == "KB" || suffix == "KIB") shift = 10;
  if (suffix == "M" || suffix == "MB" || suffix == "MIB") shift = 20;
  if (suffix == "G" || suffix == "GB" || suffix == "GIB") shift = 30;
  if (shift < 0) throw UsageError(flag + ": '" + text + "': unknown suffix (use K, M or G)");
  int64_t v = parse_int(flag, text.substr(0, digits));
  if (v > (int64_t{1} << 40) >> shift) throw UsageError(flag + ": '" + text + "' is too large");
  return v << shift;
}

inline std::string human_bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t{1} << 30) && b % (int64_t{1} << 30) == 0)
    std::snprintf(buf, sizeof buf, "%" PRId64 " GiB", b >> 30);
  else if (b >= (int64_t{1} << 20) && b % (int64_t{1} << 20) == 0)
    std::snprintf(buf, sizeof buf, "%" PRId64 " MiB", b >> 20);
  else if (b >= 1024 && b % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%" PRId64 " KiB", b >> 10);
  else
    std::snprintf(buf, sizeof buf, "%" PRId64 " B", b);
  return buf;
}

inline std::string now_string() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", &tm);
  return buf;
}

struct Timing {
  std::optional<int64_t> iters;  // unset: scaled to target_seconds
  int64_t warmup = 1;
  double target_seconds = 0.2;
  int64_t min_iters = 3;
  // Only a bound on a wrong estimate: a cap that the target time reaches first would end a
  // 0.2 µs operation's run after a fraction of a millisecond, which one scheduler hiccup on a
  // busy or virtual host then decides.
  int64_t max_iters = 1'000'000;
  bool percentiles = false;  // also time every operation alone (--percentiles)
};

// Where the operations' times lie: an average hides whether every call is a little slower or a
// few wait for a descheduled peer (a busy or oversubscribed host, a VM's stolen time).
struct Spread {
  double p50 = 0, p90 = 0, p99 = 0, max = 0;  // seconds, each the slowest rank's
};

struct Timed {
  int64_t iters = 0;
  double seconds = 0;  // per operation, slowest rank
  std::optional<Spread> spread;  // with Timing::percentiles
};

// The q-quantile (0..1) of `sorted` (nearest rank).
inline double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto i = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, i == 0 ? 0 : i - 1)];
}

// This rank's spread of `seconds`, each figure the maximum over the ranks.
template <class Slowest>
Spread spread_of(std::vector<double> seconds, Slowest&& slowest) {
  std::sort(seconds.begin(), seconds.end());
  return Spread{.p50 = slowest(quantile(seconds, 0.5)),
                .p90 = slowest(quantile(seconds, 0.9)),
                .p99 = slowest(quantile(seconds, 0.99)),
                .max = slowest(seconds.empty() ? 0.0 : seconds.back())};
}

// How many operations to time: `t.iters`, or enough for `t.target_seconds` by the slowest rank's
// estimate, so that every rank runs the same number.
template <class Once, class Slowest>
int64_t planned_iters(const Timing& t, Once&& once, Slowest&& slowest) {
  if (t.iters) return *t.iters;
  auto t0 = Clock::now();
  once();
  double estimate = slowest(seconds_since(t0));
  if (estimate < 0.01) {
    // One short operation is mostly noise: estimate again from a batch of about 20 ms.
    const int64_t batch = std::clamp<int64_t>(static_cast<int64_t>(0.02 / std::max(estimate, 1e-6)),
                                              2, t.max_iters / 10);
    t0 = Clock::now();
    for (int64_t i = 0; i < batch; ++i) once();
    estimate = slowest(seconds_since(t0) / static_cast<double>(batch));
  }
  return std::clamp<int64_t>(
      static_cast<int64_t>(std::llround(t.target_seconds / std::max(estimate, 1e-9))), t.min_iters,
      t.max_iters);
}

// Times `once()` as krug-bench does. `slowest(v)` returns the maximum of v over the ranks (it is
// collective: every rank calls it the same number of times); `barrier()` lines the ranks up.
template <class Once, class Slowest, class Barrier>
Timed time_operation(const Timing& t, Once&& once, Slowest&& slowest, Barrier&& barrier) {
  for (int64_t i = 0; i < t.warmup; ++i) once();
  Timed r;
  r.iters = planned_iters(t, once, slowest);
  barrier();
  auto t0 = Clock::now();
  for (int64_t i = 0; i < r.iters; ++i) once();
  r.seconds = slowest(seconds_since(t0) / static_cast<double>(r.iters));
  if (t.percentiles) {
    // A second pass, so that reading the clock around every call leaves the average alone.
    std::vector<double> each(static_cast<size_t>(r.iters));
    barrier();
    for (auto& s : each) {
      const auto start = Clock::now();
      once();
      s = seconds_since(start);
    }
    r.spread = spread_of(std::move(each), slowest);
  }
  return r;
}

// ---- the tensors of one training step ----------------------------------------------------------

struct TensorSpec {
  std::string name;
  int64_t elements = 0;
};

// `count` tensors of `bytes` each (float32), named step.0, step.1, ...
inline std::vector<TensorSpec> uniform_tensors(int64_t count, int64_t bytes) {
  std::vector<TensorSpec> v;
  for (int64_t i = 0; i < count; ++i)
    v.push_back({"step." + std::to_string(i), std::max<int64_t>(1, bytes / 4)});
  return v;
}

// A gradient list (bench/resnet50_gradients.txt): "name 64x3x7x7" per line, '#' comments.
// Returned in reverse file order, the order in which backward() produces the gradients.
inline std::vector<TensorSpec> load_tensor_list(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the tensor list '" + path + "'");
  std::vector<TensorSpec> v;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, shape;
    if (!(fields >> name >> shape))
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": expected 'name shape'");
    int64_t elements = 1;
    std::istringstream dims(shape);
    for (std::string d; std::getline(dims, d, 'x');)
      elements *= parse_int(path + ":" + std::to_string(lineno), d);
    v.push_back({name, elements});
  }
  if (v.empty()) throw std::runtime_error("the tensor list '" + path + "' names no tensor");
  std::reverse(v.begin(), v.end());
  return v;
}

// The tensors of a step, as krug-step and mpi_bench's step mode take them: `tensors` of
// `tensor_bytes` each, or the list in the file `shapes`.
struct StepTensors {
  int64_t tensors = 100;
  int64_t tensor_bytes = 1024;
  std::string shapes;

  std::vector<TensorSpec> list() const {
    return shapes.empty() ? uniform_tensors(tensors, tensor_bytes) : load_tensor_list(shapes);
  }
  // "100 x 1 KiB" or "bench/resnet50_gradients.txt (161 tensors)", for the table header.
  std::string describe(int64_t count) const {
    return shapes.empty() ? std::to_string(count) + " x " + human_bytes(tensor_bytes)
                          : shapes + " (" + std::to_string(count) + " tensors)";
  }
};

// Takes a flag every tool shares (--iters, --warmup, --target-seconds) or, given `step`, a step
// flag (--tensors, --tensor-bytes, --shapes). Returns false for any other flag.
inline bool parse_common_flag(const std::string& flag, const std::string& value, Timing& timing,
                              StepTensors* step) {
  if (flag == "--iters")
    timing.iters = parse_int(flag, value);
  else if (flag == "--warmup")
    timing.warmup = parse_int(flag, value);
  else if (flag == "--target-seconds")
    timing.target_seconds = parse_positive(flag, value);
  else if (step && flag == "--tensors")
    step->tensors = parse_int(flag, value);
  else if (step && flag == "--tensor-bytes")
    step->tensor_bytes = parse_size(flag, value);
  else if (step && flag == "--shapes")
    step->shapes = value;
  else
    return false;
  return true;
}

inline int64_t total_elements(const std::vector<TensorSpec>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.elements;
  return n;
}

// The step table: one row per run, the same in every tool so the suite parses them alike.
inline void print_step_header(const char* tool, const std::string& what, int ranks,
                              const std::string& how) {
  std::printf("# %s: step of %s, %d ranks, float32 sum, %s\n", tool, what.c_str(), ranks,
              now_string().c_str());
  std::printf("# %s; time: average per step of the slowest rank\n", how.c_str());
  std::printf("# %10s %14s %8s %14s %8s\n", "tensors", "bytes", "iters", "time(us)", "#wrong");
}

inline void print_step_row(int64_t tensors, int64_t bytes, const Timed& t, int64_t wrong) {
  std::printf("  %10" PRId64 " %14" PRId64 " %8" PRId64 " %14.3f %8" PRId64 "\n", tensors, bytes,
              t.iters, t.seconds * 1e6, wrong);
  if (t.spread)
    std::printf("# per step, us (slowest rank): p50 %.3f  p90 %.3f  p99 %.3f  max %.2f\n",
                t.spread->p50 * 1e6, t.spread->p90 * 1e6, t.spread->p99 * 1e6, t.spread->max * 1e6);
  std::fflush(stdout);
}

// Elements that differ from `expected` (float32 sums of small integers are exact).
inline int64_t count_not_equal(const float* data, int64_t n, float expected) {
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!(data[i] == expected)) ++wrong;
  return wrong;
}

}  // namespace bench
