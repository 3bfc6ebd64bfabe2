// The body of the sparse-attention kernels (sparse_attention.h), shared by every KV storage
// format: `Entries` reads dim k of pool entry idx as fp32 (`__device__ float At(int32_t idx,
// int64_t k) const`). One block of kSparseWarps warps per (token, head); warps split a chunk's
// candidates for the scores, every thread owns head_dim / blockDim dims of the accumulator.
#pragma once

#include <cstdint>

#include "gpu_worker/kernels/fp8_common.cuh"

namespace ss::cuda {

inline constexpr int kSparseChunk = 64;
inline constexpr int kSparseWarps = 4;
inline constexpr int kSparseThreads = 32 * kSparseWarps;
inline constexpr int kSparseMaxDimsPerThread = 1024 / kSparseThreads;

template <typename Entries>
__device__ __forceinline__ void SparseAttendBlock(const uint16_t* __restrict__ q,
                                                  const Entries& entries,
                                                  const int32_t* __restrict__ cand,
                                                  const float* __restrict__ sink,
                                                  int64_t n_heads, int64_t d, int64_t n_cand,
                                                  float scale, uint16_t* __restrict__ out) {
  const int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const uint16_t* qh = q + (t * n_heads + h) * d;
  const int32_t* ct = cand + t * n_cand;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float s[kSparseChunk];
  __shared__ float p_bf16[kSparseChunk];
  __shared__ float stats[2];  // running max, alpha of this chunk

  const int per = static_cast<int>(d / blockDim.x);
  float acc[kSparseMaxDimsPerThread];
  for (int j = 0; j < kSparseMaxDimsPerThread; ++j) acc[j] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  for (int64_t c0 = 0; c0 < n_cand; c0 += kSparseChunk) {
    const int nc = static_cast<int>(n_cand - c0 < kSparseChunk ? n_cand - c0 : kSparseChunk);
    for (int i = warp; i < nc; i += kSparseWarps) {
      const int32_t idx = ct[c0 + i];
      float dot = 0.0f;
      if (idx >= 0) {
        for (int64_t k = lane; k < d; k += 32) {
          dot = __fadd_rn(dot, __fmul_rn(Bf16ToF32(qh[k]), entries.At(idx, k)));
        }
        for (int o = 16; o > 0; o >>= 1) dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, o));
      }
      if (lane == 0) s[i] = idx >= 0 ? __fmul_rn(dot, scale) : -INFINITY;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float cmax = m;
      for (int i = 0; i < nc; ++i) cmax = fmaxf(cmax, s[i]);
      const float alpha = expf(__fsub_rn(m, cmax));
      float psum = 0.0f;
      for (int i = 0; i < nc; ++i) {
        const float p = expf(__fsub_rn(s[i], cmax));
        psum = __fadd_rn(psum, p);
        p_bf16[i] = ct[c0 + i] >= 0 ? Bf16ToF32(F32ToBf16(p)) : 0.0f;
      }
      l = __fadd_rn(__fmul_rn(l, alpha), psum);
      m = cmax;
      stats[0] = m;
      stats[1] = alpha;
    }
    __syncthreads();
    const float alpha = stats[1];
    for (int j = 0; j < per; ++j) {
      const int64_t k = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      float pv = 0.0f;
      for (int i = 0; i < nc; ++i) {
        const int32_t idx = ct[c0 + i];
        if (idx >= 0) pv = __fadd_rn(pv, __fmul_rn(p_bf16[i], entries.At(idx, k)));
      }
      acc[j] = __fadd_rn(__fmul_rn(acc[j], alpha), pv);
    }
    __syncthreads();
  }
  __shared__ float denom;
  if (threadIdx.x == 0) denom = __fadd_rn(l, expf(__fsub_rn(sink[h], m)));
  __syncthreads();
  uint16_t* oh = out + (t * n_heads + h) * d;
  for (int j = 0; j < per; ++j) {
    const int64_t k = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    oh[k] = F32ToBf16(__fdiv_rn(acc[j], denom));
  }
}

}  // namespace ss::cuda
