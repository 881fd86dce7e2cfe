// A rank of a multi-process test: `krugrun -np N krug_test_worker <scenario>`.
//
// Uses only the public API (krug/krug.h). Every scenario computes the value each rank must see
// from a closed-form rule (inputs are small integers, exactly representable in every dtype,
// float16 and bfloat16 included), checks it, and prints one line per wrong element (rank,
// operation, tensor, element, expected, got). Exit status: 0 when everything held, 1 when a
// check failed, 2 for a usage error. The last line of a passing rank is "rank R: <scenario> OK".
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "krug/krug.h"
#include "worker_checks.h"

namespace {

using krug::DataType;
using krug::ReduceOp;
using krug::Shape;
using Clock = std::chrono::steady_clock;

constexpr DataType kAllTypes[] = {
    DataType::kUInt8,   DataType::kInt8,    DataType::kInt16,   DataType::kInt32,
    DataType::kInt64,   DataType::kUInt16,  DataType::kUInt32,  DataType::kUInt64,
    DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
    DataType::kBool};

using krug_test::g_failures;
using krug_test::g_rank;
using krug_test::report;
using krug_test::who;

[[noreturn]] void die(const std::string& message) {
  std::cerr << who() << ": FAIL: " << message << std::endl;
  std::exit(1);
}

void expect(bool ok, const std::string& message) {
  if (!ok) report(message);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string str(DataType t) { return std::string(krug::dtype_name(t)); }
std::string str(ReduceOp op) { return std::string(krug::reduce_op_name(op)); }
std::string str(const Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}
template <typename T>
std::string str(const std::vector<T>& v) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  o << "]";
  return o.str();
}

int64_t elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

bool is_signed(DataType t) {
  return t != DataType::kUInt8 && t != DataType::kUInt16 && t != DataType::kUInt32 &&
         t != DataType::kUInt64 && t != DataType::kBool;
}

// ---- float16 / bfloat16 bit patterns, computed here so the test does not trust the library's
// own conversions. Only exactly representable values are accepted.

uint16_t half_bits(double v) {
  if (v == 0) return std::signbit(v) ? 0x8000 : 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  int exp = 0;
  double frac = std::frexp(std::fabs(v), &exp);  // |v| = frac * 2^exp, frac in [0.5, 1)
  int e = exp - 1;                               // |v| = (2 frac) * 2^e, 2 frac in [1, 2)
  double mant = (2 * frac - 1) * 1024;
  if (e < -14 || e > 15 || mant != std::floor(mant))
    die("test bug: " + std::to_string(v) + " is not an exact normal float16");
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | static_cast<int>(mant));
}

double half_value(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  int m = h & 0x3ff;
  double sign = (h & 0x8000) ? -1 : 1;
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31) return m ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + m, e - 25);
}

uint16_t bf16_bits(double v) {
  float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (static_cast<double>(f) != v || (u & 0xffff) != 0)
    die("test bug: " + std::to_string(v) + " is not an exact bfloat16");
  return static_cast<uint16_t>(u >> 16);
}

double bf16_value(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A tensor of any dtype, read and written as doubles.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DataType t, Shape shape)
      : type_(t), shape_(std::move(shape)),
        bytes_(static_cast<size_t>(elements(shape_)) * krug::dtype_size(t)) {}
  // Wraps a result returned by the library.
  Tensor(DataType t, Shape shape, const std::vector<uint8_t>& bytes)
      : type_(t), shape_(std::move(shape)), bytes_(bytes) {}

  DataType type() const { return type_; }
  const Shape& shape() const { return shape_; }
  int64_t size() const { return static_cast<int64_t>(bytes_.size() / krug::dtype_size(type_)); }
  void* data() { return bytes_.empty() ? nullptr : bytes_.data(); }
  const void* data() const { return bytes_.empty() ? nullptr : bytes_.data(); }

  void set(int64_t i, double v) {
    uint8_t* p = bytes_.data() + i * krug::dtype_size(type_);
    switch (type_) {
      case DataType::kUInt8: *p = static_cast<uint8_t>(v); break;
      case DataType::kInt8: store<int8_t>(p, v); break;
      case DataType::kInt16: store<int16_t>(p, v); break;
      case DataType::kInt32: store<int32_t>(p, v); break;
      case DataType::kInt64: store<int64_t>(p, v); break;
      case DataType::kUInt16: store<uint16_t>(p, v); break;
      case DataType::kUInt32: store<uint32_t>(p, v); break;
      case DataType::kUInt64: store<uint64_t>(p, v); break;
      case DataType::kFloat16: store<uint16_t>(p, half_bits(v)); break;
      case DataType::kBFloat16: store<uint16_t>(p, bf16_bits(v)); break;
      case DataType::kFloat32: store<float>(p, v); break;
      case DataType::kFloat64: store<double>(p, v); break;
      case DataType::kBool: *p = v != 0 ? 1 : 0; break;
    }
  }
  double get(int64_t i) const {
    const uint8_t* p = bytes_.data() + i * krug::dtype_size(type_);
    switch (type_) {
      case DataType::kUInt8: return *p;
      case DataType::kInt8: return load<int8_t>(p);
      case DataType::kInt16: return load<int16_t>(p);
      case DataType::kInt32: return load<int32_t>(p);
      case DataType::kInt64: return static_cast<double>(load<int64_t>(p));
      case DataType::kUInt16: return load<uint16_t>(p);
      case DataType::kUInt32: return load<uint32_t>(p);
      case DataType::kUInt64: return static_cast<double>(load<uint64_t>(p));
      case DataType::kFloat16: return half_value(load<uint16_t>(p));
      case DataType::kBFloat16: return bf16_value(load<uint16_t>(p));
      case DataType::kFloat32: return load<float>(p);
      case DataType::kFloat64: return load<double>(p);
      case DataType::kBool: return *p;  // raw byte: a bool must come back as 0 or 1
    }
    return NAN;
  }
  void fill(const std::function<double(int64_t)>& f) {
    for (int64_t i = 0; i < size(); ++i) set(i, f(i));
  }

 private:
  template <typename T, typename V>
  static void store(uint8_t* p, V v) {
    T t = static_cast<T>(v);
    std::memcpy(p, &t, sizeof(T));
  }
  template <typename T>
  static T load(const uint8_t* p) {
    T t;
    std::memcpy(&t, p, sizeof(T));
    return t;
  }

  DataType type_ = DataType::kFloat32;
  Shape shape_;
  std::vector<uint8_t> bytes_;
};

// Compares every element; `what` names the operation and tensor in the message.
void check_values(const std::string& what, const Tensor& got,
                  const std::function<double(int64_t)>& want) {
  int shown = 0;
  for (int64_t i = 0; i < got.size(); ++i) {
    double g = got.get(i), w = want(i);
    if (g == w) continue;
    std::ostringstream o;
    o << what << " (" << str(got.type()) << ", shape " << str(got.shape()) << ") element " << i
      << ": expected " << w << ", got " << g;
    report(o.str());
    if (++shown == 3) {  // a few per tensor are enough to see the pattern
      report(what + ": more wrong elements not shown");
      return;
    }
  }
}

void check_shape(const std::string& what, const Shape& got, const Shape& want) {
  expect(got == want, what + ": expected output shape " + str(want) + ", got " + str(got));
}

// Runs `f`, which must throw krug::Error; returns its message ("" and a failure if it did not).
std::string expect_error(const std::string& what, const std::function<void()>& f) {
  try {
    f();
  } catch (const krug::Error& e) {
    return e.what();
  }
  report(what + ": expected a krug::Error, but the operation succeeded");
  return {};
}

// ---- Inputs with known reductions.

// Input of element i on rank r for a reduction `op` over `n` ranks. Values are small integers
// so sums, products and averages are exact in every dtype (average: the sum is a multiple of n).
double reduce_input(ReduceOp op, DataType t, int64_t i, int r) {
  const bool sgn = is_signed(t);
  if (t == DataType::kBool) return (i + r) % 3 == 0 ? 1 : 0;
  switch (op) {
    case ReduceOp::kSum: return static_cast<double>(i % 7 + r - (sgn ? 3 : 0));
    case ReduceOp::kAverage: return static_cast<double>(i % 5 + 2 * r - (sgn ? 2 : 0));
    case ReduceOp::kMin:
    case ReduceOp::kMax: return static_cast<double>((i * 5 + r * 3) % 9 - (sgn ? 4 : 0));
    case ReduceOp::kProduct: {
      static const double kSigned[] = {1, 2, -1};
      static const double kUnsigned[] = {1, 2};
      return sgn ? kSigned[(i + r) % 3] : kUnsigned[(i + r) % 2];
    }
    case ReduceOp::kAdasum:  // not element-wise: scenario_adasum has its own inputs
      break;
  }
  return 0;
}

// The reduction of reduce_input over ranks `ranks`, computed in double (exact here).
// Bool: sum/average/max are OR, min/product are AND; scale factors leave bools unchanged.
double reduce_expected(ReduceOp op, DataType t, int64_t i, const std::vector<int>& ranks,
                       double pre = 1, double post = 1) {
  double acc = 0;
  bool first = true;
  for (int r : ranks) {
    double v = reduce_input(op, t, i, r) * (t == DataType::kBool ? 1 : pre);
    if (first) {
      acc = v;
      first = false;
      continue;
    }
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc = t == DataType::kBool ? std::max(acc, v) : acc + v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kProduct: acc = t == DataType::kBool ? std::min(acc, v) : acc * v; break;
      case ReduceOp::kAdasum: break;  // not element-wise; never requested here
    }
  }
  if (t == DataType::kBool) return acc;
  if (op == ReduceOp::kAverage) acc /= static_cast<double>(ranks.size());
  return acc * post;
}

std::vector<int> range_ranks(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Small per-(rank, row, column) values that fit int8 and are exact in float16.
double cell(DataType t, int64_t a, int64_t b, int64_t c) {
  int64_t v = (a * 17 + b * 5 + c) % 100;
  if (t == DataType::kBool) return v % 2;
  return static_cast<double>(is_signed(t) ? v - 50 : v);
}

// ---- Scenarios.

struct PendingCheck {
  std::string what;
  krug::Handle handle;
  std::function<void()> check;  // after a successful wait
};

void wait_all(std::vector<PendingCheck>& pending) {
  for (auto& p : pending) {
    try {
      p.handle.wait();
    } catch (const krug::Error& e) {
      report(p.what + ": unexpected error: " + e.what());
      continue;
    }
    p.check();
  }
  pending.clear();
}

struct ReduceCase {
  ReduceOp op;
  double pre, post;
  const char* label;
};

const std::vector<Shape> kReduceShapes = {{0}, {3, 0}, {}, {1}, {7}, {7, 11, 13}};

void ops_allreduce(int n) {
  const ReduceCase cases[] = {
      {ReduceOp::kSum, 1, 1, "sum"},           {ReduceOp::kAverage, 1, 1, "average"},
      {ReduceOp::kMin, 1, 1, "min"},           {ReduceOp::kMax, 1, 1, "max"},
      {ReduceOp::kProduct, 1, 1, "product"},   {ReduceOp::kSum, 2, 3, "sum_scaled"},
      {ReduceOp::kAverage, 1, 2, "average_postscaled"}};
  auto all = range_ranks(n);
  // Everything at once (fusion and ordering get exercised), then checked.
  std::deque<Tensor> inputs, outputs;  // stable addresses: checks hold pointers into them
  std::vector<PendingCheck> pending;
  for (const auto& c : cases)
    for (DataType t : kAllTypes)
      for (size_t s = 0; s < kReduceShapes.size(); ++s) {
        const Shape& shape = kReduceShapes[s];
        std::string name = std::string("allreduce.") + c.label + "." + str(t) + "." +
                           std::to_string(s);
        inputs.emplace_back(t, shape);
        inputs.back().fill([&](int64_t i) { return reduce_input(c.op, t, i, g_rank); });
        // Alternate in-place and out-of-place.
        const bool in_place = s % 2 == 0;
        Tensor* in = &inputs.back();
        Tensor* out = in;
        if (!in_place) {
          outputs.emplace_back(t, shape);
          out = &outputs.back();
        }
        krug::ReduceOptions o;
        o.op = c.op;
        o.prescale_factor = c.pre;
        o.postscale_factor = c.post;
        auto h = krug::allreduce_async(name, in->data(), out->data(), t, shape, o);
        pending.push_back({name, h, [=, &all] {
                             check_values(name, *out, [&](int64_t i) {
                               return reduce_expected(c.op, t, i, all, c.pre, c.post);
                             });
                           }});
      }
  wait_all(pending);
  // One at a time too: a lone tensor takes the engine's unfused path (reduced in place in the
  // user's buffer), which the burst above mostly does not.
  for (const auto& c : cases)
    for (DataType t : kAllTypes) {
      const Shape shape{7, 11};
      Tensor in(t, shape), out(t, shape);
      in.fill([&](int64_t i) { return reduce_input(c.op, t, i, g_rank); });
      krug::ReduceOptions o;
      o.op = c.op;
      o.prescale_factor = c.pre;
      o.postscale_factor = c.post;
      std::string name = std::string("allreduce.sync.") + c.label + "." + str(t);
      try {
        krug::allreduce(name, in.data(), out.data(), t, shape, o);
      } catch (const krug::Error& e) {
        report(name + ": unexpected error: " + e.what());
        continue;
      }
      check_values(name, out, [&](int64_t i) {
        return reduce_expected(c.op, t, i, all, c.pre, c.post);
      });
    }
}

void ops_allgather(int n) {
  // Variant 0: rank r has r + 1 rows of 3. Variant 1: rows = (r % 2) * 5, one dimension: some
  // ranks contribute nothing. Variant 2: nobody contributes.
  std::vector<std::function<int64_t(int)>> rows_of = {
      [](int r) { return r + 1; }, [](int r) { return (r % 2) * 5; }, [](int) { return 0; }};
  std::vector<Shape> rest = {{3}, {}, {2}};
  std::deque<Tensor> inputs;  // stable addresses: checks hold pointers into it
  std::vector<PendingCheck> pending;
  for (size_t v = 0; v < rows_of.size(); ++v)
    for (DataType t : kAllTypes) {
      Shape shape{rows_of[v](g_rank)};
      shape.insert(shape.end(), rest[v].begin(), rest[v].end());
      const int64_t row = elements(rest[v]);
      inputs.emplace_back(t, shape);
      inputs.back().fill([&](int64_t i) { return cell(t, g_rank, i / row, i % row); });
      std::string name = "allgather." + std::to_string(v) + "." + str(t);
      auto h = krug::allgather_async(name, inputs.back().data(), t, shape);
      pending.push_back({name, h, [=] {
                           int64_t total = 0;
                           std::vector<std::pair<int, int64_t>> owner;  // (rank, row in it)
                           for (int r = 0; r < n; ++r)
                             for (int64_t k = 0; k < rows_of[v](r); ++k, ++total)
                               owner.push_back({r, k});
                           Shape want{total};
                           want.insert(want.end(), rest[v].begin(), rest[v].end());
                           check_shape(name, h.output_shape(), want);
                           Tensor got(t, h.output_shape(), h.output());
                           if (got.size() != total * row) {
                             report(name + ": expected " + std::to_string(total * row) +
                                    " elements, got " + std::to_string(got.size()));
                             return;
                           }
                           check_values(name, got, [&](int64_t i) {
                             auto [r, k] = owner[i / row];
                             return cell(t, r, k, i % row);
                           });
                         }});
    }
  wait_all(pending);
}

void ops_broadcast(int n) {
  std::deque<Tensor> data;  // stable addresses: checks hold pointers into it
  std::vector<PendingCheck> pending;
  const std::vector<Shape> shapes = {{0}, {7}, {7, 11, 13}};
  for (int root = 0; root < n; ++root)
    for (DataType t : kAllTypes)
      for (size_t s = 0; s < shapes.size(); ++s) {
        data.emplace_back(t, shapes[s]);
        Tensor* d = &data.back();
        // Non-roots hold different values that must be overwritten.
        d->fill([&](int64_t i) { return cell(t, g_rank + 7, i, 1); });
        std::string name = "broadcast.root" + std::to_string(root) + "." + str(t) + "." +
                           std::to_string(s);
        auto h = krug::broadcast_async(name, d->data(), t, shapes[s], root);
        pending.push_back({name, h, [=] {
                             check_values(name + " from root " + std::to_string(root), *d,
                                          [&](int64_t i) { return cell(t, root + 7, i, 1); });
                           }});
      }
  wait_all(pending);
}

void ops_alltoall(int n) {
  std::deque<Tensor> inputs;  // stable addresses: checks hold pointers into it
  std::vector<PendingCheck> pending;
  // Uneven: rank r sends (r + p) % 3 rows of 2 to rank p (zero rows to some ranks); row k of
  // what r sends to p holds cell(r * 8 + p, k, col).
  auto split = [](int from, int to) { return static_cast<int64_t>((from + to) % 3); };
  for (DataType t : kAllTypes) {
    std::vector<int64_t> splits;
    int64_t rows = 0;
    for (int p = 0; p < n; ++p) {
      splits.push_back(split(g_rank, p));
      rows += splits.back();
    }
    Shape shape{rows, 2};
    inputs.emplace_back(t, shape);
    Tensor& in = inputs.back();
    int64_t row = 0;
    for (int p = 0; p < n; ++p)
      for (int64_t k = 0; k < splits[p]; ++k, ++row)
        for (int c = 0; c < 2; ++c) in.set(row * 2 + c, cell(t, g_rank * 8 + p, k, c));
    std::string name = "alltoall.uneven." + str(t);
    auto h = krug::alltoall_async(name, in.data(), t, shape, splits);
    pending.push_back({name, h, [=] {
                         std::vector<int64_t> want_splits;
                         std::vector<double> want;
                         for (int p = 0; p < n; ++p) {
                           want_splits.push_back(split(p, g_rank));
                           for (int64_t k = 0; k < want_splits.back(); ++k)
                             for (int c = 0; c < 2; ++c)
                               want.push_back(cell(t, p * 8 + g_rank, k, c));
                         }
                         expect(h.received_splits() == want_splits,
                                name + ": expected received splits " + str(want_splits) +
                                    ", got " + str(h.received_splits()));
                         check_shape(name, h.output_shape(),
                                     {static_cast<int64_t>(want.size() / 2), 2});
                         Tensor got(t, h.output_shape(), h.output());
                         if (got.size() != static_cast<int64_t>(want.size())) {
                           report(name + ": expected " + std::to_string(want.size()) +
                                  " elements, got " + std::to_string(got.size()));
                           return;
                         }
                         check_values(name, got, [&](int64_t i) { return want[i]; });
                       }});
  }
  // Even split (no splits given): 2 rows to every rank, 1-D.
  for (DataType t : {DataType::kFloat32, DataType::kInt64, DataType::kFloat16}) {
    Shape shape{2 * n};
    inputs.emplace_back(t, shape);
    inputs.back().fill([&](int64_t i) { return cell(t, g_rank, i / 2, i % 2); });
    std::string name = "alltoall.even." + str(t);
    auto h = krug::alltoall_async(name, inputs.back().data(), t, shape);
    pending.push_back({name, h, [=] {
                         check_shape(name, h.output_shape(), {2 * n});
                         expect(h.received_splits() == std::vector<int64_t>(n, 2),
                                name + ": expected received splits of 2, got " +
                                    str(h.received_splits()));
                         Tensor got(t, h.output_shape(), h.output());
                         if (got.size() != 2 * n) return report(name + ": wrong size");
                         // From rank p: p's rows 2 me, 2 me + 1.
                         check_values(name, got, [&](int64_t i) {
                           int p = static_cast<int>(i / 2);
                           int64_t k = 2 * g_rank + i % 2;
                           return cell(t, p, k / 2, k % 2);
                         });
                       }});
  }
  wait_all(pending);
}

void ops_reducescatter(int n) {
  auto all = range_ranks(n);
  std::deque<Tensor> inputs;  // stable addresses: checks hold pointers into it
  std::vector<PendingCheck> pending;
  // Row counts: uneven (2n + 1), fewer rows than ranks (1), and none.
  const std::vector<int64_t> row_counts = {2 * n + 1, 1, 0};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax})
    for (DataType t : kAllTypes)
      for (int64_t rows : row_counts) {
        Shape shape{rows, 3};
        inputs.emplace_back(t, shape);
        inputs.back().fill([&](int64_t i) { return reduce_input(op, t, i, g_rank); });
        std::string name = "reducescatter." + str(op) + "." + str(t) + "." + std::to_string(rows);
        krug::ReduceOptions o;
        o.op = op;
        auto h = krug::reducescatter_async(name, inputs.back().data(), t, shape, o);
        pending.push_back({name, h, [=, &all] {
                             int64_t start = 0;
                             for (int r = 0; r < g_rank; ++r)
                               start += rows / n + (r < rows % n ? 1 : 0);
                             int64_t mine = rows / n + (g_rank < rows % n ? 1 : 0);
                             check_shape(name, h.output_shape(), {mine, 3});
                             Tensor got(t, {mine, 3}, h.output());
                             if (got.size() != mine * 3) {
                               report(name + ": expected " + std::to_string(mine * 3) +
                                      " elements, got " + std::to_string(got.size()));
                               return;
                             }
                             check_values(name, got, [&](int64_t i) {
                               return reduce_expected(op, t, start * 3 + i, all);
                             });
                           }});
      }
  wait_all(pending);
}

void ops_grouped(int n) {
  auto all = range_ranks(n);
  // A group of one dtype (fusable) and one of mixed dtypes and sizes, zero-size included.
  std::vector<std::vector<std::pair<DataType, Shape>>> groups = {
      {{DataType::kFloat32, {1}}, {DataType::kFloat32, {7}}, {DataType::kFloat32, {1001}}},
      {{DataType::kInt32, {7}}, {DataType::kFloat64, {0}}, {DataType::kBFloat16, {1001}},
       {DataType::kUInt8, {3, 3}}}};
  std::vector<std::vector<Tensor>> tensors(groups.size());
  std::vector<PendingCheck> pending;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<krug::GroupTensor> members;
    tensors[g].reserve(groups[g].size());
    for (const auto& [t, shape] : groups[g]) {
      tensors[g].emplace_back(t, shape);
      DataType tt = t;
      tensors[g].back().fill([&](int64_t i) { return reduce_input(ReduceOp::kSum, tt, i, g_rank); });
      members.push_back({tensors[g].back().data(), tensors[g].back().data(), t, shape});
    }
    std::string name = "grouped." + std::to_string(g);
    krug::ReduceOptions o;
    o.op = ReduceOp::kSum;
    auto h = krug::grouped_allreduce_async(name, members, o);
    pending.push_back({name, h, [=, &tensors, &all] {
                         for (size_t k = 0; k < tensors[g].size(); ++k) {
                           const Tensor& got = tensors[g][k];
                           check_values(name + "." + std::to_string(k), got, [&](int64_t i) {
                             return reduce_expected(ReduceOp::kSum, got.type(), i, all);
                           });
                         }
                       }});
  }
  wait_all(pending);
}

// Results that only negotiation sizes, written where the caller's allocator says: twice into the
// same buffers (the second time without growing them), with Handle::output() left empty.
void ops_output_allocator(int n) {
  std::vector<float> buffer;
  Shape asked;
  int calls = 0;
  auto into_buffer = [&](const Shape& shape) -> void* {
    asked = shape;
    ++calls;
    buffer.resize(static_cast<size_t>(elements(shape)));
    return buffer.data();
  };
  for (int round = 0; round < 2; ++round) {
    const std::string tag = " (round " + std::to_string(round) + ")";
    const float* before = buffer.data();
    // allgather: rank r gives r + 1 rows of 3, each row's cells 10 r + row.
    std::vector<float> in(static_cast<size_t>(3 * (g_rank + 1)));
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(10 * g_rank + i / 3);
    auto h = krug::allgather_async("alloc.allgather", in.data(), DataType::kFloat32,
                                   {g_rank + 1, 3}, krug::kGlobalProcessSet, into_buffer);
    h.wait();
    std::vector<float> want;
    for (int r = 0; r < n; ++r)
      for (int row = 0; row <= r; ++row)
        for (int c = 0; c < 3; ++c) want.push_back(static_cast<float>(10 * r + row));
    check_shape("allgather into the caller's memory" + tag, h.output_shape(),
                {n * (n + 1) / 2, 3});
    expect(asked == h.output_shape(), "allgather's allocator was asked for " + str(asked));
    expect(h.output().empty(), "allgather with an allocator also filled Handle::output()");
    expect(buffer == want, "allgather into the caller's memory" + tag + ": expected " +
                               str(want) + ", got " + str(buffer));
    if (round == 1) expect(buffer.data() == before, "the allgather buffer moved" + tag);
    // alltoall, even: row j goes to rank j with value 100 r + j.
    std::vector<float> rows(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) rows[j] = static_cast<float>(100 * g_rank + j);
    std::vector<float> all_to_all;
    auto a = krug::alltoall_async("alloc.alltoall", rows.data(), DataType::kFloat32, {n}, {},
                                  krug::kGlobalProcessSet, [&](const Shape& shape) -> void* {
                                    all_to_all.resize(static_cast<size_t>(elements(shape)));
                                    return all_to_all.data();
                                  });
    a.wait();
    std::vector<float> from_each(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) from_each[r] = static_cast<float>(100 * r + g_rank);
    expect(all_to_all == from_each && a.output().empty(),
           "alltoall into the caller's memory" + tag + ": expected " + str(from_each) +
               ", got " + str(all_to_all));
    // reducescatter, sum: n rows of 2 of r + 1 leave each rank one row of n (n + 1) / 2.
    std::vector<float> ones(static_cast<size_t>(2 * n), static_cast<float>(g_rank + 1));
    std::vector<float> mine;
    krug::ReduceOptions sum;
    sum.op = ReduceOp::kSum;
    auto s = krug::reducescatter_async("alloc.reducescatter", ones.data(), DataType::kFloat32,
                                       {n, 2}, sum, [&](const Shape& shape) -> void* {
                                         mine.resize(static_cast<size_t>(elements(shape)));
                                         return mine.data();
                                       });
    s.wait();
    const std::vector<float> total(2, static_cast<float>(n * (n + 1) / 2));
    expect(mine == total && s.output().empty(), "reducescatter into the caller's memory" + tag +
                                                    ": expected " + str(total) + ", got " +
                                                    str(mine));
  }
  expect(calls == 2, "the allgather allocator ran " + std::to_string(calls) + " times, not 2");
}

// Synchronous broadcasts and allgathers of sizes that the direct lane makes in its decision
// line, in its slots, read in place (from 32 KiB of result, where the ranks may read each
// other's memory) and not at all, from every root in turn. 60000 rows of 12 bytes are more than
// any rank's share of KRUG_DIRECT_LANE_BYTES's default 1 MiB, so on the board only a broadcast
// takes them (it may fill every rank's room); read in place, both do, up to 8 MiB of result;
// 800000 rows are beyond both. Then an allgather whose shapes differ between the ranks.
void sync_broadcasts_and_allgathers(int n) {
  for (int64_t rows : {1, 50, 6000, 60000, 800000}) {
    const std::string tag = " of " + std::to_string(rows) + " rows";
    for (int root = 0; root < n; ++root) {
      std::vector<int32_t> data(static_cast<size_t>(rows) * 3, g_rank == root ? root + 7 : -1);
      krug::broadcast("sync.broadcast." + std::to_string(rows) + "." + std::to_string(root),
                      data.data(), DataType::kInt32, {rows, 3}, root);
      expect(data == std::vector<int32_t>(data.size(), root + 7),
             "sync broadcast" + tag + " from rank " + std::to_string(root) + ": got " +
                 std::to_string(data[0]) + " ...");
    }
    std::vector<float> in(static_cast<size_t>(rows) * 3), out(in.size() * n, -1.0f), want;
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(g_rank * 100000 + i);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < in.size(); ++i) want.push_back(static_cast<float>(r * 100000 + i));
    krug::allgather("sync.allgather." + std::to_string(rows), in.data(), out.data(),
                    DataType::kFloat32, {rows, 3});
    expect(out == want, "sync allgather" + tag + ": the rows are not every rank's in order");
  }
  // Rank n - 1 gives 3 rows, the others 2: every rank takes part, and none has the shape its
  // output was for (2n + 1 rows gathered, 2n or 3n expected).
  if (n == 1) return;
  const int64_t rows = g_rank == n - 1 ? 3 : 2;
  std::vector<float> in(static_cast<size_t>(rows) * 4, 1.0f), out(in.size() * n);
  const std::string msg = expect_error("a synchronous allgather of differing shapes", [&] {
    krug::allgather("sync.allgather.differ", in.data(), out.data(), DataType::kFloat32, {rows, 4});
  });
  expect(msg.empty() || contains(msg, "shapes differ"), "allgather of differing shapes: " + msg);
}

void scenario_ops() {
  const int n = krug::size();
  ops_allreduce(n);
  ops_allgather(n);
  ops_broadcast(n);
  ops_alltoall(n);
  ops_reducescatter(n);
  ops_grouped(n);
  ops_output_allocator(n);
  for (int i = 0; i < 3; ++i) krug::barrier();
  // Synchronous calls too.
  float x = static_cast<float>(g_rank + 1);
  krug::ReduceOptions o;
  o.op = ReduceOp::kSum;
  krug::allreduce("sync.sum", &x, &x, DataType::kFloat32, {1}, o);
  expect(x == n * (n + 1) / 2.0f,
         "sync allreduce: expected " + std::to_string(n * (n + 1) / 2) + ", got " +
             std::to_string(x));
  double y = g_rank == n - 1 ? 42.5 : -1;
  krug::broadcast("sync.broadcast", &y, DataType::kFloat64, {}, n - 1);
  expect(y == 42.5, "sync broadcast: expected 42.5, got " + std::to_string(y));
  sync_broadcasts_and_allgathers(n);
}

void scenario_inflight() {
  const int n = krug::size();
  auto all = range_ranks(n);
  constexpr int kOps = 1000;
  std::vector<Tensor> tensors;
  tensors.reserve(kOps);
  std::vector<krug::Handle> handles;
  for (int k = 0; k < kOps; ++k) {
    // Sizes 0..~2000, all different order of magnitude mixes; a few dtypes so fusion splits.
    const int64_t count = (k * 7919) % 2003;
    DataType t = k % 3 == 0 ? DataType::kInt32 : (k % 3 == 1 ? DataType::kFloat32 : DataType::kFloat64);
    tensors.emplace_back(t, Shape{count});
    tensors.back().fill([&](int64_t i) { return reduce_input(ReduceOp::kSum, t, i + k, g_rank); });
    krug::ReduceOptions o;
    o.op = ReduceOp::kSum;
    handles.push_back(krug::allreduce_async("inflight." + std::to_string(k), tensors.back().data(),
                                            tensors.back().data(), t, {count}, o));
  }
  for (int k = 0; k < kOps; ++k) {
    std::string name = "inflight." + std::to_string(k);
    try {
      handles[k].wait();
    } catch (const krug::Error& e) {
      report(name + ": unexpected error: " + e.what());
      continue;
    }
    check_values(name, tensors[k], [&](int64_t i) {
      return reduce_expected(ReduceOp::kSum, tensors[k].type(), i + k, all);
    });
  }
}

void scenario_process_sets() {
  const int n = krug::size();
  if (n < 2) die("process_sets needs at least 2 ranks");
  std::vector<int> evens, odds;
  for (int r = 0; r < n; ++r) (r % 2 ? odds : evens).push_back(r);
  // Every rank adds both sets (collective over all ranks); odds given in descending order.
  krug::ProcessSet even_set = krug::add_process_set(evens);
  krug::ProcessSet odd_set = krug::add_process_set(std::vector<int>(odds.rbegin(), odds.rend()));
  expect(even_set.id != 0 && odd_set.id != 0 && even_set.id != odd_set.id,
         "add_process_set: expected two distinct non-global ids, got " +
             std::to_string(even_set.id) + " and " + std::to_string(odd_set.id));
  expect(krug::process_set_ranks(even_set) == evens,
         "process_set_ranks(evens): expected " + str(evens) + ", got " +
             str(krug::process_set_ranks(even_set)));
  expect(krug::process_set_ranks(odd_set) == odds,
         "process_set_ranks(odds): expected " + str(odds) + ", got " +
             str(krug::process_set_ranks(odd_set)));
  const bool even = g_rank % 2 == 0;
  const krug::ProcessSet mine = even ? even_set : odd_set;
  const krug::ProcessSet other = even ? odd_set : even_set;
  const std::vector<int>& members = even ? evens : odds;
  const int index = static_cast<int>(std::find(members.begin(), members.end(), g_rank) -
                                     members.begin());
  const std::string label = even ? "evens" : "odds";

  // allreduce: sum and average of (rank + 1) over the set; both sets use the same names.
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    std::vector<double> v(5, g_rank + 1.0);
    krug::ReduceOptions o;
    o.op = op;
    o.process_set = mine;
    krug::allreduce("ps.allreduce." + str(op), v.data(), v.data(), DataType::kFloat64, {5}, o);
    double want = 0;
    for (int r : members) want += r + 1;
    if (op == ReduceOp::kAverage) want /= members.size();
    for (double x : v)
      expect(x == want, "allreduce " + str(op) + " in " + label + ": expected " +
                            std::to_string(want) + ", got " + std::to_string(x));
  }
  // allgather: index + 1 rows of the global rank.
  {
    std::vector<int32_t> in(index + 1, g_rank);
    auto h = krug::allgather_async("ps.allgather", in.data(), DataType::kInt32,
                                   {static_cast<int64_t>(in.size())}, mine);
    h.wait();
    std::vector<int32_t> want;
    for (size_t i = 0; i < members.size(); ++i)
      for (size_t k = 0; k <= i; ++k) want.push_back(members[i]);
    std::vector<int32_t> got(h.output().size() / 4);
    std::memcpy(got.data(), h.output().data(), got.size() * 4);
    expect(got == want, "allgather in " + label + ": expected " + str(want) + ", got " + str(got));
  }
  // broadcast from every index of the set.
  for (size_t root = 0; root < members.size(); ++root) {
    int64_t v = g_rank * 1000;
    krug::broadcast("ps.broadcast." + std::to_string(root), &v, DataType::kInt64, {1},
                    static_cast<int>(root), mine);
    expect(v == members[root] * 1000,
           "broadcast in " + label + " from index " + std::to_string(root) + ": expected " +
               std::to_string(members[root] * 1000) + ", got " + std::to_string(v));
  }
  // An op on a set this rank is not in fails on this rank.
  {
    float x = 1;
    krug::ReduceOptions o;
    o.process_set = other;
    std::string msg = expect_error("allreduce on a set without this rank", [&] {
      krug::allreduce("ps.not_member", &x, &x, DataType::kFloat32, {1}, o);
    });
    if (!msg.empty()) std::cout << who() << ": not-a-member error: " << msg << std::endl;
  }
  krug::barrier();
  krug::remove_process_set(even_set);
  krug::remove_process_set(odd_set);
  {
    float x = 1;
    krug::ReduceOptions o;
    o.process_set = mine;
    std::string msg = expect_error("allreduce on a removed set", [&] {
      krug::allreduce("ps.removed", &x, &x, DataType::kFloat32, {1}, o);
    });
    expect(msg.empty() || contains(msg, std::to_string(mine.id)),
           "removed-set error should name process set " + std::to_string(mine.id) + ": " + msg);
    if (!msg.empty()) std::cout << who() << ": removed-set error: " << msg << std::endl;
    expect_error("process_set_ranks of a removed set", [&] { krug::process_set_ranks(mine); });
  }
  // The global set still works.
  int32_t one = 1;
  krug::ReduceOptions o;
  o.op = ReduceOp::kSum;
  krug::allreduce("ps.after", &one, &one, DataType::kInt32, {1}, o);
  expect(one == n, "global allreduce after removing sets: expected " + std::to_string(n) +
                       ", got " + std::to_string(one));
}

void scenario_join() {
  const int n = krug::size();
  // Rank r has r + 1 batches. Batch b: ranks b..n-1 contribute (r + 1) * (b + 1); joined ranks
  // contribute zeros.
  for (int b = 0; b <= g_rank; ++b) {
    std::vector<float> f(7, static_cast<float>((g_rank + 1) * (b + 1)));
    std::vector<int32_t> i(1001, (g_rank + 1) * (b + 1));
    krug::ReduceOptions o;
    o.op = ReduceOp::kSum;
    auto hf = krug::allreduce_async("join.batch" + std::to_string(b) + ".f", f.data(), f.data(),
                                    DataType::kFloat32, {7}, o);
    auto hi = krug::allreduce_async("join.batch" + std::to_string(b) + ".i", i.data(), i.data(),
                                    DataType::kInt32, {1001}, o);
    try {
      hf.wait();
      hi.wait();
    } catch (const krug::Error& e) {
      report("batch " + std::to_string(b) + ": unexpected error: " + e.what());
      continue;
    }
    int64_t want = 0;
    for (int r = b; r < n; ++r) want += (r + 1) * (b + 1);
    for (float x : f)
      if (x != static_cast<float>(want)) {
        report("join batch " + std::to_string(b) + " (float32): expected " +
               std::to_string(want) + ", got " + std::to_string(x));
        break;
      }
    for (int32_t x : i)
      if (x != want) {
        report("join batch " + std::to_string(b) + " (int32): expected " + std::to_string(want) +
               ", got " + std::to_string(x));
        break;
      }
  }
  int last = krug::join();
  std::cout << who() << ": join() returned " << last << std::endl;
  expect(last == n - 1, "join(): expected the last joined rank " + std::to_string(n - 1) +
                            ", got " + std::to_string(last));
  // Everyone is back: a normal allreduce works.
  int32_t one = 1;
  krug::ReduceOptions o;
  o.op = ReduceOp::kSum;
  krug::allreduce("join.after", &one, &one, DataType::kInt32, {1}, o);
  expect(one == n, "allreduce after join: expected " + std::to_string(n) + ", got " +
                       std::to_string(one));
}

// One rank (the last) disagrees with the others on `what`; every rank must get an error naming
// the tensor and the disagreeing ranks, then a correct allreduce must work.
void scenario_mismatch(const std::string& what) {
  const int n = krug::size();
  if (n < 2) die("mismatch scenarios need at least 2 ranks");
  const bool odd_one = g_rank == n - 1;
  const std::string odd = "rank " + std::to_string(n - 1) + ":";
  std::vector<std::pair<std::string, std::function<void()>>> attempts;  // (tensor name, op)
  std::vector<double> buf(64, 1.0);
  void* p = buf.data();
  krug::ReduceOptions sum;
  sum.op = ReduceOp::kSum;
  if (what == "dtype") {
    attempts.push_back({"mm.dtype", [&] {
                          krug::allreduce("mm.dtype", p, p,
                                          odd_one ? DataType::kInt32 : DataType::kFloat32, {7}, sum);
                        }});
  } else if (what == "shape") {
    attempts.push_back({"mm.shape", [&] {
                          krug::allreduce("mm.shape", p, p, DataType::kFloat32,
                                          odd_one ? Shape{8} : Shape{7}, sum);
                        }});
    attempts.push_back({"mm.shape2d", [&] {
                          krug::allreduce("mm.shape2d", p, p, DataType::kFloat32,
                                          odd_one ? Shape{3, 2} : Shape{2, 3}, sum);
                        }});
    // allgather: the first dimension may differ, the others may not.
    attempts.push_back({"mm.allgather", [&] {
                          krug::allgather_async("mm.allgather", p, DataType::kFloat32,
                                                odd_one ? Shape{2, 4} : Shape{2, 3})
                              .wait();
                        }});
  } else if (what == "op") {
    attempts.push_back({"mm.reduce_op", [&] {
                          krug::ReduceOptions o;
                          o.op = odd_one ? ReduceOp::kMax : ReduceOp::kSum;
                          krug::allreduce("mm.reduce_op", p, p, DataType::kFloat32, {7}, o);
                        }});
    attempts.push_back({"mm.op", [&] {
                          if (odd_one)
                            krug::broadcast("mm.op", p, DataType::kFloat32, {7}, 0);
                          else
                            krug::allreduce("mm.op", p, p, DataType::kFloat32, {7}, sum);
                        }});
  } else if (what == "root") {
    attempts.push_back({"mm.root", [&] {
                          krug::broadcast("mm.root", p, DataType::kFloat32, {7}, odd_one ? 1 : 0);
                        }});
  } else {
    die("unknown mismatch kind " + what);
  }
  for (auto& [name, run] : attempts) {
    std::string msg = expect_error("mismatched " + what + " of '" + name + "'", run);
    if (msg.empty()) continue;
    std::cout << who() << ": error for '" << name << "': " << msg << std::endl;
    expect(contains(msg, "'" + name + "'"), "error should name the tensor '" + name + "': " + msg);
    expect(contains(msg, odd), "error should name the disagreeing " + odd + " " + msg);
  }
  // The job goes on.
  for (int k = 0; k < 2; ++k) {
    int32_t x = g_rank + 1;
    krug::allreduce("mm.after" + std::to_string(k), &x, &x, DataType::kInt32, {1}, sum);
    expect(x == n * (n + 1) / 2, "allreduce after the mismatch: expected " +
                                     std::to_string(n * (n + 1) / 2) + ", got " +
                                     std::to_string(x));
  }
}

void scenario_duplicate_name() {
  const int n = krug::size();
  if (n < 2) die("duplicate_name needs at least 2 ranks");
  // Rank 0's name "dup.a" cannot complete before the others submit it, which they do only after
  // the gate below; the others' "dup.b" waits for rank 0 the same way. So each rank's second
  // submission happens while its first is certainly in flight.
  krug::ReduceOptions sum;
  sum.op = ReduceOp::kSum;
  int32_t a = g_rank + 1, b = g_rank + 1;
  const std::string own = g_rank == 0 ? "dup.a" : "dup.b";
  int32_t* own_buf = g_rank == 0 ? &a : &b;
  auto first = krug::allreduce_async(own, own_buf, own_buf, DataType::kInt32, {1}, sum);
  int32_t spare = 0;
  auto second = krug::allreduce_async(own, &spare, &spare, DataType::kInt32, {1}, sum);
  std::string msg = expect_error("second submission of '" + own + "'", [&] { second.wait(); });
  if (!msg.empty()) {
    std::cout << who() << ": duplicate error: " << msg << std::endl;
    expect(contains(msg, own), "duplicate error should name '" + own + "': " + msg);
  }
  expect(!first.poll() || first.error().empty(),
         "the first '" + own + "' must not be failed by the duplicate: " +
             (first.poll() ? first.error() : ""));
  krug::barrier();  // the gate
  const std::string theirs = g_rank == 0 ? "dup.b" : "dup.a";
  int32_t* their_buf = g_rank == 0 ? &b : &a;
  auto late = krug::allreduce_async(theirs, their_buf, their_buf, DataType::kInt32, {1}, sum);
  try {
    first.wait();
    late.wait();
  } catch (const krug::Error& e) {
    report(std::string("first submissions must succeed: ") + e.what());
    return;
  }
  const int32_t want = n * (n + 1) / 2;
  expect(a == want && b == want, "dup sums: expected " + std::to_string(want) + ", got " +
                                     std::to_string(a) + " and " + std::to_string(b));
  // The names are free again once completed (every rank reuses both, in the same order).
  for (const std::string name : {"dup.a", "dup.b"}) {
    int32_t again = 1;
    krug::allreduce(name, &again, &again, DataType::kInt32, {1}, sum);
    expect(again == n, "reusing '" + name + "' after completion: expected " + std::to_string(n) +
                           ", got " + std::to_string(again));
  }
}

// `victim` SIGKILLs itself after a first allreduce; the others must get an error naming it.
void scenario_killed_rank(int victim_from_end) {
  const int n = krug::size();
  if (n < 2) die("killed_rank needs at least 2 ranks");
  const int victim = victim_from_end < 0 ? n + victim_from_end : victim_from_end;
  // krugrun SIGTERMs the survivors as soon as it sees the dead rank; they ignore it so they can
  // report the error krug gives them (krugrun SIGKILLs them after its grace period anyway).
  ::signal(SIGTERM, SIG_IGN);
  krug::ReduceOptions sum;
  sum.op = ReduceOp::kSum;
  int32_t x = 1;
  krug::allreduce("killed.first", &x, &x, DataType::kInt32, {1}, sum);
  expect(x == n, "first allreduce: expected " + std::to_string(n) + ", got " + std::to_string(x));
  if (g_rank == victim) {
    std::cout << who() << ": killing myself" << std::endl;
    ::raise(SIGKILL);
  }
  const auto start = Clock::now();
  int32_t y = 1;
  std::string msg = expect_error("allreduce with a dead rank", [&] {
    krug::allreduce("killed.second", &y, &y, DataType::kInt32, {1}, sum);
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::cout << who() << ": error after " << seconds << " s: " << msg << std::endl;
  expect(seconds < 30, "the error took " + std::to_string(seconds) + " s (limit 30 s)");
  expect(contains(msg, "rank " + std::to_string(victim)),
         "the error should name the dead rank " + std::to_string(victim) + ": " + msg);
  // Later operations fail at once with the same cause.
  std::string later = expect_error("allreduce after the failure", [&] {
    krug::allreduce("killed.third", &y, &y, DataType::kInt32, {1}, sum);
  });
  expect(later.empty() || contains(later, "rank " + std::to_string(victim)),
         "later errors should keep the root cause: " + later);
}

void scenario_stall() {
  const int n = krug::size();
  if (n < 2) die("stall needs at least 2 ranks");
  // Rank 0 waits on a name the others never submit; they wait on one rank 0 never submits.
  const std::string name = g_rank == 0 ? "stall.only_rank0" : "stall.only_others";
  float x = 1;
  krug::ReduceOptions sum;
  sum.op = ReduceOp::kSum;
  const auto start = Clock::now();
  std::string msg = expect_error("stalled allreduce '" + name + "'", [&] {
    krug::allreduce(name, &x, &x, DataType::kFloat32, {1}, sum);
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::cout << who() << ": stall error after " << seconds << " s: " << msg << std::endl;
  std::vector<int> others;
  for (int r = 1; r < n; ++r) others.push_back(r);
  std::string missing = "for ranks " + str(others);
  expect(contains(msg, "stall.only_rank0"), "stall error should name 'stall.only_rank0': " + msg);
  expect(contains(msg, missing), "stall error should say it waits " + missing + ": " + msg);
  expect(seconds < 20, "stall error took " + std::to_string(seconds) + " s");
}

void scenario_timeline() {
  krug::ReduceOptions sum;
  sum.op = ReduceOp::kSum;
  for (int k = 0; k < 3; ++k) {
    std::vector<float> v(100 + k, 1.0f);
    krug::allreduce("timeline.t" + std::to_string(k), v.data(), v.data(), DataType::kFloat32,
                    {static_cast<int64_t>(v.size())}, sum);
    expect(v[0] == krug::size(), "timeline allreduce: wrong sum " + std::to_string(v[0]));
  }
  krug::barrier();
}

void scenario_reinit() {
  krug::ReduceOptions sum;
  sum.op = ReduceOp::kSum;
  for (int round = 0; round < 2; ++round) {
    if (round > 0) {
      expect(!krug::is_initialized(), "is_initialized() after shutdown()");
      krug::init();
    }
    const int n = krug::size();
    int32_t x = g_rank + 1 + round;
    krug::allreduce("reinit.x", &x, &x, DataType::kInt32, {1}, sum);
    const int32_t want = n * (n + 1) / 2 + n * round;
    expect(x == want, "round " + std::to_string(round) + ": expected " + std::to_string(want) +
                          ", got " + std::to_string(x));
    krug::barrier();
    krug::shutdown();
  }
  expect_error("an op after shutdown()", [] {
    float y = 0;
    krug::allreduce("reinit.after", &y, &y, DataType::kFloat32, {1});
  });
}

// Where this rank sits, as init() found it: every test job runs on one host, so the local
// rank is the rank and there is one "cross" group per local rank, of one host.
void scenario_topology() {
  const int n = krug::size();
  expect(krug::local_rank() == g_rank, "local_rank() " + std::to_string(krug::local_rank()));
  expect(krug::local_size() == n, "local_size() " + std::to_string(krug::local_size()));
  expect(krug::cross_rank() == 0, "cross_rank() " + std::to_string(krug::cross_rank()));
  expect(krug::cross_size() == 1, "cross_size() " + std::to_string(krug::cross_size()));
  // Every set of a one-host job exchanges through shared memory, so the job starts no TCP
  // transport: only this thread and the engine's run (Gloo's event loop would wake the core
  // every 10 ms).
  if (std::string(krug::cpu_operations()) == "shm") {
    int threads = 0;
    if (DIR* dir = ::opendir("/proc/self/task")) {
      while (const dirent* e = ::readdir(dir)) threads += e->d_name[0] != '.';
      ::closedir(dir);
    }
    expect(threads == 2, "threads of a shared-memory job: " + std::to_string(threads) +
                             " (this one and the engine's expected)");
  }
}

// Full-mantissa float32 values with exponents from 2^-3 to 2^3, so that sums round.
float determinism_input(int r, int64_t i) {
  const uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(r + 1) * 40503u;
  return std::ldexp(1.0f + static_cast<float>(h % 1000003u) / 1000003.0f,
                    static_cast<int>((i + r) % 7) - 3) * ((h >> 7) % 2 ? 1.0f : -1.0f);
}

// The determinism contract end to end: a float32 tensor is summed alone, then fused behind
// padding of several lengths (so it lands at other offsets of the fusion buffer and is cut
// into other chunks); every result must be bitwise the sum in rank order, x0 + x1 + ... .
void scenario_determinism() {
  const int n = krug::size();
  const int64_t m = 1001;
  std::vector<float> want(m);
  for (int64_t i = 0; i < m; ++i) {
    float acc = determinism_input(0, i);
    for (int r = 1; r < n; ++r) acc += determinism_input(r, i);
    want[i] = acc;
  }
  auto input = [&] {
    std::vector<float> x(m);
    for (int64_t i = 0; i < m; ++i) x[i] = determinism_input(g_rank, i);
    return x;
  };
  auto check = [&](const std::vector<float>& got, const std::string& how) {
    int wrong = 0;
    for (int64_t i = 0; i < m; ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && ++wrong <= 3) {
        std::ostringstream o;
        o << how << ": element " << i << ": expected " << std::hexfloat << want[i] << ", got "
          << got[i];
        report(o.str());
      }
  };
  krug::ReduceOptions sum;
  sum.op = ReduceOp::kSum;
  std::vector<float> x = input();
  krug::allreduce("determinism.alone", x.data(), x.data(), DataType::kFloat32, {m}, sum);
  check(x, "alone");
  for (int64_t pad : {1, 333, 4097}) {
    std::vector<float> padding(pad, 0.5f), padded(pad);
    x = input();
    std::vector<krug::GroupTensor> group = {
        {padding.data(), padded.data(), DataType::kFloat32, {pad}},
        {x.data(), x.data(), DataType::kFloat32, {m}}};
    krug::grouped_allreduce_async("determinism.behind" + std::to_string(pad), group, sum).wait();
    check(x, "fused behind " + std::to_string(pad) + " elements");
  }
}

// Adasum through the public API. Inputs follow a closed form that tests/python/
// adasum_reference.py repeats (multiples of 1/16, exact in every float dtype):
//   x[r][t][i] = ((7 i + 13 t) % 17 - 8) / 8 + ((i (r + 3) + t) % 11 - 5) / 16
// Every result is printed as "ADASUM <dtype> <tensor> <count> <values...>" (%.17g) for the
// NumPy reference to check; float32 tensors 0..3 go as one group (fused, per-tensor Adasum).
// With a size that is not a power of two, every rank must get the clear error instead.
double adasum_input(int r, int t, int64_t i) {
  return double((7 * i + 13 * t) % 17 - 8) / 8.0 + double((i * (r + 3) + t) % 11 - 5) / 16.0;
}

void print_adasum(const std::string& dtype, int t, const std::vector<double>& v) {
  std::ostringstream o;
  o.precision(17);
  o << "ADASUM " << dtype << " " << t << " " << v.size();
  for (double x : v) o << " " << x;
  std::cout << o.str() << std::endl;
}

void scenario_adasum() {
  const int n = krug::size(), r = krug::rank();
  krug::ReduceOptions opts;
  opts.op = ReduceOp::kAdasum;
  if ((n & (n - 1)) != 0) {
    std::vector<float> x(4, 1.0f);
    try {
      krug::allreduce("adasum.bad", x.data(), x.data(), DataType::kFloat32, {4}, opts);
      report("adasum with " + std::to_string(n) + " ranks did not fail");
    } catch (const krug::Error& e) {
      const std::string want = "Adasum needs a power-of-two number of ranks (process set 0 has " +
                               std::to_string(n) + ")";
      expect(contains(e.what(), want), std::string("error lacks '") + want + "': " + e.what());
      std::cout << "ADASUM-ERROR " << e.what() << std::endl;
    }
    return;
  }
  const std::vector<int64_t> counts = {5, 1000, 1, 77};
  std::vector<std::vector<float>> f32(counts.size());
  std::vector<krug::GroupTensor> group;
  for (size_t t = 0; t < counts.size(); ++t) {
    for (int64_t i = 0; i < counts[t]; ++i) f32[t].push_back(float(adasum_input(r, int(t), i)));
    group.push_back({f32[t].data(), f32[t].data(), DataType::kFloat32, {counts[t]}});
  }
  krug::grouped_allreduce_async("adasum.f32", group, opts).wait();
  for (size_t t = 0; t < counts.size(); ++t)
    print_adasum("float32", int(t), std::vector<double>(f32[t].begin(), f32[t].end()));

  const int64_t m = 300;
  std::vector<double> f64(m);
  std::vector<uint16_t> f16(m), bf16(m);
  for (int64_t i = 0; i < m; ++i) {
    const double x = adasum_input(r, 4, i);
    f64[i] = x;
    f16[i] = half_bits(x);
    bf16[i] = bf16_bits(x);
  }
  krug::allreduce("adasum.f64", f64.data(), f64.data(), DataType::kFloat64, {m}, opts);
  krug::allreduce("adasum.f16", f16.data(), f16.data(), DataType::kFloat16, {m}, opts);
  krug::allreduce("adasum.bf16", bf16.data(), bf16.data(), DataType::kBFloat16, {m}, opts);
  print_adasum("float64", 4, f64);
  std::vector<double> h(m), b(m);
  for (int64_t i = 0; i < m; ++i) h[i] = half_value(f16[i]), b[i] = bf16_value(bf16[i]);
  print_adasum("float16", 4, h);
  print_adasum("bfloat16", 4, b);
}

}  // namespace

// Shared memory: rank 0 leaves a segment under the job's prefix (as a rank that died between
// creating and unlinking one would), so the harness can check krugrun removes it; the segments
// the engine made are unlinked already. "finish" returns after a few steps; "loop" allreduces
// until the job is killed (at most 120 s) and reports its pid for the harness.
void scenario_shm_leftover(bool loop) {
  const char* job = std::getenv("KRUG_JOB_ID");
  if (!job) die("shm_leftover needs KRUG_JOB_ID (run it under krugrun)");
  if (g_rank == 0) {
    const std::string name = std::string("/krug-") + job + "-leftover-by-test";
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0) die("shm_open " + name + " failed");
    ::close(fd);
  }
  krug::barrier();
  std::cout << who() << ": pid " << ::getpid() << " leftover ready" << std::endl;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(loop ? 120 : 0);
  int steps = 0;
  do {
    std::vector<float> x(1 << 16, 1.0f);
    krug::allreduce("shm_leftover.step", x.data(), x.data(), krug::DataType::kFloat32,
                    {static_cast<int64_t>(x.size())});
    ++steps;
  } while (std::chrono::steady_clock::now() < until || steps < 3);
}

// The job secret must not show in any process's command line (/proc/*/cmdline is world-readable
// on Linux): every rank scans all of them while the job runs. The secret goes to
// $KRUG_TEST_SECRET_FILE.<rank>, so the harness can look for it in the logs and the timeline.
void scenario_secret() {
  const char* secret = std::getenv("KRUG_SECRET");
  if (!secret || std::strlen(secret) < 16) die("secret: KRUG_SECRET is missing or short");
  if (const char* file = std::getenv("KRUG_TEST_SECRET_FILE")) {
    std::ofstream(std::string(file) + "." + std::to_string(g_rank)) << secret;
  }
  krug::barrier();  // every rank, launcher and wrapper is up
  DIR* proc = ::opendir("/proc");
  if (!proc) die("secret: cannot read /proc");
  while (const dirent* e = ::readdir(proc)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    expect(cmdline.find(secret) == std::string::npos,
           std::string("the secret is in the command line of pid ") + e->d_name + ": " +
               cmdline.substr(0, cmdline.find('\0')));
  }
  ::closedir(proc);
  scenario_timeline();
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: krug_test_worker <scenario>" << std::endl;
    return 2;
  }
  const std::string scenario = argv[1];
  const std::map<std::string, std::function<void()>> scenarios = {
      {"ops", scenario_ops},
      {"inflight", scenario_inflight},
      {"process_sets", scenario_process_sets},
      {"join", scenario_join},
      {"mismatch_dtype", [] { scenario_mismatch("dtype"); }},
      {"mismatch_shape", [] { scenario_mismatch("shape"); }},
      {"mismatch_op", [] { scenario_mismatch("op"); }},
      {"mismatch_root", [] { scenario_mismatch("root"); }},
      {"duplicate_name", scenario_duplicate_name},
      {"killed_rank", [] { scenario_killed_rank(-1); }},
      {"killed_coordinator", [] { scenario_killed_rank(0); }},
      {"stall", scenario_stall},
      {"timeline", scenario_timeline},
      {"secret", scenario_secret},
      {"reinit", scenario_reinit},
      {"adasum", scenario_adasum},
      {"topology", scenario_topology},
      {"determinism", scenario_determinism},
      {"shm_leftover_finish", [] { scenario_shm_leftover(false); }},
      {"shm_leftover_loop", [] { scenario_shm_leftover(true); }},
  };
  auto it = scenarios.find(scenario);
  if (it == scenarios.end()) {
    std::cerr << "krug_test_worker: unknown scenario '" << scenario << "'" << std::endl;
    return 2;
  }
  try {
    krug::init();
    g_rank = krug::rank();
    // The harness checks the backend it asked for is the one that ran.
    std::cout << who() << ": data plane " << krug::cpu_operations() << std::endl;
    it->second();
    if (krug::is_initialized()) {
      // Everybody finishes before anybody shuts down (a shutdown ends the job for all ranks),
      // except in scenarios whose job already failed on purpose.
      if (scenario != "killed_rank" && scenario != "killed_coordinator" && scenario != "stall") krug::barrier();
      krug::shutdown();
    }
  } catch (const krug::Error& e) {
    die(scenario + ": unexpected krug::Error: " + e.what());
  }
  if (g_failures > 0) {
    std::cerr << who() << ": " << scenario << " FAILED (" << g_failures << " failed checks)"
              << std::endl;
    return 1;
  }
  std::cout << who() << ": " << scenario << " OK" << std::endl;
  return 0;
}
