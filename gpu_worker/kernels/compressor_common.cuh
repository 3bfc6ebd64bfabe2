// Device helpers shared by compressor.cu and indexer.cu: the Hadamard transform and the FP4
// simulation of codecs.cc on one warp, and the error-free fp32 sum.
#pragma once

#include <cstdint>

#include "gpu_worker/kernels/fp8_common.cuh"

namespace ss::cuda {

inline constexpr int kHadamardMaxPerLane = 16;  // kHadamardMaxDim / 32

__device__ __forceinline__ float RoundBf16Dev(float v) { return Bf16ToF32(F32ToBf16(v)); }

// float(exp(double(x))): the correctly rounded value glibc's std::exp(float) approximates.
__device__ __forceinline__ float ExpRnDev(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}

// Knuth's TwoSum: s + err == a + b exactly.
__device__ __forceinline__ void TwoSum(float a, float b, float& s, float& err) {
  s = __fadd_rn(a, b);
  const float bb = __fsub_rn(s, a);
  err = __fadd_rn(__fsub_rn(a, __fsub_rn(s, bb)), __fsub_rn(b, bb));
}

// codecs.cc FloatToE2m1 + E2m1ToFloat: round to nearest even on the e2m1 grid (x already
// clamped to ±6); zero comes back as +0 as in the reference.
__device__ __forceinline__ float RoundE2m1(float x) {
  const float a = fabsf(x);
  float v;
  if (a <= 0.25f)
    return 0.0f;
  else if (a < 0.75f)
    v = 0.5f;
  else if (a <= 1.25f)
    v = 1.0f;
  else if (a < 1.75f)
    v = 1.5f;
  else if (a <= 2.5f)
    v = 2.0f;
  else if (a < 3.5f)
    v = 3.0f;
  else if (a <= 5.0f)
    v = 4.0f;
  else
    v = 6.0f;
  return (__float_as_uint(x) >> 31) ? -v : v;
}

// 6·2^−126, codecs.h kFp4AmaxFloor.
__device__ __forceinline__ float Fp4AmaxFloor() { return __uint_as_float(0x01c00000u); }

// Hadamard_n then FP4sim_32 of one row of n values (n = 32·per, a power of two) held by a warp
// as v[k] = element lane + 32k, k < per. The butterfly runs the reference's stages (h = 1, 2,
// 4, …) with the same additions: lanes exchange for h < 32, a lane's own registers for h ≥ 32.
// The result (bf16 values as floats) replaces v.
template <typename Acc>
__device__ __forceinline__ void WarpHadamardFp4(float* v, int per, float scale) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  Acc t[kHadamardMaxPerLane];
#pragma unroll
  for (int k = 0; k < kHadamardMaxPerLane; ++k) t[k] = k < per ? static_cast<Acc>(v[k]) : Acc(0);
  for (int h = 1; h < 32; h <<= 1) {
    const bool upper = (lane & h) != 0;
#pragma unroll
    for (int k = 0; k < kHadamardMaxPerLane; ++k) {
      if (k < per) {
        const Acc other = __shfl_xor_sync(0xffffffffu, t[k], h);
        t[k] = upper ? other - t[k] : t[k] + other;  // t[j] = a + b, t[j + h] = a − b
      }
    }
  }
#pragma unroll
  for (int hk = 1; hk < kHadamardMaxPerLane; hk <<= 1) {
    if (hk < per) {
#pragma unroll
      for (int k = 0; k < kHadamardMaxPerLane; ++k) {
        if ((k & hk) == 0 && k + hk < per) {
          const Acc a = t[k], b = t[k + hk];
          t[k] = a + b;
          t[k + hk] = a - b;
        }
      }
    }
  }
  const float floor = Fp4AmaxFloor();
#pragma unroll
  for (int k = 0; k < kHadamardMaxPerLane; ++k) {
    if (k < per) {
      const float y = RoundBf16Dev(__fmul_rn(static_cast<float>(t[k]), scale));
      float amax = fabsf(y);
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float s = Pow2Scale(amax, floor, 6.0f);
      float q = __fdiv_rn(y, s);
      q = q < -6.0f ? -6.0f : (6.0f < q ? 6.0f : q);  // std::clamp
      v[k] = RoundBf16Dev(__fmul_rn(RoundE2m1(q), s));
    }
  }
}

}  // namespace ss::cuda
