// HcPost's arithmetic for one feature (spec §3.3), shared by HcPostKernelImpl and the kernels
// that run it on a result they have just formed (the decode GEMV's epilogue, the MoE combine), so
// every path writes the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/limits.h"

namespace ss::cuda {

inline constexpr int kHcPostMaxMult = static_cast<int>(kHcMaxMult);  // register arrays

// The hc new streams of feature i of one token: out[k·dim] = bf16(p[k]·xv + acc), acc =
// c[k]·rv[0] + Σ_{j≥1} c[j·hc + k]·rv[j] in j order. xv: the sublayer's output (a bf16 value);
// rv: the hc old streams at i; p, c: the token's post [hc] and comb [hc, hc]; out (and out_f32
// if not null, as fp32): the token's new streams at feature i.
__device__ __forceinline__ void HcPostFeature(float xv, const float (&rv)[kHcPostMaxMult],
                                              const float* p, const float* c, int hc, int64_t dim,
                                              uint16_t* out, float* out_f32) {
#pragma unroll
  for (int k = 0; k < kHcPostMaxMult; ++k) {
    if (k >= hc) break;
    float acc = __fmul_rn(c[k], rv[0]);
#pragma unroll
    for (int j = 1; j < kHcPostMaxMult; ++j) {
      if (j < hc) acc = __fadd_rn(acc, __fmul_rn(c[j * hc + k], rv[j]));
    }
    const uint16_t o = F32ToBf16(__fadd_rn(__fmul_rn(p[k], xv), acc));
    out[k * dim] = o;
    if (out_f32 != nullptr) out_f32[k * dim] = Bf16ToF32(o);
  }
}

// The old streams of feature i of token t (0 past hc), loaded before the values that need them.
__device__ __forceinline__ void HcPostLoadResidual(const HcPostOperands& hp, int64_t t, int64_t i,
                                                   float (&rv)[kHcPostMaxMult]) {
  const uint16_t* r = hp.residual + t * hp.hc * hp.dim + i;
#pragma unroll
  for (int j = 0; j < kHcPostMaxMult; ++j) rv[j] = j < hp.hc ? Bf16ToF32(r[j * hp.dim]) : 0.0f;
}

// The sublayer outputs HcPost takes, element k of [T, dim], as the fp32 value of a bf16 number:
// a bf16 tensor; a TP rank's all-reduced fp32 sum rounded once (RoundF32ToBf16); the MoE's
// combine of the shared expert's output and the routed experts' fp32 sum (MoeCombineBf16, or
// MoeCombineF32 on all-reduced partials). The combine kernels store the same functions' values,
// so a fused HcPost sees the bits the separate launches would have stored.
struct HcXBf16 {
  const uint16_t* x;
  __device__ __forceinline__ uint16_t Bits(int64_t k) const { return x[k]; }
};
struct HcXF32 {
  const float* x;
  __device__ __forceinline__ uint16_t Bits(int64_t k) const { return F32ToBf16(x[k]); }
};
struct HcXMoeBf16 {
  const uint16_t* shared;  // null: 0
  const float* routed;     // null: 0
  __device__ __forceinline__ uint16_t Bits(int64_t k) const {
    const float s = shared != nullptr ? Bf16ToF32(shared[k]) : 0.0f;
    const float r = routed != nullptr ? routed[k] : 0.0f;
    return F32ToBf16(__fadd_rn(r, s));
  }
};
struct HcXMoeF32 {
  const float* shared;
  const float* routed;
  __device__ __forceinline__ uint16_t Bits(int64_t k) const {
    return F32ToBf16(__fadd_rn(routed[k], Bf16ToF32(F32ToBf16(shared[k]))));
  }
};

}  // namespace ss::cuda
