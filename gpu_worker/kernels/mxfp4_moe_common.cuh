// Device and launch helpers shared by the routed-expert kernels (mxfp4_moe.cu, the grouped GEMMs
// for prefill; mxfp4_moe_decode.cu, the decode GEMVs): the weight layout's addressing and checks
// (Mxfp4ExpertLayout) and the expert's SwiGLU as the CPU reference computes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/mxfp4_moe.h"

namespace ss::cuda {

// The byte offset of K-block kb (64 bytes) of weight row r in a matrix of rb-byte rows, row-major
// (tr = 0) or tiled in tr-row tiles (Mxfp4ExpertLayout).
__device__ __forceinline__ int64_t RowBlockOffset(int64_t r, int64_t kb, int64_t rb, int64_t tr) {
  if (tr == 0) return r * rb + kb * 64;
  return (r / tr) * tr * rb + kb * tr * 64 + (r % tr) * 64;
}

// The demo's clamped SwiGLU of one element (before the row weight), as swiglu.cu's.
__device__ __forceinline__ float SwiGluValue(float g, float u, float limit) {
  if (limit > 0.0f) {
    u = u < -limit ? -limit : (limit < u ? limit : u);  // std::clamp
    g = limit < g ? limit : g;                          // std::min
  }
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

__device__ __forceinline__ float RoundBf16(float v) { return Bf16ToF32(F32ToBf16(v)); }

inline bool AlignedTo(const void* p, uintptr_t a) {
  return reinterpret_cast<uintptr_t>(p) % a == 0;
}

// The limits Mxfp4ExpertLayout states (sizes, parts, tile_rows, offset alignment).
inline bool Mxfp4LayoutOk(const Mxfp4ExpertLayout& L) {
  if (L.dim <= 0 || L.dim % 128 != 0 || L.part_inter <= 0 || L.part_inter % 128 != 0) return false;
  if (L.parts < 1 || L.parts > kMxfp4MoeMaxParts) return false;
  if (L.tile_rows != 0 && L.tile_rows != 8 && L.tile_rows != 16) return false;
  if (L.expert_bytes % 16 != 0 || L.w2_scale_stride % 4 != 0 || L.w2_scale_col0 % 4 != 0) {
    return false;
  }
  if (L.w2_scale_stride < L.w2_scale_col0 + L.part_inter / 32) return false;
  for (int p = 0; p < L.parts; ++p) {
    if (L.w1[p] % 16 != 0 || L.w3[p] % 16 != 0 || L.w2[p] % 16 != 0) return false;
    if (L.w1_scale[p] % 4 != 0 || L.w3_scale[p] % 4 != 0 || L.w2_scale[p] % 4 != 0) return false;
  }
  return true;
}

}  // namespace ss::cuda
