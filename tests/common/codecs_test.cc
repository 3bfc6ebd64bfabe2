// Bit-exact tests of the checkpoint and activation number formats (spec §2.3, §2.4, §5).
#include "common/codecs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "common/bf16.h"

namespace ss {
namespace {

// e4m3fn decoded from the definition: (-1)^s · 2^(e-7) · (1 + m/8), subnormal 2^-6 · m/8.
double E4m3Reference(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

bool IsE4m3Nan(int code) { return (code & 0x7f) == 0x7f; }

TEST(E4m3, DecodeTableAll256Codes) {
  for (int c = 0; c < 256; ++c) {
    const float v = E4m3ToFloat(static_cast<uint8_t>(c));
    if (IsE4m3Nan(c)) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), E4m3Reference(c)) << "code " << c;
    EXPECT_EQ(std::signbit(v), c >= 0x80) << "code " << c;
  }
  // Landmarks: subnormals are multiples of 2^-9, 0x08 is the smallest normal, 0x38 is one.
  for (int m = 0; m < 8; ++m) EXPECT_EQ(E4m3ToFloat(static_cast<uint8_t>(m)), m * 0x1p-9f);
  EXPECT_EQ(E4m3ToFloat(0x08), 0x1p-6f);
  EXPECT_EQ(E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(E4m3ToFloat(0x7d), 416.0f);
  EXPECT_EQ(E4m3ToFloat(0x80), 0.0f);
  EXPECT_TRUE(std::signbit(E4m3ToFloat(0x80)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xff)));
}

TEST(E4m3, RoundTripOfAllFiniteCodes) {
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    if (IsE4m3Nan(c)) continue;
    ++finite;
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(c))), c) << "code " << c;
  }
  EXPECT_EQ(finite, 254);
}

// Between every pair of neighbouring codes: the exact midpoint goes to the even mantissa, and
// anything off the midpoint goes to the nearer neighbour.
TEST(E4m3, RoundToNearestEvenAtEveryMidpoint) {
  for (int sign = 0; sign < 2; ++sign) {
    for (int c = 0; c < 0x7e; ++c) {
      const int lo_code = c | (sign << 7), hi_code = (c + 1) | (sign << 7);
      const float lo = E4m3ToFloat(static_cast<uint8_t>(lo_code));
      const float hi = E4m3ToFloat(static_cast<uint8_t>(hi_code));
      const float mid = 0.5f * (lo + hi);  // exact: both are short dyadic numbers
      const int even = (c & 1) == 0 ? lo_code : hi_code;
      EXPECT_EQ(FloatToE4m3(mid), even) << "midpoint " << mid;
      EXPECT_EQ(FloatToE4m3(std::nextafter(mid, lo)), lo_code) << "below " << mid;
      EXPECT_EQ(FloatToE4m3(std::nextafter(mid, hi)), hi_code) << "above " << mid;
    }
  }
  EXPECT_EQ(FloatToE4m3(1.0625f), 0x38);   // between 1 and 1.125 -> 1 (mantissa 0)
  EXPECT_EQ(FloatToE4m3(1.1875f), 0x3a);   // between 1.125 and 1.25 -> 1.25 (mantissa 2)
  EXPECT_EQ(FloatToE4m3(0.96875f), 0x38);  // between 0.9375 and 1 -> 1 (crosses the exponent)
  EXPECT_EQ(FloatToE4m3(0x1p-10f), 0x00);  // half the smallest subnormal -> 0
  EXPECT_EQ(FloatToE4m3(3 * 0x1p-10f), 0x02);
  EXPECT_EQ(FloatToE4m3(232.0f), 0x76);  // between 224 and 240 -> 224
  EXPECT_EQ(FloatToE4m3(432.0f), 0x7e);  // between 416 and 448 -> 448
}

// FloatToE4m3 (rounding on the float's bits) against the definition through frexp/ldexp and
// nearbyint, on every 61st bit pattern of all 2^32 and every 7th in [2^-7, 512) (every
// midpoint is checked above).
uint8_t E4m3ByDefinition(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return sign | 0x7e;
  if (a < 0.015625f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  int e2;
  std::frexp(a, &e2);
  int e = e2 - 1;
  int q = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - e)));
  if (q == 16) {
    q = 8;
    ++e;
  }
  const int code = ((e + 7) << 3) | (q - 8);
  return sign | static_cast<uint8_t>(std::min(code, 0x7e));
}

TEST(E4m3, BitRoundingEqualsTheDefinition) {
  auto check = [](uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    const uint8_t got = FloatToE4m3(x), want = E4m3ByDefinition(x);
    if (got != want) {
      ADD_FAILURE() << "bits 0x" << std::hex << bits << ": " << int(got) << " vs " << int(want);
    }
    return got == want;
  };
  int64_t bad = 0;
  for (uint64_t b = 0; b <= 0xffffffffu && bad < 5; b += 61)
    bad += !check(static_cast<uint32_t>(b));
  for (uint32_t b = 0x3c000000u; b < 0x44000000u && bad < 5; b += 7) {
    bad += !check(b);
    bad += !check(b | 0x80000000u);
  }
  EXPECT_EQ(bad, 0);
}

TEST(E4m3, SaturatesAndMapsNanTo0x7f) {
  EXPECT_EQ(FloatToE4m3(448.0f), 0x7e);
  EXPECT_EQ(FloatToE4m3(449.0f), 0x7e);
  EXPECT_EQ(FloatToE4m3(464.0f), 0x7e);
  EXPECT_EQ(FloatToE4m3(1e9f), 0x7e);
  EXPECT_EQ(FloatToE4m3(-449.0f), 0xfe);
  EXPECT_EQ(FloatToE4m3(-1e9f), 0xfe);
  EXPECT_EQ(FloatToE4m3(INFINITY), 0x7e);
  EXPECT_EQ(FloatToE4m3(-INFINITY), 0xfe);
  EXPECT_EQ(FloatToE4m3(NAN), 0x7f);
  EXPECT_EQ(RoundE4m3(1e9f), 448.0f);
  EXPECT_EQ(FloatToE4m3(1e-30f), 0x00);
  EXPECT_EQ(FloatToE4m3(-1e-30f), 0x80);
}

TEST(Ue8m0, Decode) {
  EXPECT_EQ(Ue8m0ToFloat(0), std::ldexp(1.0f, -127));
  EXPECT_GT(Ue8m0ToFloat(0), 0.0f);
  EXPECT_EQ(Ue8m0ToFloat(127), 1.0f);
  EXPECT_EQ(Ue8m0ToFloat(128), 2.0f);
  EXPECT_EQ(Ue8m0ToFloat(126), 0.5f);
  EXPECT_EQ(Ue8m0ToFloat(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(Ue8m0ToFloat(255)));
  for (int b = 0; b < 255; ++b) {
    EXPECT_EQ(static_cast<double>(Ue8m0ToFloat(static_cast<uint8_t>(b))), std::ldexp(1.0, b - 127));
    EXPECT_EQ(Ue8m0FromPow2(Ue8m0ToFloat(static_cast<uint8_t>(b))), b);
  }
}

TEST(E2m1, TableAndNibbleSign) {
  const float expected[16] = {0,     0.5f,  1,  1.5f,  2,  3,  4,  6,
                              -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(E2m1ToFloat(static_cast<uint8_t>(c)), expected[c]) << "code " << c;
    EXPECT_EQ(E2m1ToFloat(static_cast<uint8_t>(c | 0xf0)), expected[c]) << "high bits ignored";
    if (c != 8) {
      EXPECT_EQ(FloatToE2m1(expected[c]), c) << "round trip of code " << c;
    }
  }
  EXPECT_EQ(FloatToE2m1(-0.0f), 0);  // negative zero is written as code 0
}

TEST(E2m1, TiesGoToEvenCode) {
  struct Case {
    float x;
    uint8_t tie, below, above;  // codes at, just below and just above the midpoint
  };
  const Case cases[] = {{0.25f, 0, 0, 1}, {0.75f, 2, 1, 2}, {1.25f, 2, 2, 3}, {1.75f, 4, 3, 4},
                        {2.5f, 4, 4, 5},  {3.5f, 6, 5, 6},  {5.0f, 6, 6, 7}};
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToE2m1(c.x), c.tie) << c.x;
    EXPECT_EQ(FloatToE2m1(std::nextafter(c.x, 0.0f)), c.below) << c.x;
    EXPECT_EQ(FloatToE2m1(std::nextafter(c.x, 10.0f)), c.above) << c.x;
    const uint8_t neg = c.tie == 0 ? 0 : static_cast<uint8_t>(c.tie | 8);
    EXPECT_EQ(FloatToE2m1(-c.x), neg) << -c.x;
  }
}

TEST(E2m1, Saturates) {
  EXPECT_EQ(FloatToE2m1(6.0f), 7);
  EXPECT_EQ(FloatToE2m1(7.0f), 7);
  EXPECT_EQ(FloatToE2m1(1e9f), 7);
  EXPECT_EQ(FloatToE2m1(INFINITY), 7);
  EXPECT_EQ(FloatToE2m1(-7.0f), 15);
  EXPECT_EQ(FloatToE2m1(-1e9f), 15);
}

TEST(Pow2Scale, ExactPowersOfTwoAreKept) {
  // From k = -22 up, 448·2^k is above the 1e-4 floor.
  for (int k = -22; k <= 30; ++k) {
    const float p = std::ldexp(1.0f, k);
    EXPECT_EQ(Pow2Scale(448.0f * p, kFp8AmaxFloor, kE4m3Max), p) << "k " << k;
    EXPECT_EQ(Pow2Scale(6.0f * p, kFp4AmaxFloor, kE2m1Max), p) << "k " << k;
  }
}

TEST(Pow2Scale, NonPowersRoundUp) {
  for (int k = -20; k <= 20; ++k) {
    const float p = std::ldexp(1.0f, k);
    EXPECT_EQ(Pow2Scale(448.0f * p * (1.0f + 0x1p-20f), kFp8AmaxFloor, kE4m3Max), 2 * p);
    EXPECT_EQ(Pow2Scale(448.0f * p * 1.5f, kFp8AmaxFloor, kE4m3Max), 2 * p);
    EXPECT_EQ(Pow2Scale(448.0f * p * 0.75f, kFp8AmaxFloor, kE4m3Max), p);
    EXPECT_EQ(Pow2Scale(448.0f * p * (1.0f - 0x1p-20f), kFp8AmaxFloor, kE4m3Max), p);
    EXPECT_EQ(Pow2Scale(6.0f * p * 1.01f, kFp4AmaxFloor, kE2m1Max), 2 * p);
    EXPECT_EQ(Pow2Scale(3.5f * p, kFp4AmaxFloor, kE2m1Max), p);
  }
  EXPECT_EQ(Pow2Scale(1.0f, kFp8AmaxFloor, kE4m3Max), 0x1p-8f);  // 1/448 in (2^-9, 2^-8]
}

// Against the ldexp definition for amax across the whole float range (inf and NaN included).
TEST(Pow2Scale, EqualsTheLdexpDefinition) {
  auto definition = [](float amax, float floor, float qmax) {
    const float a = std::max(amax, floor);
    uint32_t bits;
    const float prod = a * (1.0f / qmax);
    std::memcpy(&bits, &prod, sizeof bits);
    int e = static_cast<int>((bits >> 23) & 0xff) - 127;
    if (bits & 0x7fffffu) ++e;
    return std::ldexp(1.0f, e);
  };
  int64_t bad = 0;
  for (uint64_t b = 0; b <= 0x7fffffffu && bad < 5; b += 997) {
    float amax;
    const uint32_t u = static_cast<uint32_t>(b);
    std::memcpy(&amax, &u, sizeof amax);
    for (const auto& [floor, qmax] :
         {std::pair{kFp8AmaxFloor, kE4m3Max}, std::pair{kFp4AmaxFloor, kE2m1Max}}) {
      const float got = Pow2Scale(amax, floor, qmax), want = definition(amax, floor, qmax);
      if (std::memcmp(&got, &want, sizeof got) != 0) {
        ADD_FAILURE() << "amax bits 0x" << std::hex << u << ": " << got << " vs " << want;
        ++bad;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Pow2Scale, Floors) {
  // 1e-4 / 448 ≈ 2.23e-7 lies in (2^-23, 2^-22].
  EXPECT_EQ(Pow2Scale(0.0f, kFp8AmaxFloor, kE4m3Max), 0x1p-22f);
  EXPECT_EQ(Pow2Scale(1e-6f, kFp8AmaxFloor, kE4m3Max), 0x1p-22f);
  // 6·2^-126 · fp32(1/6) rounds to exactly 2^-126 in fp32.
  EXPECT_EQ(Pow2Scale(0.0f, kFp4AmaxFloor, kE2m1Max), 0x1p-126f);
  EXPECT_EQ(kFp4AmaxFloor, 6.0f * 0x1p-126f);
  EXPECT_EQ(Ue8m0FromPow2(0x1p-22f), 127 - 22);
}

TEST(QuantizeActE4m3, PartialLastBlock) {
  constexpr size_t kN = 300, kBlock = 128;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(kN);
  for (float& v : x) v = nd(rng);
  x[290] = 1000.0f;  // the partial block has its own scale
  std::vector<uint8_t> q(kN);
  std::vector<float> s(3, -1.0f);
  QuantizeActE4m3(x.data(), kN, kBlock, q.data(), s.data());
  for (size_t b = 0; b < 3; ++b) {
    float amax = 0;
    for (size_t i = b * kBlock; i < std::min(kN, (b + 1) * kBlock); ++i) {
      amax = std::max(amax, std::fabs(x[i]));
    }
    const int e = Ue8m0FromPow2(s[b]) - 127;
    EXPECT_EQ(s[b], std::ldexp(1.0f, e)) << "scale is a power of two";
    EXPECT_LE(amax / s[b], 448.0f);
    EXPECT_GT(amax / s[b], 224.0f);
    for (size_t i = b * kBlock; i < std::min(kN, (b + 1) * kBlock); ++i) {
      EXPECT_EQ(q[i], FloatToE4m3(x[i] / s[b]));
      const float back = E4m3ToFloat(q[i]) * s[b];
      // Relative error of e4m3 rounding: at most 2^-4 of the value (normals), or half a
      // subnormal step.
      EXPECT_LE(std::fabs(back - x[i]), std::max(std::fabs(x[i]) * 0x1p-4f, 0x1p-10f * s[b]));
    }
  }
  EXPECT_EQ(s[2], 4.0f);  // 1000 / 448 = 2.23 -> 4
  EXPECT_EQ(q[290], FloatToE4m3(250.0f));

  std::vector<float> zeros(5, 0.0f);
  uint8_t qz[5];
  float sz = 0;
  QuantizeActE4m3(zeros.data(), 5, kBlock, qz, &sz);
  EXPECT_EQ(sz, 0x1p-22f);
  for (uint8_t c : qz) EXPECT_EQ(c, 0);
}

std::vector<float> RandomBf16(size_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = RoundBf16(nd(rng));
  return x;
}

TEST(Fp8Sim, ResultsLieOnScaledE4m3GridAndAreIdempotent) {
  constexpr size_t kN = 64 * 5 + 17, kBlock = 64;
  std::vector<float> x = RandomBf16(kN, 2.0f, 11);
  x[70] = 3000.0f;
  std::fill(x.begin() + 192, x.begin() + 256, 0.0f);  // an all-zero block stays zero
  std::vector<float> y = x;
  Fp8SimInplace(y.data(), kN, kBlock, /*round_e4m3=*/true);
  for (size_t b0 = 0; b0 < kN; b0 += kBlock) {
    const size_t b1 = std::min(kN, b0 + kBlock);
    float amax = 0;
    for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = Pow2Scale(amax, kFp8AmaxFloor, kE4m3Max);
    for (size_t i = b0; i < b1; ++i) {
      const float q = y[i] / s;  // exact: s is a power of two
      EXPECT_EQ(q, RoundE4m3(q)) << "off the e4m3 grid at " << i;
      EXPECT_EQ(y[i], RoundE4m3(x[i] / s) * s) << i;
      EXPECT_EQ(y[i], RoundBf16(y[i]));
    }
  }
  for (size_t i = 192; i < 256; ++i) EXPECT_EQ(y[i], 0.0f);
  std::vector<float> z = y;
  Fp8SimInplace(z.data(), kN, kBlock, true);
  EXPECT_EQ(z, y);
}

TEST(Fp8Sim, WithoutE4m3RoundingOnlyScalesAndClamps) {
  constexpr size_t kN = 200, kBlock = 64;
  std::vector<float> x = RandomBf16(kN, 5.0f, 12);
  std::vector<float> y = x;
  Fp8SimInplace(y.data(), kN, kBlock, /*round_e4m3=*/false);
  // The scale makes every |x/s| <= 448, so the clamp never fires and bf16 values pass through.
  EXPECT_EQ(y, x);
  std::vector<float> raw(kN);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ud(-9.0f, 9.0f);
  for (float& v : raw) v = ud(rng);
  std::vector<float> r = raw;
  Fp8SimInplace(r.data(), kN, kBlock, false);
  for (size_t i = 0; i < kN; ++i) EXPECT_EQ(r[i], RoundBf16(raw[i])) << i;
}

TEST(Fp4Sim, ResultsLieOnScaledE2m1Grid) {
  constexpr size_t kN = 32 * 6, kBlock = 32;
  std::vector<float> x = RandomBf16(kN, 1.0f, 13);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
  x[100] = 1e-3f;
  std::vector<float> y = x;
  Fp4SimInplace(y.data(), kN, kBlock);
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (size_t b0 = 0; b0 < kN; b0 += kBlock) {
    float amax = 0;
    for (size_t i = b0; i < b0 + kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = Pow2Scale(amax, kFp4AmaxFloor, kE2m1Max);
    EXPECT_EQ(s, std::ldexp(1.0f, Ue8m0FromPow2(s) - 127));
    if (amax > 0) {
      EXPECT_GT(amax / s, 3.0f);
      EXPECT_LE(amax / s, 6.0f);
    }
    for (size_t i = b0; i < b0 + kBlock; ++i) {
      const float q = std::fabs(y[i] / s);
      EXPECT_NE(std::find(grid, grid + 8, q), grid + 8) << "off the e2m1 grid at " << i;
      // Nearest grid point to |x|/s (ties are checked in E2m1.TiesGoToEvenCode).
      float best = 1e30f;
      for (float g : grid) best = std::min(best, std::fabs(g - std::fabs(x[i] / s)));
      EXPECT_EQ(std::fabs(q - std::fabs(x[i] / s)), best) << i;
      if (y[i] != 0) {
        EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i]));
      }
    }
  }
  for (size_t i = 64; i < 96; ++i) EXPECT_EQ(y[i], 0.0f);
}

TEST(Hadamard, H2AndH4Examples) {
  float a[2] = {1.0f, 2.0f};
  HadamardInplace(a, 2);
  EXPECT_EQ(a[0], 2.125f);        // bf16(3/√2 = 2.1213)
  EXPECT_EQ(a[1], -0.70703125f);  // bf16(-1/√2)
  float b[4] = {1, 2, 3, 4};
  HadamardInplace(b, 4);
  EXPECT_EQ(b[0], 5.0f);
  EXPECT_EQ(b[1], -1.0f);
  EXPECT_EQ(b[2], -2.0f);
  EXPECT_EQ(b[3], 0.0f);
  float c[4] = {1, 0, 0, 0};
  HadamardInplace(c, 4);
  for (float v : c) EXPECT_EQ(v, 0.5f);
}

TEST(Hadamard, OrthonormalRowsAndSelfInverse) {
  for (size_t n : {size_t{64}, size_t{128}}) {
    std::vector<std::vector<float>> rows(n, std::vector<float>(n, 0.0f));
    for (size_t j = 0; j < n; ++j) {
      rows[j][j] = 1.0f;
      HadamardInplace(rows[j].data(), n);
      const float mag = RoundBf16(static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))));
      for (float v : rows[j]) EXPECT_EQ(std::fabs(v), mag);
    }
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = i; j < n; ++j) {
        double dot = 0;
        for (size_t k = 0; k < n; ++k) dot += static_cast<double>(rows[i][k]) * rows[j][k];
        EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 2 * 0x1p-8) << n << " " << i << " " << j;
      }
    }
    std::vector<float> x = RandomBf16(n, 1.0f, 21);
    std::vector<float> y = x;
    HadamardInplace(y.data(), n);
    HadamardInplace(y.data(), n);
    double max_abs = 0;
    for (float v : x) max_abs = std::max(max_abs, static_cast<double>(std::fabs(v)));
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], max_abs * 0x1p-7) << i;
  }
}

}  // namespace
}  // namespace ss
