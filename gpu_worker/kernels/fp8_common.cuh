// Device helpers shared by the FP8 kernels: exact e4m3/ue8m0/bf16 conversions in plain integer
// and fp32 arithmetic (no FP8 conversion instructions: SM 8.6 has none).
#pragma once

#include <cstdint>

namespace ss::cuda {

__device__ __forceinline__ float Bf16ToF32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Round-to-nearest-even; NaN stays NaN.
__device__ __forceinline__ uint16_t F32ToBf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float E4m3ToF32(uint32_t c) {
  const uint32_t sign = (c & 0x80u) << 24, exp = (c >> 3) & 0xfu, man = c & 0x7u;
  if (exp == 0) {
    const float v = static_cast<float>(man) * 0.001953125f;  // man · 2^-9
    return sign ? -v : v;
  }
  if (exp == 0xf && man == 0x7) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
}

__device__ __forceinline__ float Ue8m0ToF32(uint32_t b) {
  if (b == 255) return __uint_as_float(0x7fc00000u);
  return b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(b << 23);
}

// Round-to-nearest-even onto the e4m3 grid, saturating to ±448; x already clamped by callers.
__device__ __forceinline__ uint8_t F32ToE4m3(float x) {
  if (x != x) return 0x7f;
  const uint32_t sign = x < 0.0f || (x == 0.0f && (__float_as_uint(x) >> 31)) ? 0x80u : 0u;
  float a = fabsf(x);
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7e);
  if (a < 0.015625f) return static_cast<uint8_t>(sign | __float2int_rn(a * 512.0f));
  const int e = static_cast<int>((__float_as_uint(a) >> 23) & 0xff) - 127;  // a in [2^e, 2^e+1)
  int q = __float2int_rn(ldexpf(a, 3 - e));                                   // [8, 16]
  int ee = e;
  if (q == 16) {
    q = 8;
    ++ee;
  }
  const int code = ((ee + 7) << 3) | (q - 8);
  return static_cast<uint8_t>(sign | (code > 0x7e ? 0x7e : code));
}

// 2^ceil(log2(max(amax, floor) * fp32(1/qmax))) from the fp32 bits (spec §5.2).
__device__ __forceinline__ float Pow2Scale(float amax, float amax_floor, float qmax) {
  const float a = fmaxf(amax, amax_floor);
  const uint32_t bits = __float_as_uint(__fmul_rn(a, __frcp_rn(qmax)));
  int e = static_cast<int>((bits >> 23) & 0xff) - 127;
  if (bits & 0x7fffffu) ++e;
  return ldexpf(1.0f, e);
}

}  // namespace ss::cuda
