#include "common/codecs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/bf16.h"

namespace ss {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

constexpr float kE2m1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// Calls fn(b0, b1, s) for each block [b0, b1) of x[0..n) with its power-of-two scale.
template <typename Fn>
void ForEachScaledBlock(const float* x, size_t n, size_t block, float amax_floor, float qmax,
                        Fn&& fn) {
  for (size_t b0 = 0; b0 < n; b0 += block) {
    const size_t b1 = std::min(n, b0 + block);
    float amax = 0.0f;
    for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    fn(b0, b1, Pow2Scale(amax, amax_floor, qmax));
  }
}

}  // namespace

float E4m3ToFloat(uint8_t code) {
  const int sign = code >> 7;
  const int exp = (code >> 3) & 0xf;
  const int man = code & 0x7;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  float v = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                     : std::ldexp(static_cast<float>(8 + man), exp - 10);
  return sign ? -v : v;
}

uint8_t FloatToE4m3(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint8_t sign = (bits >> 24) & 0x80;
  const uint32_t abits = bits & 0x7fffffffu;
  if (abits > 0x7f800000u) return 0x7f;          // NaN
  if (abits >= 0x43e00000u) return sign | 0x7e;  // >= 448 (kE4m3Max), inf included
  if (abits < 0x3c800000u) {                     // below 2^-6: subnormal grid, spacing 2^-9
    // nearbyint rounds half to even in the default rounding mode; 8 lands on code 0x08 = 2^-6.
    const float a = std::fabs(x);
    const int q = static_cast<int>(std::nearbyint(a * 512.0f));
    return sign | static_cast<uint8_t>(q);
  }
  // Normal: round the 23-bit mantissa to 3 bits, half to even, on the bits themselves; a carry
  // moves into the exponent (1.111|1 -> 10.000). Then rebias the exponent from 127 to 7.
  const uint32_t r = (abits + 0x7ffffu + ((abits >> 20) & 1u)) >> 20;  // (exponent << 3) | mantissa
  const uint32_t code = r - ((127u - 7u) << 3);
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, 0x7e));
}

float Ue8m0ToFloat(uint8_t b) {
  if (b == 255) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(b) - 127);
}

float E2m1ToFloat(uint8_t code) {
  const float v = kE2m1Values[code & 7];
  return (code & 8) ? -v : v;
}

uint8_t FloatToE2m1(float x) {
  if (std::isnan(x)) return 0;
  const float a = std::fabs(x);
  uint8_t c;
  // Ties go to the even code (the one whose lowest bit is 0).
  if (a <= 0.25f)
    c = 0;
  else if (a < 0.75f)
    c = 1;
  else if (a <= 1.25f)
    c = 2;
  else if (a < 1.75f)
    c = 3;
  else if (a <= 2.5f)
    c = 4;
  else if (a < 3.5f)
    c = 5;
  else if (a <= 5.0f)
    c = 6;
  else
    c = 7;
  if (c == 0) return 0;
  return std::signbit(x) ? static_cast<uint8_t>(c | 8) : c;
}

float Pow2Scale(float amax, float amax_floor, float qmax) {
  const float a = std::max(amax, amax_floor);
  const float inv = 1.0f / qmax;
  const uint32_t bits = FloatBits(a * inv);
  int e = static_cast<int>((bits >> 23) & 0xff) - 127;
  if (bits & 0x7fffffu) ++e;
  // 2^e as ldexp gives it: inf from 2^128 up; normal exponents built directly (the hot path:
  // one call per quantisation block).
  if (e > 127) return std::numeric_limits<float>::infinity();
  if (e < -126) return std::ldexp(1.0f, e);
  const uint32_t out = static_cast<uint32_t>(e + 127) << 23;
  float f;
  std::memcpy(&f, &out, sizeof f);
  return f;
}

uint8_t Ue8m0FromPow2(float s) {
  int e2;
  std::frexp(s, &e2);
  return static_cast<uint8_t>(std::clamp(e2 - 1 + 127, 0, 254));
}

void QuantizeActE4m3(const float* x, size_t n, size_t block, uint8_t* q, float* scales) {
  ForEachScaledBlock(x, n, block, kFp8AmaxFloor, kE4m3Max, [&](size_t b0, size_t b1, float s) {
    scales[b0 / block] = s;
    // s is a power of two, so 1/s is exact and x·(1/s) rounds exactly like x/s.
    const float inv = 1.0f / s;
    for (size_t i = b0; i < b1; ++i)
      q[i] = FloatToE4m3(std::clamp(x[i] * inv, -kE4m3Max, kE4m3Max));
  });
}

void Fp8SimInplace(float* x, size_t n, size_t block, bool round_e4m3) {
  ForEachScaledBlock(x, n, block, kFp8AmaxFloor, kE4m3Max, [&](size_t b0, size_t b1, float s) {
    for (size_t i = b0; i < b1; ++i) {
      float v = std::clamp(x[i] / s, -kE4m3Max, kE4m3Max);
      v = round_e4m3 ? RoundE4m3(v) : RoundBf16(v);
      x[i] = RoundBf16(v * s);
    }
  });
}

void Fp4SimInplace(float* x, size_t n, size_t block) {
  ForEachScaledBlock(x, n, block, kFp4AmaxFloor, kE2m1Max, [&](size_t b0, size_t b1, float s) {
    for (size_t i = b0; i < b1; ++i) {
      const float v = E2m1ToFloat(FloatToE2m1(std::clamp(x[i] / s, -kE2m1Max, kE2m1Max)));
      x[i] = RoundBf16(v * s);
    }
  });
}

void HadamardInplace(float* x, size_t n) {
  std::vector<double> t(x, x + n);
  for (size_t h = 1; h < n; h <<= 1) {
    for (size_t i = 0; i < n; i += 2 * h) {
      for (size_t j = i; j < i + h; ++j) {
        const double a = t[j], b = t[j + h];
        t[j] = a + b;
        t[j + h] = a - b;
      }
    }
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (size_t i = 0; i < n; ++i) x[i] = RoundBf16(static_cast<float>(t[i]) * scale);
}

}  // namespace ss
