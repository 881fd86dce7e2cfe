#include "collectives/adasum.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "reduce/reduce.h"

namespace krug::collectives {
namespace {

// 16-bit floats are widened to float32 this many elements at a time (stack buffers).
constexpr size_t kBlock = 512;

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Partial sums of one tensor's piece: a.b, |a|^2, |b|^2.
struct Partial {
  double dot = 0, anorm2 = 0, bnorm2 = 0;
};

template <typename V>
void accumulate(const V* a, const V* b, size_t n, Partial& p) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]);
    const double y = static_cast<double>(b[i]);
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  p.dot += dot;
  p.anorm2 += na;
  p.bnorm2 += nb;
}

// out[i] = ca a[i] + cb b[i], in double, rounded once to V. `out` may be `a` or `b`.
template <typename V>
void combine(V* out, const V* a, const V* b, size_t n, double ca, double cb) {
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<V>(ca * static_cast<double>(a[i]) + cb * static_cast<double>(b[i]));
}

using ToFloat = void (*)(const uint16_t*, float*, size_t);
using FromFloat = void (*)(const float*, uint16_t*, size_t);

void accumulate16(ToFloat widen, const uint16_t* a, const uint16_t* b, size_t n, Partial& p) {
  alignas(64) float fa[kBlock];
  alignas(64) float fb[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    widen(a + i, fa, m);
    widen(b + i, fb, m);
    accumulate(fa, fb, m, p);
  }
}

void combine16(ToFloat widen, FromFloat narrow, uint16_t* out, const uint16_t* a,
               const uint16_t* b, size_t n, double ca, double cb) {
  alignas(64) float fa[kBlock];
  alignas(64) float fb[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    widen(a + i, fa, m);
    widen(b + i, fb, m);
    combine(fa, fa, fb, m, ca, cb);
    narrow(fa, out + i, m);
  }
}

void accumulate_any(DataType t, const void* a, const void* b, size_t n, Partial& p) {
  switch (t) {
    case DataType::kFloat32:
      return accumulate(static_cast<const float*>(a), static_cast<const float*>(b), n, p);
    case DataType::kFloat64:
      return accumulate(static_cast<const double*>(a), static_cast<const double*>(b), n, p);
    case DataType::kFloat16:
      return accumulate16(reduce::half_to_float_n, static_cast<const uint16_t*>(a),
                          static_cast<const uint16_t*>(b), n, p);
    case DataType::kBFloat16:
      return accumulate16(reduce::bfloat16_to_float_n, static_cast<const uint16_t*>(a),
                          static_cast<const uint16_t*>(b), n, p);
    default:
      throw Error(fmt::format("adasum: unsupported data type {}", dtype_name(t)));
  }
}

void combine_any(DataType t, void* out, const void* a, const void* b, size_t n, double ca,
                 double cb) {
  switch (t) {
    case DataType::kFloat32:
      return combine(static_cast<float*>(out), static_cast<const float*>(a),
                     static_cast<const float*>(b), n, ca, cb);
    case DataType::kFloat64:
      return combine(static_cast<double*>(out), static_cast<const double*>(a),
                     static_cast<const double*>(b), n, ca, cb);
    case DataType::kFloat16:
      return combine16(reduce::half_to_float_n, reduce::float_to_half_n,
                       static_cast<uint16_t*>(out), static_cast<const uint16_t*>(a),
                       static_cast<const uint16_t*>(b), n, ca, cb);
    case DataType::kBFloat16:
      return combine16(reduce::bfloat16_to_float_n, reduce::float_to_bfloat16_n,
                       static_cast<uint16_t*>(out), static_cast<const uint16_t*>(a),
                       static_cast<const uint16_t*>(b), n, ca, cb);
    default:
      throw Error(fmt::format("adasum: unsupported data type {}", dtype_name(t)));
  }
}

struct Segment {
  size_t lo = 0, hi = 0;
  size_t size() const { return hi - lo; }
};

// Sums `values` over the 2^levels ranks that share this rank's index bits from `levels` up,
// by recursive doubling. Every rank adds the lower rank's values first, so all of them end
// with the same bits.
void block_sum(Communicator& comm, std::vector<double>& values, int levels,
               std::vector<double>& scratch) {
  const size_t bytes = values.size() * sizeof(double);
  scratch.resize(values.size());
  for (int j = 0; j < levels; ++j) {
    const int peer = comm.rank() ^ (1 << j);
    comm.sendrecv(values.data(), bytes, peer, scratch.data(), bytes, peer);
    const bool lower = comm.rank() < peer;
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = lower ? values[i] + scratch[i] : scratch[i] + values[i];
  }
}

}  // namespace

std::string adasum_unsupported(DataType dtype, int set_size, int32_t process_set) {
  if (!is_floating(dtype))
    return fmt::format("Adasum supports only floating-point tensors (float16, bfloat16, float32, "
                       "float64), not {}",
                       dtype_name(dtype));
  if (!is_power_of_two(set_size))
    return fmt::format("Adasum needs a power-of-two number of ranks (process set {} has {})",
                       process_set, set_size);
  return {};
}

AdasumCoefficients adasum_coefficients(double dot, double anorm2, double bnorm2) {
  // A zero vector keeps coefficient 1: Adasum(0, b) = b. (Its dot product with anything is 0,
  // so the other coefficient is 1 too.)
  AdasumCoefficients c;
  if (anorm2 > 0) c.a = 1.0 - dot / (2.0 * anorm2);
  if (bnorm2 > 0) c.b = 1.0 - dot / (2.0 * bnorm2);
  return c;
}

void adasum_allreduce(Communicator& comm, void* data, DataType dtype,
                      const std::vector<size_t>& tensor_counts, int32_t process_set) {
  const int size = comm.size();
  if (std::string why = adasum_unsupported(dtype, size, process_set); !why.empty())
    throw Error(why);
  const size_t n = std::accumulate(tensor_counts.begin(), tensor_counts.end(), size_t{0});
  if (size == 1 || n == 0) return;

  const int rank = comm.rank();
  const size_t esize = dtype_size(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t tensors = tensor_counts.size();
  std::vector<size_t> starts(tensors + 1, 0);
  std::partial_sum(tensor_counts.begin(), tensor_counts.end(), starts.begin() + 1);

  int levels = 0;
  while ((1 << levels) < size) ++levels;
  // The larger half of the first split is the most any exchange receives.
  std::vector<uint8_t> received((n - n / 2) * esize);
  std::vector<double> sums(3 * tensors), scratch;
  std::vector<Segment> kept(levels);

  // Reduction: vector halving, distance doubling.
  Segment current{0, n};
  for (int l = 0; l < levels; ++l) {
    const int peer = rank ^ (1 << l);
    const bool lower = (rank & (1 << l)) == 0;
    const size_t mid = current.lo + current.size() / 2;
    const Segment low{current.lo, mid}, high{mid, current.hi};
    const Segment mine = lower ? low : high;
    const Segment theirs = lower ? high : low;
    comm.sendrecv(bytes + theirs.lo * esize, theirs.size() * esize, peer, received.data(),
                  mine.size() * esize, peer);

    uint8_t* own = bytes + mine.lo * esize;
    const uint8_t* a = lower ? own : received.data();  // the lower block's partial result
    const uint8_t* b = lower ? received.data() : own;
    // Tensors overlapping this rank's piece: [first, last).
    const size_t first =
        std::upper_bound(starts.begin(), starts.end(), mine.lo) - starts.begin() - 1;
    std::fill(sums.begin(), sums.end(), 0.0);
    auto for_each_overlap = [&](auto&& f) {
      for (size_t t = first; t < tensors && starts[t] < mine.hi; ++t) {
        const size_t lo = std::max(starts[t], mine.lo), hi = std::min(starts[t + 1], mine.hi);
        if (lo < hi) f(t, (lo - mine.lo) * esize, hi - lo);
      }
    };
    for_each_overlap([&](size_t t, size_t off, size_t count) {
      Partial p;
      accumulate_any(dtype, a + off, b + off, count, p);
      sums[3 * t] = p.dot;
      sums[3 * t + 1] = p.anorm2;
      sums[3 * t + 2] = p.bnorm2;
    });
    // The 2^(l+1) ranks sharing this rank's bits above l hold the whole of both vectors.
    block_sum(comm, sums, l + 1, scratch);
    for_each_overlap([&](size_t t, size_t off, size_t count) {
      const auto c = adasum_coefficients(sums[3 * t], sums[3 * t + 1], sums[3 * t + 2]);
      combine_any(dtype, own + off, a + off, b + off, count, c.a, c.b);
    });
    kept[l] = mine;
    current = mine;
  }

  // Distribution: distance halving allgather, undoing the splits in reverse.
  for (int l = levels - 1; l >= 0; --l) {
    const int peer = rank ^ (1 << l);
    const Segment parent = l == 0 ? Segment{0, n} : kept[l - 1];
    const Segment mine = kept[l];
    const bool lower = (rank & (1 << l)) == 0;
    const Segment theirs = lower ? Segment{mine.hi, parent.hi} : Segment{parent.lo, mine.lo};
    comm.sendrecv(bytes + mine.lo * esize, mine.size() * esize, peer, bytes + theirs.lo * esize,
                  theirs.size() * esize, peer);
  }
}

}  // namespace krug::collectives
