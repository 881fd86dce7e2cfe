#include "reduce/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "reduce/copy.h"
#include "reduce_reference.h"

namespace krug::reduce {
namespace {

using Bytes = std::vector<uint8_t>;
using ref::Format16;
using ref::kBFloat16;
using ref::kHalf;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// --- The scalar reference, written the obvious way. ---

// uint64 arithmetic wraps modulo 2^64; narrowing to T (C++20) then keeps the low bits.
template <typename T>
T ref_int(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    case ReduceOp::kProduct:
      return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kAdasum:  // not element-wise: no kernel
      break;
  }
  return 0;
}

template <typename F>
F ref_float(ReduceOp op, F a, F b) {
  const F nan = std::numeric_limits<F>::quiet_NaN();
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::isnan(a) || std::isnan(b) ? nan : std::min(a, b);
    case ReduceOp::kMax:
      return std::isnan(a) || std::isnan(b) ? nan : std::max(a, b);
    case ReduceOp::kAdasum:  // not element-wise: no kernel
      break;
  }
  return 0;
}

uint16_t ref_16(ReduceOp op, uint16_t a, uint16_t b, Format16 fmt) {
  const float fa = static_cast<float>(ref::ref_decode(a, fmt));
  const float fb = static_cast<float>(ref::ref_decode(b, fmt));
  return ref::ref_encode(ref_float(op, fa, fb), fmt);
}

uint8_t ref_bool(ReduceOp op, uint8_t a, uint8_t b) {
  const bool or_op = op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kMax;
  return or_op ? (a != 0 || b != 0) : (a != 0 && b != 0);
}

void ref_element(DataType dt, ReduceOp op, const uint8_t* a, const uint8_t* b, uint8_t* out) {
  switch (dt) {
    case DataType::kUInt8:
      return store(out, ref_int(op, load<uint8_t>(a), load<uint8_t>(b)));
    case DataType::kInt8:
      return store(out, ref_int(op, load<int8_t>(a), load<int8_t>(b)));
    case DataType::kInt16:
      return store(out, ref_int(op, load<int16_t>(a), load<int16_t>(b)));
    case DataType::kInt32:
      return store(out, ref_int(op, load<int32_t>(a), load<int32_t>(b)));
    case DataType::kInt64:
      return store(out, ref_int(op, load<int64_t>(a), load<int64_t>(b)));
    case DataType::kUInt16:
      return store(out, ref_int(op, load<uint16_t>(a), load<uint16_t>(b)));
    case DataType::kUInt32:
      return store(out, ref_int(op, load<uint32_t>(a), load<uint32_t>(b)));
    case DataType::kUInt64:
      return store(out, ref_int(op, load<uint64_t>(a), load<uint64_t>(b)));
    case DataType::kFloat16:
      return store(out, ref_16(op, load<uint16_t>(a), load<uint16_t>(b), kHalf));
    case DataType::kBFloat16:
      return store(out, ref_16(op, load<uint16_t>(a), load<uint16_t>(b), kBFloat16));
    case DataType::kFloat32:
      return store(out, ref_float(op, load<float>(a), load<float>(b)));
    case DataType::kFloat64:
      return store(out, ref_float(op, load<double>(a), load<double>(b)));
    case DataType::kBool:
      return store(out, ref_bool(op, a[0], b[0]));
  }
}

Bytes ref_reduce(DataType dt, ReduceOp op, const Bytes& a, const Bytes& b) {
  const size_t es = dtype_size(dt);
  Bytes out(a.size());
  for (size_t i = 0; i < a.size(); i += es) ref_element(dt, op, &a[i], &b[i], &out[i]);
  return out;
}

// Bit-exact, except that any NaN matches any NaN.
bool same_element(DataType dt, const uint8_t* x, const uint8_t* y) {
  switch (dt) {
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      const Format16 fmt = dt == DataType::kFloat16 ? kHalf : kBFloat16;
      const uint16_t u = load<uint16_t>(x), v = load<uint16_t>(y);
      return u == v || (ref::ref_is_nan(u, fmt) && ref::ref_is_nan(v, fmt));
    }
    case DataType::kFloat32:
      if (std::isnan(load<float>(x)) && std::isnan(load<float>(y))) return true;
      break;
    case DataType::kFloat64:
      if (std::isnan(load<double>(x)) && std::isnan(load<double>(y))) return true;
      break;
    default:
      break;
  }
  return std::memcmp(x, y, dtype_size(dt)) == 0;
}

// --- Test data. ---

template <typename F>
F random_float(std::mt19937_64& rng) {
  static const F kSpecial[] = {std::numeric_limits<F>::quiet_NaN(),
                               -std::numeric_limits<F>::quiet_NaN(),
                               std::numeric_limits<F>::infinity(),
                               -std::numeric_limits<F>::infinity(),
                               F(0),
                               -F(0),
                               std::numeric_limits<F>::denorm_min(),
                               std::numeric_limits<F>::max(),
                               -std::numeric_limits<F>::max(),
                               F(1e-30)};
  if (rng() % 10 == 0) return kSpecial[rng() % std::size(kSpecial)];
  return std::uniform_real_distribution<F>(-1000, 1000)(rng);
}

// Mostly ordinary values, some raw bit patterns (NaN, infinity, subnormals, overflow).
uint16_t random_16(std::mt19937_64& rng, Format16 fmt) {
  if (rng() % 4 == 0) return static_cast<uint16_t>(rng());
  return ref::ref_encode(std::uniform_real_distribution<double>(-300, 300)(rng), fmt);
}

Bytes random_data(DataType dt, size_t n, std::mt19937_64& rng) {
  const size_t es = dtype_size(dt);
  Bytes out(n * es);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = &out[i * es];
    switch (dt) {
      case DataType::kFloat16:
        store(p, random_16(rng, kHalf));
        break;
      case DataType::kBFloat16:
        store(p, random_16(rng, kBFloat16));
        break;
      case DataType::kFloat32:
        store(p, random_float<float>(rng));
        break;
      case DataType::kFloat64:
        store(p, random_float<double>(rng));
        break;
      case DataType::kBool:
        p[0] = std::array<uint8_t, 6>{0, 0, 1, 2, 0x80, 0xff}[rng() % 6];
        break;
      default: {  // integers: any bits
        const uint64_t r = rng();
        std::memcpy(p, &r, es);
        break;
      }
    }
  }
  return out;
}

// A buffer placed `offset` elements into a guarded allocation, so unaligned starts are covered
// and writes outside [0, n) are caught.
class Guarded {
 public:
  Guarded(const Bytes& contents, size_t offset_bytes)
      : offset_(offset_bytes), storage_(offset_bytes + contents.size() + 64, kFill) {
    std::copy(contents.begin(), contents.end(), storage_.begin() + offset_);
    size_ = contents.size();
  }
  uint8_t* data() { return storage_.data() + offset_; }
  Bytes contents() const {
    return Bytes(storage_.begin() + offset_, storage_.begin() + offset_ + size_);
  }
  bool guards_intact() const {
    for (size_t i = 0; i < storage_.size(); ++i) {
      if ((i < offset_ || i >= offset_ + size_) && storage_[i] != kFill) return false;
    }
    return true;
  }

 private:
  static constexpr uint8_t kFill = 0xa5;
  size_t offset_;
  size_t size_ = 0;
  Bytes storage_;
};

void expect_same(DataType dt, const Bytes& got, const Bytes& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const size_t es = dtype_size(dt);
  int bad = 0;
  for (size_t i = 0; i < got.size(); i += es) {
    if (!same_element(dt, &got[i], &want[i]) && ++bad <= 5) {
      ADD_FAILURE() << what << ": element " << i / es << " differs";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// --- Every dtype x op against the reference. ---

class ReduceKernelTest : public ::testing::TestWithParam<std::tuple<DataType, ReduceOp>> {};

TEST_P(ReduceKernelTest, MatchesScalarReference) {
  const auto [dt, op] = GetParam();
  const size_t es = dtype_size(dt);
  std::mt19937_64 rng(1000 * static_cast<int>(dt) + static_cast<int>(op));
  for (size_t n : {0u, 1u, 7u, 1000u, 4099u}) {
    for (size_t offset : {size_t{0}, es}) {
      const std::string ctx = "n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      const Bytes a = random_data(dt, n, rng);
      Bytes b = random_data(dt, n, rng);
      for (size_t i = 0; i < n; i += 13) std::memcpy(&b[i * es], &a[i * es], es);  // ties
      const Bytes want = ref_reduce(dt, op, a, b);

      Guarded into(a, offset), src(b, offset);
      reduce_into(dt, op, into.data(), src.data(), n);
      expect_same(dt, into.contents(), want, "reduce_into " + ctx);
      EXPECT_EQ(src.contents(), b) << "src modified, " << ctx;

      Guarded dst(Bytes(a.size()), offset), ga(a, offset), gb(b, offset);
      reduce(dt, op, dst.data(), ga.data(), gb.data(), n);
      expect_same(dt, dst.contents(), want, "reduce " + ctx);
      EXPECT_EQ(ga.contents(), a) << ctx;
      EXPECT_EQ(gb.contents(), b) << ctx;

      Guarded left(a, offset);
      reduce(dt, op, left.data(), left.data(), gb.data(), n);
      expect_same(dt, left.contents(), want, "reduce dst==a " + ctx);

      Guarded right(b, offset);
      reduce(dt, op, right.data(), ga.data(), right.data(), n);
      expect_same(dt, right.contents(), want, "reduce dst==b " + ctx);

      const Bytes want_self = ref_reduce(dt, op, a, a);
      Guarded self(a, offset);
      reduce_into(dt, op, self.data(), self.data(), n);
      expect_same(dt, self.contents(), want_self, "reduce_into dst==src " + ctx);

      for (Guarded* g : {&into, &src, &dst, &ga, &gb, &left, &right, &self}) {
        EXPECT_TRUE(g->guards_intact()) << "wrote outside the buffer, " << ctx;
      }
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<ReduceKernelTest::ParamType>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" +
         std::string(reduce_op_name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, ReduceKernelTest,
    ::testing::Combine(::testing::Values(DataType::kUInt8, DataType::kInt8, DataType::kInt16,
                                         DataType::kInt32, DataType::kInt64, DataType::kUInt16,
                                         DataType::kUInt32, DataType::kUInt64, DataType::kFloat16,
                                         DataType::kBFloat16, DataType::kFloat32,
                                         DataType::kFloat64, DataType::kBool),
                       ::testing::Values(ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                         ReduceOp::kMax, ReduceOp::kProduct)),
    case_name);

// --- Hand-picked cases. ---

template <typename T>
std::vector<T> run(DataType dt, ReduceOp op, std::vector<T> a, const std::vector<T>& b) {
  reduce_into(dt, op, a.data(), b.data(), a.size());
  return a;
}

// The data plane's copy takes a vector loop from 2 KiB on: every byte arrives, for any
// alignment of either side and any length around the loop's 128-byte blocks, and nothing
// outside the destination changes.
// copy() and copy_streaming(), whose vector loops start at different points (copy_streaming
// aligns the destination to 32 bytes first).
class ReduceCopy : public ::testing::TestWithParam<void (*)(void*, const void*, size_t)> {};

TEST_P(ReduceCopy, CopiesEveryLengthAndAlignmentExactly) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{127}, size_t{2047}, size_t{2048}, size_t{2049},
                       size_t{2048 + 127}, size_t{4096 + 77}, size_t{300001}}) {
    for (size_t src_off : {0, 1, 16, 33, 64}) {
      for (size_t dst_off : {0, 3, 16, 31, 48}) {
        std::vector<uint8_t> src(bytes + 128), dst(bytes + 256, 0xEE);
        for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
        GetParam()(dst.data() + dst_off, src.data() + src_off, bytes);
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xEE);
        ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, bytes), 0)
            << bytes << " bytes, offsets " << src_off << "/" << dst_off;
        for (size_t i = dst_off + bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ReduceCopy,
                         ::testing::Values(&reduce::copy, &reduce::copy_streaming),
                         [](const auto& info) { return info.index == 0 ? "copy" : "streaming"; });

// move() takes the copy loop only for ranges that do not overlap; overlapping ones (either
// direction, by less than a vector) come out as memmove's.
TEST(ReduceMove, HandlesOverlapInBothDirections) {
  for (size_t bytes : {size_t{100}, size_t{5000}, size_t{70000}}) {
    for (long shift : {-4097L, -3L, 0L, 1L, 31L, 4096L, 80000L}) {
      std::vector<uint8_t> a(bytes + 90000), b;
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7 + 1);
      b = a;
      const size_t src = 5000;
      const size_t dst = static_cast<size_t>(static_cast<long>(src) + shift);
      reduce::move(a.data() + dst, a.data() + src, bytes);
      std::memmove(b.data() + dst, b.data() + src, bytes);
      ASSERT_EQ(a, b) << bytes << " bytes, shift " << shift;
    }
  }
}

TEST(ReduceTest, FloatSumWithInfinity) {
  const auto f = run<float>(DataType::kFloat32, ReduceOp::kSum, {kInf, kInf, -kInf, 1e38f},
                            {1.0f, -kInf, -kInf, 3e38f});
  EXPECT_EQ(f[0], kInf);
  EXPECT_TRUE(std::isnan(f[1]));
  EXPECT_EQ(f[2], -kInf);
  EXPECT_EQ(f[3], kInf);  // overflow
  const auto d =
      run<double>(DataType::kFloat64, ReduceOp::kSum, {INFINITY, INFINITY}, {-1e300, -INFINITY});
  EXPECT_EQ(d[0], INFINITY);
  EXPECT_TRUE(std::isnan(d[1]));
  // float16: inf + 1, inf + -inf, and 65504 + 65504 overflowing to inf.
  const auto h = run<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {0x7c00, 0x7c00, 0x7bff},
                               {0x3c00, 0xfc00, 0x7bff});
  EXPECT_EQ(h[0], 0x7c00);
  EXPECT_TRUE(ref::ref_is_nan(h[1], kHalf));
  EXPECT_EQ(h[2], 0x7c00);
  const auto bf = run<uint16_t>(DataType::kBFloat16, ReduceOp::kSum, {0x7f80, 0x7f80, 0x7f7f},
                                {0x3f80, 0xff80, 0x7f7f});
  EXPECT_EQ(bf[0], 0x7f80);
  EXPECT_TRUE(ref::ref_is_nan(bf[1], kBFloat16));
  EXPECT_EQ(bf[2], 0x7f80);
}

TEST(ReduceTest, MinMaxPropagateNaN) {
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    const auto f = run<float>(DataType::kFloat32, op, {kNaN, 1.0f, kNaN, -kInf, 2.0f},
                              {1.0f, kNaN, kNaN, kNaN, 3.0f});
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(f[i])) << i;
    EXPECT_EQ(f[4], op == ReduceOp::kMin ? 2.0f : 3.0f);
    const auto d = run<double>(DataType::kFloat64, op, {NAN, 1.0, INFINITY}, {1.0, NAN, NAN});
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(d[i])) << i;
    const auto h =
        run<uint16_t>(DataType::kFloat16, op, {0x7e00, 0x3c00, 0xfc00}, {0x3c00, 0x7e00, 0x7e00});
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(ref::ref_is_nan(h[i], kHalf)) << i;
    const auto bf = run<uint16_t>(DataType::kBFloat16, op, {0x7fc0, 0x3f80}, {0x3f80, 0xffc0});
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(ref::ref_is_nan(bf[i], kBFloat16)) << i;
  }
}

// Ties keep the first operand, like std::min/std::max, whichever buffer dst aliases.
TEST(ReduceTest, SignedZeroTiesKeepTheFirstOperand) {
  const auto signs = [](const std::vector<float>& v) {
    return std::vector<bool>{std::signbit(v[0]), std::signbit(v[1])};
  };
  const std::vector<bool> want = {false, true};
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<float> a = {0.0f, -0.0f}, b = {-0.0f, 0.0f}, dst(2);
    reduce(DataType::kFloat32, op, dst.data(), a.data(), b.data(), 2);
    EXPECT_EQ(signs(dst), want) << "separate dst";
    reduce(DataType::kFloat32, op, b.data(), a.data(), b.data(), 2);
    EXPECT_EQ(signs(b), want) << "dst == b";
    b = {-0.0f, 0.0f};
    reduce(DataType::kFloat32, op, a.data(), a.data(), b.data(), 2);
    EXPECT_EQ(signs(a), want) << "dst == a";
  }
}

TEST(ReduceTest, IntegerArithmeticWraps) {
  EXPECT_EQ(run<int8_t>(DataType::kInt8, ReduceOp::kSum, {127}, {1})[0], -128);
  EXPECT_EQ(run<uint8_t>(DataType::kUInt8, ReduceOp::kSum, {255}, {1})[0], 0);
  EXPECT_EQ(run<int16_t>(DataType::kInt16, ReduceOp::kProduct, {-32768}, {-1})[0], -32768);
  EXPECT_EQ(run<int16_t>(DataType::kInt16, ReduceOp::kProduct, {-32768}, {-32768})[0], 0);
  EXPECT_EQ(run<int32_t>(DataType::kInt32, ReduceOp::kProduct, {65536}, {65536})[0], 0);
  EXPECT_EQ(run<int64_t>(DataType::kInt64, ReduceOp::kSum, {INT64_MAX}, {1})[0], INT64_MIN);
  EXPECT_EQ(run<int64_t>(DataType::kInt64, ReduceOp::kProduct, {INT64_MIN}, {-1})[0], INT64_MIN);
  // 65535 * 65535 overflows the int that uint16 would promote to; it wraps to 1 instead.
  EXPECT_EQ(run<uint16_t>(DataType::kUInt16, ReduceOp::kProduct, {65535}, {65535})[0], 1);
  EXPECT_EQ(run<uint32_t>(DataType::kUInt32, ReduceOp::kSum, {UINT32_MAX}, {2})[0], 1u);
  EXPECT_EQ(run<uint64_t>(DataType::kUInt64, ReduceOp::kSum, {UINT64_MAX}, {1})[0], 0u);
  EXPECT_EQ(run<int8_t>(DataType::kInt8, ReduceOp::kMin, {-128}, {127})[0], -128);
  EXPECT_EQ(run<uint8_t>(DataType::kUInt8, ReduceOp::kMax, {200}, {100})[0], 200);
}

TEST(ReduceTest, BoolTreatsNonzeroAsTrueAndWritesZeroOrOne) {
  const std::vector<uint8_t> a = {0, 0, 2, 0x80, 0xff};
  const std::vector<uint8_t> b = {0, 3, 0, 0x40, 1};
  EXPECT_EQ(run(DataType::kBool, ReduceOp::kSum, a, b), (std::vector<uint8_t>{0, 1, 1, 1, 1}));
  EXPECT_EQ(run(DataType::kBool, ReduceOp::kMax, a, b), (std::vector<uint8_t>{0, 1, 1, 1, 1}));
  EXPECT_EQ(run(DataType::kBool, ReduceOp::kMin, a, b), (std::vector<uint8_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(run(DataType::kBool, ReduceOp::kProduct, a, b), (std::vector<uint8_t>{0, 0, 0, 1, 1}));
}

TEST(ReduceTest, Float16RoundsEachResult) {
  // 2048 + 1 is a tie in float16 (ulp 2 there): rounds to even 2048, not 2050.
  const auto h =
      run<uint16_t>(DataType::kFloat16, ReduceOp::kSum, {0x6800, 0x6801}, {0x3c00, 0x3c00});
  EXPECT_EQ(h[0], 0x6800);
  EXPECT_EQ(h[1], 0x6802);  // 2050 + 1 = 2051: tie, rounds to even 2052
}

TEST(ReduceTest, RejectsUnknownTypeAndOp) {
  uint8_t x[4] = {}, y[4] = {};
  EXPECT_THROW(reduce_into(static_cast<DataType>(42), ReduceOp::kSum, x, y, 1), Error);
  EXPECT_THROW(reduce_into(DataType::kFloat32, static_cast<ReduceOp>(42), x, y, 1), Error);
  EXPECT_THROW(reduce_into(DataType::kBool, static_cast<ReduceOp>(42), x, y, 1), Error);
}

}  // namespace
}  // namespace krug::reduce
