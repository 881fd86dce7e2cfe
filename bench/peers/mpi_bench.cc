// mpi_bench: the peer of krug-bench and krug-step on MPI (built with Open MPI): the same sizes,
// timing and columns, so that the suite (scripts/bench-suite) puts them side by side.
//
//   mpirun -np 2 build/bench/mpi_bench allreduce|allgather|broadcast [--min-bytes 4]
//       [--max-bytes 256M] [--factor 2] [--iters N] [--warmup N] [--target-seconds 0.2]
//   mpirun -np 2 build/bench/mpi_bench step [--tensors 100 --tensor-bytes 1K | --shapes FILE]
//
// Sweep: float32; MPI_Allreduce (sum, out of place), MPI_Allgather (size = the whole gathered
// buffer, each rank contributing 1/n), MPI_Bcast (root 0). Step: one blocking MPI_Allreduce per
// tensor, one after the other, which is what a program without krug's fusion does. Time, algbw
// and busbw follow krug-bench (average of the slowest rank; busbw = algbw * 2(n-1)/n for
// allreduce, (n-1)/n for allgather, 1 for broadcast). One more operation checks the result.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/bench_util.h"

namespace {

enum class Mode { kAllreduce, kAllgather, kBroadcast, kStep };

struct Options {
  Mode mode = Mode::kAllreduce;
  std::string mode_name;
  int64_t min_bytes = 4;
  int64_t max_bytes = int64_t{256} << 20;
  int64_t factor = 2;
  bench::StepTensors step;
  bench::Timing timing;
};

constexpr const char* kUsage =
    "usage: mpirun -np N mpi_bench allreduce|allgather|broadcast [--min-bytes SIZE]\n"
    "           [--max-bytes SIZE] [--factor F] [--iters N] [--warmup N] [--target-seconds S]\n"
    "       mpirun -np N mpi_bench step [--tensors N --tensor-bytes SIZE | --shapes FILE]\n"
    "           [--iters N] [--warmup N] [--target-seconds S] [--percentiles]\n"
    "\n"
    "Sweep defaults: 4 B .. 256M, factor 2, ~0.2 s per size (at least 3 iterations). Step\n"
    "defaults: 100 tensors of 1K, ~0.5 s. SIZE takes K, M, G suffixes (x1024). Data type: "
    "float32.\n";

Mode parse_mode(const std::string& name) {
  if (name == "allreduce") return Mode::kAllreduce;
  if (name == "allgather") return Mode::kAllgather;
  if (name == "broadcast") return Mode::kBroadcast;
  if (name == "step") return Mode::kStep;
  throw bench::UsageError("unknown mode '" + name + "' (allreduce, allgather, broadcast, step)");
}

Options parse_args(int argc, char** argv) {
  Options o;
  bench::Flags flags(argc, argv, kUsage);
  if (!flags.next(&o.mode_name)) throw bench::UsageError("name the mode");  // or --help exits
  o.mode = parse_mode(o.mode_name);
  if (o.mode == Mode::kStep) o.timing.target_seconds = 0.5;
  for (std::string flag; flags.next(&flag);) {
    if (flag == "--percentiles") {
      o.timing.percentiles = true;
      continue;
    }
    const std::string& value = flags.value(flag);
    if (flag == "--min-bytes")
      o.min_bytes = bench::parse_size(flag, value);
    else if (flag == "--max-bytes")
      o.max_bytes = bench::parse_size(flag, value);
    else if (flag == "--factor")
      o.factor = bench::parse_int(flag, value);
    else if (!bench::parse_common_flag(flag, value, o.timing, &o.step))
      throw bench::UsageError("unknown option '" + flag + "'");
  }
  if (o.min_bytes < 4 || o.max_bytes < o.min_bytes)
    throw bench::UsageError("need 4 <= --min-bytes <= --max-bytes");
  if (o.factor < 2) throw bench::UsageError("--factor must be at least 2");
  if (o.step.tensors < 1 || o.step.tensor_bytes < 4)
    throw bench::UsageError("need --tensors >= 1 and --tensor-bytes >= 4");
  if (o.timing.iters && *o.timing.iters < 1) throw bench::UsageError("--iters must be >= 1");
  return o;
}

double slowest(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}
int64_t sum_over_ranks(int64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}
void barrier() {
  MPI_Barrier(MPI_COMM_WORLD);
}

// ---- the sweep -------------------------------------------------------------------------------

class Sweep {
 public:
  Sweep(const Options& o, int rank, int size) : o_(o), rank_(rank), size_(size) {
    int64_t max_elems = std::max<int64_t>(1, o.max_bytes / 4);
    in_.resize(static_cast<size_t>(max_elems));
    out_.resize(static_cast<size_t>(max_elems));
  }

  // Elements each rank sends for a nominal size (allgather: its share of the whole).
  int64_t elements_for(int64_t bytes) const {
    int64_t n = std::max<int64_t>(1, bytes / 4);
    return o_.mode == Mode::kAllgather ? std::max<int64_t>(1, n / size_) : n;
  }

  void set_elements(int64_t elems) { elems_ = elems; }

  void once() {
    const int n = static_cast<int>(elems_);
    switch (o_.mode) {
      case Mode::kAllreduce:
        MPI_Allreduce(in_.data(), out_.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case Mode::kAllgather:
        MPI_Allgather(in_.data(), n, MPI_FLOAT, out_.data(), n, MPI_FLOAT, MPI_COMM_WORLD);
        break;
      case Mode::kBroadcast:
        MPI_Bcast(in_.data(), n, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
      case Mode::kStep:
        break;
    }
  }

  // Rank r contributes r + 1 everywhere; outputs are poisoned with 0 first.
  int64_t verify() {
    const auto n = static_cast<size_t>(elems_);
    std::fill(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(n),
              o_.mode == Mode::kBroadcast && rank_ != 0 ? 0.0f : static_cast<float>(rank_ + 1));
    std::fill(out_.begin(), out_.end(), 0.0f);
    once();
    switch (o_.mode) {
      case Mode::kAllreduce:
        return bench::count_not_equal(out_.data(), elems_,
                                      static_cast<float>(size_ * (size_ + 1) / 2));
      case Mode::kAllgather: {
        int64_t wrong = 0;
        for (int r = 0; r < size_; ++r)
          wrong += bench::count_not_equal(out_.data() + r * n, elems_, static_cast<float>(r + 1));
        return wrong;
      }
      case Mode::kBroadcast:
        return bench::count_not_equal(in_.data(), elems_, 1.0f);
      case Mode::kStep:
        break;
    }
    return 0;
  }

 private:
  const Options& o_;
  int rank_, size_;
  int64_t elems_ = 0;
  std::vector<float> in_, out_;
};

double bus_factor(Mode m, int n) {
  if (m == Mode::kAllreduce) return 2.0 * (n - 1) / n;
  if (m == Mode::kAllgather) return static_cast<double>(n - 1) / n;
  return 1.0;
}

void print_sweep_header(const Options& o, int size) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string lib(version, static_cast<size_t>(len));
  lib = lib.substr(0, lib.find_first_of(",\n"));
  std::printf("# mpi_bench %s: %d ranks, dtype float32%s, %s, host %s, %s\n", o.mode_name.c_str(),
              size, o.mode == Mode::kAllreduce ? ", op sum" : "", bench::now_string().c_str(), host,
              lib.c_str());
  std::printf(
      "# sizes %s .. %s, factor %lld; time: average per operation of the slowest rank; "
      "GB/s = 1e9 bytes/s\n",
      bench::human_bytes(o.min_bytes).c_str(), bench::human_bytes(o.max_bytes).c_str(),
      static_cast<long long>(o.factor));
  std::printf("# %12s %12s %9s %8s %5s %6s %12s %12s %12s %8s\n", "size(B)", "count", "type",
              "redop", "root", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  std::fflush(stdout);
}

int run_sweep(const Options& o, int rank, int size) {
  if (rank == 0) print_sweep_header(o, size);
  Sweep sweep(o, rank, size);
  int64_t total_wrong = 0, last_elems = -1;
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes;) {
    int64_t elems = sweep.elements_for(bytes);
    if (elems != last_elems) {  // sizes below one element per rank collapse into one row
      last_elems = elems;
      sweep.set_elements(elems);
      auto timed = bench::time_operation(
          o.timing, [&] { sweep.once(); }, slowest, barrier);
      int64_t wrong = sum_over_ranks(sweep.verify());
      total_wrong += wrong;
      int64_t count = o.mode == Mode::kAllgather ? elems * size : elems;
      double algbw = static_cast<double>(count * 4) / timed.seconds / 1e9;
      if (rank == 0) {
        std::printf("  %12" PRId64 " %12" PRId64 " %9s %8s %5d %6" PRId64
                    " %12.3f %12.3f %12.3f %8" PRId64 "\n",
                    count * 4, count, "float32", o.mode == Mode::kAllreduce ? "sum" : "none",
                    o.mode == Mode::kBroadcast ? 0 : -1, timed.iters, timed.seconds * 1e6, algbw,
                    algbw * bus_factor(o.mode, size), wrong);
        std::fflush(stdout);
      }
    }
    if (bytes > o.max_bytes / o.factor) break;
    bytes *= o.factor;
  }
  if (rank == 0)
    std::printf("# Out of bounds values : %" PRId64 " %s\n#\n", total_wrong,
                total_wrong == 0 ? "OK" : "FAILED");
  return total_wrong == 0 ? 0 : 1;
}

// ---- the step --------------------------------------------------------------------------------

int run_step(const Options& o, int rank, int size) {
  auto tensors = o.step.list();
  std::vector<std::vector<float>> in, out;
  for (const auto& t : tensors) {
    in.emplace_back(static_cast<size_t>(t.elements), static_cast<float>(rank + 1));
    out.emplace_back(static_cast<size_t>(t.elements), 0.0f);
  }
  auto once = [&] {
    for (size_t i = 0; i < in.size(); ++i)
      MPI_Allreduce(in[i].data(), out[i].data(), static_cast<int>(in[i].size()), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
  };
  const auto count = static_cast<int64_t>(tensors.size());
  if (rank == 0) {
    const std::string what = o.step.describe(count);
    bench::print_step_header("mpi_bench", what, size, "one blocking MPI_Allreduce per tensor");
  }
  auto timed = bench::time_operation(o.timing, once, slowest, barrier);
  for (auto& v : out) std::fill(v.begin(), v.end(), 0.0f);
  once();
  int64_t wrong = 0;
  for (const auto& v : out)
    wrong += bench::count_not_equal(v.data(), static_cast<int64_t>(v.size()),
                                    static_cast<float>(size * (size + 1) / 2));
  wrong = sum_over_ranks(wrong);
  if (rank == 0) bench::print_step_row(count, 4 * bench::total_elements(tensors), timed, wrong);
  return wrong == 0 ? 0 : 1;
}

// Open MPI connects its shared-memory channels on first use; doing that here keeps it out of
// the first size's timing estimate.
void wire_up() {
  float x = 0;
  for (int i = 0; i < 10; ++i)
    MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 0;
  try {
    Options o = parse_args(argc, argv);
    wire_up();
    rc = o.mode == Mode::kStep ? run_step(o, rank, size) : run_sweep(o, rank, size);
  } catch (const bench::UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "mpi_bench: %s\n\n%s", e.what(), kUsage);
    rc = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_bench: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
