#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "reduce/half_bulk.h"
#include "reduce/reduce.h"
#include "reduce_reference.h"

namespace krug::reduce {
namespace {

using ref::Format16;
using ref::ref_decode;
using ref::ref_encode;
using ref::ref_is_nan;

struct Conversions {
  const char* name;
  Format16 fmt;
  float (*to_float)(uint16_t);
  uint16_t (*from_float)(float);
};

const Conversions kHalfConv{"Half", ref::kHalf, half_to_float, float_to_half};
const Conversions kBFloat16Conv{"BFloat16", ref::kBFloat16, bfloat16_to_float, float_to_bfloat16};

void PrintTo(const Conversions& c, std::ostream* os) {
  *os << c.name;
}

class ConversionTest : public ::testing::TestWithParam<Conversions> {};

// Floats that stress rounding: every representable value, every midpoint between neighbours
// (the ties), one float ulp either side of each midpoint, and random bit patterns.
std::vector<float> rounding_probes(Format16 fmt) {
  std::vector<float> out;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double v = ref_decode(static_cast<uint16_t>(h), fmt);
    out.push_back(static_cast<float>(v));
    if ((h & 0x7fff) == 0x7fff || std::isnan(v)) continue;
    const double next = ref_decode(static_cast<uint16_t>(h + 1), fmt);
    if (std::isnan(next) || std::isinf(v)) continue;
    // For the largest finite value, `next` is infinity: probe the overflow threshold instead.
    const double mid = std::isinf(next)
                           ? v + (v - ref_decode(static_cast<uint16_t>(h - 1), fmt)) / 2
                           : (v + next) / 2;
    const float fmid = static_cast<float>(mid);
    EXPECT_EQ(static_cast<double>(fmid), mid) << "midpoint not representable in float";
    out.push_back(fmid);
    out.push_back(std::nextafter(fmid, 0.0f));
    out.push_back(std::nextafter(fmid, std::numeric_limits<float>::infinity() * fmid));
  }
  std::mt19937 rng(1234);
  for (int i = 0; i < 1'000'000; ++i)
    out.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  return out;
}

TEST_P(ConversionTest, DecodesEveryBitPattern) {
  const Conversions& c = GetParam();
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float got = c.to_float(bits);
    const double want = ref_decode(bits, c.fmt);
    if (ref_is_nan(bits, c.fmt)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << std::hex << h;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << std::hex << h;
    }
  }
}

TEST_P(ConversionTest, RoundTripsEveryBitPattern) {
  const Conversions& c = GetParam();
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const uint16_t back = c.from_float(c.to_float(bits));
    if (ref_is_nan(bits, c.fmt)) {
      EXPECT_TRUE(ref_is_nan(back, c.fmt)) << std::hex << h << " -> " << back;
      EXPECT_EQ(back & 0x8000, bits & 0x8000) << std::hex << h;
    } else {
      EXPECT_EQ(back, bits) << std::hex << h;
    }
  }
}

TEST_P(ConversionTest, EncodesLikeTheReference) {
  const Conversions& c = GetParam();
  int failures = 0;
  for (float f : rounding_probes(c.fmt)) {
    const uint16_t got = c.from_float(f);
    if (std::isnan(f)) {
      if (!ref_is_nan(got, c.fmt) && ++failures < 10) ADD_FAILURE() << "NaN " << std::hex << got;
      continue;
    }
    const uint16_t want = ref_encode(f, c.fmt);
    if (got != want && ++failures < 10) {
      ADD_FAILURE() << "float " << std::hexfloat << f << ": got " << std::hex << got << " want "
                    << want;
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, ConversionTest, ::testing::Values(kHalfConv, kBFloat16Conv),
                         [](const auto& info) { return std::string(info.param.name); });

// A bulk implementation checked against the scalar conversion, which the tests above check
// against the reference. Every implementation is listed; those the CPU lacks are skipped.
struct Bulk {
  const char* name;
  Conversions scalar;
  void (*to_float_n)(const uint16_t*, float*, size_t);
  void (*from_float_n)(const float*, uint16_t*, size_t);
  bool (*available)();
};

bool always() {
  return true;
}

const Bulk kBulks[] = {
    {"Half", kHalfConv, half_to_float_n, float_to_half_n, always},
    {"HalfPortable", kHalfConv, detail::half_to_float_n_portable, detail::float_to_half_n_portable,
     always},
    {"HalfF16C", kHalfConv, detail::half_to_float_n_f16c, detail::float_to_half_n_f16c,
     detail::has_f16c},
    {"BFloat16", kBFloat16Conv, bfloat16_to_float_n, float_to_bfloat16_n, always},
};

void PrintTo(const Bulk& b, std::ostream* os) {
  *os << b.name;
}

class BulkConversionTest : public ::testing::TestWithParam<Bulk> {};

TEST_P(BulkConversionTest, MatchesScalarOnEveryBitPattern) {
  const Bulk& b = GetParam();
  if (!b.available()) GTEST_SKIP() << "not supported by this CPU";
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> wide(all.size());
  b.to_float_n(all.data(), wide.data(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), std::bit_cast<uint32_t>(b.scalar.to_float(all[i])))
        << std::hex << all[i];
  }
  const std::vector<float> probes = rounding_probes(b.scalar.fmt);
  std::vector<uint16_t> narrow(probes.size());
  b.from_float_n(probes.data(), narrow.data(), probes.size());
  for (size_t i = 0; i < probes.size(); ++i) {
    ASSERT_EQ(narrow[i], b.scalar.from_float(probes[i])) << std::hexfloat << probes[i];
  }
}

// Odd offsets and lengths reach the unaligned starts and the tails of the vector loops.
TEST_P(BulkConversionTest, HandlesOddOffsetsAndLengths) {
  const Bulk& b = GetParam();
  if (!b.available()) GTEST_SKIP() << "not supported by this CPU";
  std::mt19937 rng(99);
  std::vector<uint16_t> halves(4200);
  for (uint16_t& h : halves) h = static_cast<uint16_t>(rng());
  std::vector<float> floats(4200);
  for (float& f : floats) f = b.scalar.to_float(static_cast<uint16_t>(rng())) * 1.001f;
  for (size_t offset : {0u, 1u, 3u}) {
    for (size_t n : {0u, 1u, 7u, 9u, 1000u, 4099u}) {
      std::vector<float> wide(n + 1, -1.0f);
      b.to_float_n(halves.data() + offset, wide.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const float want = b.scalar.to_float(halves[offset + i]);
        ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), std::bit_cast<uint32_t>(want)) << i;
      }
      EXPECT_EQ(wide[n], -1.0f) << "wrote past the end";
      std::vector<uint16_t> narrow(n + 1, 0xabcd);
      b.from_float_n(floats.data() + offset, narrow.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(narrow[i], b.scalar.from_float(floats[offset + i])) << i;
      }
      EXPECT_EQ(narrow[n], 0xabcd) << "wrote past the end";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, BulkConversionTest, ::testing::ValuesIn(kBulks),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(HalfTest, TiesRoundToEven) {
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f), 0x3c00);      // 1 + half ulp: down to even 1.0
  EXPECT_EQ(float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);  // up to even mantissa 2
  EXPECT_EQ(float_to_half(-(1.0f + 3 * 0x1p-11f)), 0xbc02);
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);  // just above the tie
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);                    // half the smallest subnormal
  EXPECT_EQ(float_to_half(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(float_to_half(2047.5f), 0x6800);  // 2048: carries into the exponent
}

TEST(HalfTest, OverflowsToInfinity) {
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // the tie above the largest finite value
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(half_to_float(0x7c00), std::numeric_limits<float>::infinity());
}

TEST(HalfTest, Subnormals) {
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_to_float(0x03ff), 0x3ffp-24f);
  EXPECT_EQ(half_to_float(0x8001), -0x1p-24f);
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_half(0x3ffp-24f), 0x03ff);
  EXPECT_EQ(float_to_half(0x1p-14f), 0x0400);    // smallest normal
  EXPECT_EQ(float_to_half(0x7ffp-25f), 0x0400);  // rounds up from subnormal to normal
  EXPECT_EQ(float_to_half(0x1p-26f), 0x0000);
  EXPECT_EQ(float_to_half(-0x1p-26f), 0x8000);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
}

TEST(HalfTest, NaNStaysNaN) {
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7c01)));  // signalling
  EXPECT_TRUE(std::isnan(half_to_float(0xfe00)));
  EXPECT_TRUE(ref_is_nan(float_to_half(std::numeric_limits<float>::quiet_NaN()), ref::kHalf));
  // Payload only in bits a truncation would drop: must not become infinity.
  EXPECT_TRUE(ref_is_nan(float_to_half(std::bit_cast<float>(0x7f800001u)), ref::kHalf));
  EXPECT_EQ(float_to_half(std::bit_cast<float>(0xff800001u)) & 0x8000, 0x8000);
}

TEST(BFloat16Test, TiesRoundToEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(float_to_bfloat16(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x1p-8f + 0x1p-23f), 0x3f81);
  EXPECT_EQ(float_to_bfloat16(255.5f), 0x4380);  // 256: carries into the exponent
}

TEST(BFloat16Test, OverflowsToInfinity) {
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bfloat16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x7f7f7fffu)), 0x7f7f);  // just below the tie
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::infinity()), 0x7f80);
}

TEST(BFloat16Test, Subnormals) {
  EXPECT_EQ(bfloat16_to_float(0x0001), 0x1p-133f);
  EXPECT_EQ(float_to_bfloat16(0x1p-133f), 0x0001);
  EXPECT_EQ(float_to_bfloat16(0x1p-134f), 0x0000);  // tie: down to even zero
  EXPECT_EQ(float_to_bfloat16(0x3p-134f), 0x0002);  // tie: up to even 2
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bfloat16(-0x1p-133f), 0x8001);
}

TEST(BFloat16Test, NaNStaysNaN) {
  EXPECT_TRUE(std::isnan(bfloat16_to_float(0x7fc0)));
  EXPECT_TRUE(std::isnan(bfloat16_to_float(0x7f81)));
  EXPECT_TRUE(ref_is_nan(float_to_bfloat16(std::bit_cast<float>(0x7f800001u)), ref::kBFloat16));
  EXPECT_TRUE(ref_is_nan(float_to_bfloat16(std::bit_cast<float>(0x7fffffffu)), ref::kBFloat16));
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0xff800001u)), 0xffc0);
}

}  // namespace
}  // namespace krug::reduce
