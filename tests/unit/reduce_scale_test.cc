#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reduce/reduce.h"
#include "reduce_reference.h"

namespace krug::reduce {
namespace {

template <typename T>
std::vector<T> scaled(DataType dt, std::vector<T> v, double factor) {
  scale(dt, v.data(), v.size(), factor);
  return v;
}

// Reference for integers: long double holds every int64 exactly, so the clamp is plain.
template <typename T>
T ref_scale_int(T v, double factor) {
  const double x = static_cast<double>(v) * factor;
  if (std::isnan(x)) return 0;
  const long double r = std::truncl(static_cast<long double>(x));
  if (r < static_cast<long double>(std::numeric_limits<T>::min()))
    return std::numeric_limits<T>::min();
  if (r > static_cast<long double>(std::numeric_limits<T>::max()))
    return std::numeric_limits<T>::max();
  return static_cast<T>(r);
}

TEST(ReduceScaleTest, TruncatesIntegersTowardZero) {
  EXPECT_EQ(scaled<int32_t>(DataType::kInt32, {1, 2, 3, -3, 5, -5, 7, -1}, 0.5),
            (std::vector<int32_t>{0, 1, 1, -1, 2, -2, 3, 0}));
  EXPECT_EQ(scaled<int16_t>(DataType::kInt16, {10, -10, 11, -11}, 1.0 / 3),
            (std::vector<int16_t>{3, -3, 3, -3}));
  EXPECT_EQ(scaled<int64_t>(DataType::kInt64, {(int64_t{1} << 53) + 1, 7}, 0.25),
            (std::vector<int64_t>{int64_t{1} << 51, 1}));
  EXPECT_EQ(scaled<uint8_t>(DataType::kUInt8, {3, 9, 255}, 0.5), (std::vector<uint8_t>{1, 4, 127}));
  // 0.1 * 30 is 3.0000000000000004 in double: 3, not 2 (the product is not rounded down first).
  EXPECT_EQ(scaled<int32_t>(DataType::kInt32, {30, -30}, 0.1), (std::vector<int32_t>{3, -3}));
}

TEST(ReduceScaleTest, SaturatesIntegers) {
  EXPECT_EQ(scaled<int8_t>(DataType::kInt8, {100, -100, 3}, 2.0),
            (std::vector<int8_t>{127, -128, 6}));
  EXPECT_EQ(scaled<uint8_t>(DataType::kUInt8, {200, 3}, 2.0), (std::vector<uint8_t>{255, 6}));
  EXPECT_EQ(scaled<uint8_t>(DataType::kUInt8, {200, 0}, -1.0), (std::vector<uint8_t>{0, 0}));
  EXPECT_EQ(scaled<int16_t>(DataType::kInt16, {100, -100}, 1000.0),
            (std::vector<int16_t>{32767, -32768}));
  EXPECT_EQ(scaled<int32_t>(DataType::kInt32, {INT32_MAX, INT32_MIN}, 2.0),
            (std::vector<int32_t>{INT32_MAX, INT32_MIN}));
  // 2^62 * 2 == 2^63 is one past INT64_MAX; -2^62 * 2 == INT64_MIN exactly.
  EXPECT_EQ(
      scaled<int64_t>(DataType::kInt64, {int64_t{1} << 62, -(int64_t{1} << 62), INT64_MAX}, 2.0),
      (std::vector<int64_t>{INT64_MAX, INT64_MIN, INT64_MAX}));
  // 2^63 * 2 == 2^64 is one past UINT64_MAX; an Average of unsigned values never goes below 0.
  EXPECT_EQ(scaled<uint64_t>(DataType::kUInt64, {uint64_t{1} << 63, UINT64_MAX, 5}, 2.0),
            (std::vector<uint64_t>{UINT64_MAX, UINT64_MAX, 10}));
  EXPECT_EQ(scaled<uint32_t>(DataType::kUInt32, {UINT32_MAX, 7}, -0.5),
            (std::vector<uint32_t>{0, 0}));
  EXPECT_EQ(scaled<int32_t>(DataType::kInt32, {5, -5, 0}, INFINITY),
            (std::vector<int32_t>{INT32_MAX, INT32_MIN, 0}));  // 0 * inf is NaN -> 0
  EXPECT_EQ(scaled<int32_t>(DataType::kInt32, {5, -5}, NAN), (std::vector<int32_t>{0, 0}));
}

TEST(ReduceScaleTest, FactorOneIsANoOp) {
  // Through double, INT64_MAX - 1 would become 2^63 and saturate to INT64_MAX.
  EXPECT_EQ(scaled<int64_t>(DataType::kInt64, {INT64_MAX - 1}, 1.0)[0], INT64_MAX - 1);
  const float payload_nan = std::bit_cast<float>(0x7fc01234u);
  EXPECT_EQ(std::bit_cast<uint32_t>(scaled<float>(DataType::kFloat32, {payload_nan}, 1.0)[0]),
            0x7fc01234u);
  EXPECT_EQ(scaled<uint16_t>(DataType::kFloat16, {0x7c01}, 1.0)[0], 0x7c01);  // signalling NaN
}

TEST(ReduceScaleTest, BoolIsUnchanged) {
  EXPECT_EQ(scaled<uint8_t>(DataType::kBool, {0, 1, 2}, 0.0), (std::vector<uint8_t>{0, 1, 2}));
}

TEST(ReduceScaleTest, ScalesFloatsExactly) {
  EXPECT_EQ(scaled<float>(DataType::kFloat32, {3.0f, -1.5f}, 0.5),
            (std::vector<float>{1.5f, -0.75f}));
  EXPECT_EQ(scaled<double>(DataType::kFloat64, {3.0, -1.5}, 0.25),
            (std::vector<double>{0.75, -0.375}));
  // float16 3.0 (0x4200) * 0.5 = 1.5 (0x3e00); bfloat16 3.0 (0x4040) * 0.5 = 1.5 (0x3fc0).
  EXPECT_EQ(scaled<uint16_t>(DataType::kFloat16, {0x4200, 0xc200}, 0.5),
            (std::vector<uint16_t>{0x3e00, 0xbe00}));
  EXPECT_EQ(scaled<uint16_t>(DataType::kBFloat16, {0x4040}, 0.5), (std::vector<uint16_t>{0x3fc0}));
  // float16 overflow: 60000 * 2 is infinity.
  EXPECT_EQ(scaled<uint16_t>(DataType::kFloat16, {float_to_half(60000.0f)}, 2.0)[0], 0x7c00);
}

// Horovod multiplies a float32 buffer by (float)factor in float32. Through double (x * factor
// rounded once) these products are one ulp away: 9 * 0.1 would be 0.9f, 5 * (1/3) 1.6666666f.
TEST(ReduceScaleTest, Float32IsScaledInFloat32ByTheFactorAsFloat32) {
  EXPECT_EQ(scaled<float>(DataType::kFloat32, {9.0f, -9.0f}, 0.1),
            (std::vector<float>{0.90000004f, -0.90000004f}));
  EXPECT_EQ(scaled<float>(DataType::kFloat32, {5.0f}, 1.0 / 3), (std::vector<float>{1.6666667f}));
  // Many random values and factors: the float32 product, bit for bit, and the data must tell
  // the two routes apart (else the comparison proves nothing).
  std::mt19937_64 rng(9);
  for (double f : {0.1, 1.0 / 3, 1.0 / 7, 3.3}) {
    std::vector<float> v(4099);
    for (float& x : v) x = std::uniform_real_distribution<float>(-1e3f, 1e3f)(rng);
    const auto got = scaled(DataType::kFloat32, v, f);
    size_t differ = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]),
                std::bit_cast<uint32_t>(static_cast<float>(f) * v[i]))
          << v[i] << " factor " << f;
      differ += got[i] != static_cast<float>(static_cast<double>(v[i]) * f);
    }
    EXPECT_GT(differ, 0u) << "factor " << f;
  }
}

template <typename T>
void check_ints(DataType dt, double factor, std::mt19937_64& rng) {
  for (size_t n : {0u, 1u, 7u, 1000u, 4099u}) {
    std::vector<T> v(n);
    for (T& x : v) x = static_cast<T>(rng());
    const auto got = scaled(dt, v, factor);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], ref_scale_int(v[i], factor)) << "value " << +v[i] << " factor " << factor;
    }
  }
}

TEST(ReduceScaleTest, IntegersMatchReference) {
  std::mt19937_64 rng(7);
  for (double f : {0.5, 1.0 / 3, 0.125, -0.75, 3.5, 1e-3}) {
    check_ints<uint8_t>(DataType::kUInt8, f, rng);
    check_ints<int8_t>(DataType::kInt8, f, rng);
    check_ints<int16_t>(DataType::kInt16, f, rng);
    check_ints<int32_t>(DataType::kInt32, f, rng);
    check_ints<int64_t>(DataType::kInt64, f, rng);
    check_ints<uint16_t>(DataType::kUInt16, f, rng);
    check_ints<uint32_t>(DataType::kUInt32, f, rng);
    check_ints<uint64_t>(DataType::kUInt64, f, rng);
  }
}

void check_16(DataType dt, ref::Format16 fmt, double factor, std::mt19937_64& rng) {
  for (size_t n : {0u, 1u, 7u, 1000u, 4099u}) {
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) x = static_cast<uint16_t>(rng());
    const auto got = scaled(dt, v, factor);
    for (size_t i = 0; i < n; ++i) {
      const float x = static_cast<float>(ref::ref_decode(v[i], fmt));
      const uint16_t want = ref::ref_encode(x * static_cast<float>(factor), fmt);
      if (ref::ref_is_nan(want, fmt)) {
        ASSERT_TRUE(ref::ref_is_nan(got[i], fmt)) << std::hex << v[i];
      } else {
        ASSERT_EQ(got[i], want) << std::hex << v[i] << " factor " << factor;
      }
    }
  }
}

TEST(ReduceScaleTest, FloatsMatchReference) {
  std::mt19937_64 rng(8);
  for (double f : {0.5, 1.0 / 3, 0.125, -0.75, 3.5, 1e-3}) {
    check_16(DataType::kFloat16, ref::kHalf, f, rng);
    check_16(DataType::kBFloat16, ref::kBFloat16, f, rng);
    for (size_t n : {0u, 1u, 7u, 1000u, 4099u}) {
      std::vector<float> v(n);
      std::vector<double> d(n);
      for (size_t i = 0; i < n; ++i) {
        v[i] = std::uniform_real_distribution<float>(-1e6f, 1e6f)(rng);
        d[i] = std::uniform_real_distribution<double>(-1e6, 1e6)(rng);
      }
      const auto got = scaled(DataType::kFloat32, v, f);
      const auto gotd = scaled(DataType::kFloat64, d, f);
      for (size_t i = 0; i < n; ++i) {
        // Horovod's rule: float32 times the factor rounded to float32, in float32.
        ASSERT_EQ(got[i], static_cast<float>(f) * v[i]) << v[i] << " factor " << f;
        ASSERT_EQ(gotd[i], d[i] * f) << d[i];
      }
    }
  }
}

}  // namespace
}  // namespace krug::reduce
