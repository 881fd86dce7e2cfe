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

bool is_power_of_two(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}

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

// Calls f(fa, fb, m, i) for each block of at most kBlock elements from i, with fa and fb the
// block of `a` and of `b` widened to float32.
template <typename F>
void in_float_blocks(ToFloat widen, const uint16_t* a, const uint16_t* b, size_t n, F&& f) {
  alignas(64) float fa[kBlock];
  alignas(64) float fb[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    widen(a + i, fa, m);
    widen(b + i, fb, m);
    f(fa, fb, m, i);
  }
}

void accumulate16(ToFloat widen, const uint16_t* a, const uint16_t* b, size_t n, Partial& p) {
  in_float_blocks(widen, a, b, n, [&](const float* fa, const float* fb, size_t m, size_t) {
    accumulate(fa, fb, m, p);
  });
}

void combine16(ToFloat widen, FromFloat narrow, uint16_t* out, const uint16_t* a, const uint16_t* b,
               size_t n, double ca, double cb) {
  in_float_blocks(widen, a, b, n, [&](float* fa, const float* fb, size_t m, size_t i) {
    combine(fa, fa, fb, m, ca, cb);
    narrow(fa, out + i, m);
  });
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
    return fmt::format(
        "Adasum supports only floating-point tensors (float16, bfloat16, float32, "
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

namespace {

// One adasum_allreduce: the fused buffer of several tensors, where each starts in it, and the
// scratch the exchanges reuse. Vector halving with distance doubling reduces, then distance
// halving gathers the reduced pieces back.
class AdasumReduction {
 public:
  AdasumReduction(Communicator& comm, void* data, DataType dtype,
                  const std::vector<size_t>& tensor_counts)
      : comm_(comm),
        bytes_(static_cast<uint8_t*>(data)),
        dtype_(dtype),
        esize_(dtype_size(dtype)),
        starts_(tensor_counts.size() + 1, 0),
        sums_(3 * tensor_counts.size()) {
    std::partial_sum(tensor_counts.begin(), tensor_counts.end(), starts_.begin() + 1);
    while ((1 << levels_) < comm.size()) ++levels_;
    // The larger half of the first split is the most any exchange receives.
    received_.resize((total() - total() / 2) * esize_);
    kept_.resize(levels_);
  }

  void run() {
    Segment current{0, total()};
    for (int l = 0; l < levels_; ++l) current = kept_[l] = reduce_level(l, current);
    for (int l = levels_ - 1; l >= 0; --l) distribute_level(l);
  }

 private:
  size_t total() const { return starts_.back(); }
  size_t tensors() const { return starts_.size() - 1; }

  // Swaps halves of `current` with the peer at distance 2^level and keeps this rank's half,
  // combined: Adasum of the lower block's partial result (a) and the upper block's (b).
  Segment reduce_level(int level, Segment current) {
    const int peer = comm_.rank() ^ (1 << level);
    const bool lower = (comm_.rank() & (1 << level)) == 0;
    const size_t mid = current.lo + current.size() / 2;
    const Segment low{current.lo, mid}, high{mid, current.hi};
    const Segment mine = lower ? low : high;
    const Segment theirs = lower ? high : low;
    comm_.sendrecv(bytes_ + theirs.lo * esize_, theirs.size() * esize_, peer, received_.data(),
                   mine.size() * esize_, peer);
    uint8_t* own = bytes_ + mine.lo * esize_;
    const uint8_t* a = lower ? own : received_.data();
    const uint8_t* b = lower ? received_.data() : own;
    std::fill(sums_.begin(), sums_.end(), 0.0);
    for_each_overlap(mine, [&](size_t t, size_t off, size_t count) {
      Partial p;
      accumulate_any(dtype_, a + off, b + off, count, p);
      sums_[3 * t] = p.dot;
      sums_[3 * t + 1] = p.anorm2;
      sums_[3 * t + 2] = p.bnorm2;
    });
    // The 2^(level+1) ranks sharing this rank's bits above `level` hold both vectors whole.
    block_sum(comm_, sums_, level + 1, scratch_);
    for_each_overlap(mine, [&](size_t t, size_t off, size_t count) {
      const auto c = adasum_coefficients(sums_[3 * t], sums_[3 * t + 1], sums_[3 * t + 2]);
      combine_any(dtype_, own + off, a + off, b + off, count, c.a, c.b);
    });
    return mine;
  }

  // Undoes the split of reduce_level(level): each side sends its reduced half to the other.
  void distribute_level(int level) {
    const int peer = comm_.rank() ^ (1 << level);
    const Segment parent = level == 0 ? Segment{0, total()} : kept_[level - 1];
    const Segment mine = kept_[level];
    const bool lower = (comm_.rank() & (1 << level)) == 0;
    const Segment theirs = lower ? Segment{mine.hi, parent.hi} : Segment{parent.lo, mine.lo};
    comm_.sendrecv(bytes_ + mine.lo * esize_, mine.size() * esize_, peer,
                   bytes_ + theirs.lo * esize_, theirs.size() * esize_, peer);
  }

  // f(tensor, byte offset into `piece`, element count) for each tensor overlapping `piece`.
  template <typename F>
  void for_each_overlap(Segment piece, F&& f) const {
    const size_t first =
        std::upper_bound(starts_.begin(), starts_.end(), piece.lo) - starts_.begin() - 1;
    for (size_t t = first; t < tensors() && starts_[t] < piece.hi; ++t) {
      const size_t lo = std::max(starts_[t], piece.lo), hi = std::min(starts_[t + 1], piece.hi);
      if (lo < hi) f(t, (lo - piece.lo) * esize_, hi - lo);
    }
  }

  Communicator& comm_;
  uint8_t* bytes_;
  DataType dtype_;
  size_t esize_;
  std::vector<size_t> starts_;  // element offset of each tensor, then the total
  int levels_ = 0;
  std::vector<uint8_t> received_;
  std::vector<double> sums_, scratch_;  // per tensor: a.b, |a|^2, |b|^2
  std::vector<Segment> kept_;           // this rank's piece after each level
};

}  // namespace

void adasum_allreduce(Communicator& comm, void* data, DataType dtype,
                      const std::vector<size_t>& tensor_counts, int32_t process_set) {
  if (std::string why = adasum_unsupported(dtype, comm.size(), process_set); !why.empty())
    throw Error(why);
  const size_t n = std::accumulate(tensor_counts.begin(), tensor_counts.end(), size_t{0});
  if (comm.size() == 1 || n == 0) return;
  AdasumReduction(comm, data, dtype, tensor_counts).run();
}

}  // namespace krug::collectives
