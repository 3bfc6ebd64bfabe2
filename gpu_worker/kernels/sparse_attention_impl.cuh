// The bodies of paged_kv.h's sparse-attention kernels (KvSparseAttention), device code only.
//
// A candidate list holds `Cand`s (SparseCand): the device addresses of records (uint64_t, masked
// 0).
//
// SparseAttendBlock, any head_dim: `Entries` reads dim k of a candidate's entry as fp32
// (`__device__ float At(Cand c, int64_t k) const`). One block of kSparseWarps warps per (token,
// head); warps split a chunk's candidates for the scores, every thread owns head_dim / blockDim
// dims of the accumulator.
//
// SparseAttendFastBlock, head_dim kD (a multiple of 256, ≤ 512): the same arithmetic as
// SparseAttendBlock (each score a warp's lane-strided fp32 sum and xor tree, the running max and
// the probability sum in candidate order, each output dim's P·V sum in candidate order), so the
// same bits, but each 64-entry chunk of the list is first staged in shared memory as bf16 rows
// (all of its loads in flight at once, instead of one dependent load per product), the
// probabilities are taken in parallel (only their sum stays serial) and kSparseFastThreads
// threads share the work. Dynamic shared memory: kSparseChunk·kD bf16 (64 KiB at kD = 512), which
// needs the opt-in (PrepareKernels) before the first launch. `Stage` fills it, row i of the chunk
// at bf16 [i·kD, (i + 1)·kD) (a masked candidate's row is never read), in two steps around the
// barrier that publishes the chunk's candidates:
//   __device__ void StageRows(int64_t c0, int nc, uint4* smem);           // before: no list
//   __device__ void StageEntries(const Cand* list, int nc, uint4* smem);  // after: the list
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/fp8_common.cuh"

namespace ss::cuda {

inline constexpr int kSparseChunk = 64;
inline constexpr int kSparseWarps = 4;
inline constexpr int kSparseThreads = 32 * kSparseWarps;
inline constexpr int kSparseMaxDimsPerThread = 1024 / kSparseThreads;
inline constexpr int kSparseFastThreads = 256;
inline constexpr int kSparseFastWarps = kSparseFastThreads / 32;

template <typename Cand>
struct SparseCand;
template <>
struct SparseCand<uint64_t> {
  static constexpr uint64_t kMasked = 0;
  __device__ __forceinline__ static bool Valid(uint64_t c) { return c != 0; }
};

template <typename Entries, typename Cand>
__device__ __forceinline__ void SparseAttendBlock(const uint16_t* __restrict__ q,
                                                  const Entries& entries,
                                                  const Cand* __restrict__ cand,
                                                  const float* __restrict__ sink, int64_t n_heads,
                                                  int64_t d, int64_t n_cand, float scale,
                                                  uint16_t* __restrict__ out) {
  const int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const uint16_t* qh = q + (t * n_heads + h) * d;
  const Cand* ct = cand + t * n_cand;
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
      const Cand c = ct[c0 + i];
      const bool valid = SparseCand<Cand>::Valid(c);
      float dot = 0.0f;
      if (valid) {
        for (int64_t k = lane; k < d; k += 32) {
          dot = __fadd_rn(dot, __fmul_rn(Bf16ToF32(qh[k]), entries.At(c, k)));
        }
        for (int o = 16; o > 0; o >>= 1) dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, o));
      }
      if (lane == 0) s[i] = valid ? __fmul_rn(dot, scale) : -INFINITY;
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
        p_bf16[i] = SparseCand<Cand>::Valid(ct[c0 + i]) ? Bf16ToF32(F32ToBf16(p)) : 0.0f;
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
        const Cand c = ct[c0 + i];
        if (SparseCand<Cand>::Valid(c)) pv = __fadd_rn(pv, __fmul_rn(p_bf16[i], entries.At(c, k)));
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

template <int kD, typename Cand, typename Stage>
__device__ __forceinline__ void SparseAttendFastBlock(const uint16_t* __restrict__ q,
                                                      const Cand* __restrict__ cand,
                                                      const float* __restrict__ sink,
                                                      int64_t n_heads, int64_t n_cand, float scale,
                                                      Stage& stage, uint16_t* __restrict__ out) {
  extern __shared__ uint4 kv_smem[];
  const uint16_t* kvs = reinterpret_cast<const uint16_t*>(kv_smem);
  __shared__ float s[kSparseChunk], pe[kSparseChunk], p_bf16[kSparseChunk];
  __shared__ Cand idxs[kSparseChunk];
  __shared__ float stats[2];
  constexpr int kLaneDims = kD / 32, kPer = kD / kSparseFastThreads;
  const int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const uint16_t* qh = q + (t * n_heads + h) * kD;
  const Cand* ct = cand + t * n_cand;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  float qv[kLaneDims];
#pragma unroll
  for (int j = 0; j < kLaneDims; ++j) qv[j] = Bf16ToF32(qh[lane + 32 * j]);
  float acc[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) acc[j] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // thread 0's are the block's

  for (int64_t c0 = 0; c0 < n_cand; c0 += kSparseChunk) {
    const int nc = static_cast<int>(n_cand - c0 < kSparseChunk ? n_cand - c0 : kSparseChunk);
    if (tid < kSparseChunk) idxs[tid] = tid < nc ? ct[c0 + tid] : SparseCand<Cand>::kMasked;
    stage.StageRows(c0, nc, kv_smem);
    __syncthreads();
    stage.StageEntries(idxs, nc, kv_smem);
    __syncthreads();
    for (int i = warp; i < nc; i += kSparseFastWarps) {
      const bool valid = SparseCand<Cand>::Valid(idxs[i]);
      float dot = 0.0f;
      if (valid) {
        const uint16_t* kr = kvs + i * kD;
#pragma unroll
        for (int j = 0; j < kLaneDims; ++j) {
          dot = __fadd_rn(dot, __fmul_rn(qv[j], Bf16ToF32(kr[lane + 32 * j])));
        }
        for (int o = 16; o > 0; o >>= 1) dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, o));
      }
      if (lane == 0) s[i] = valid ? __fmul_rn(dot, scale) : -INFINITY;
    }
    __syncthreads();
    if (warp == 0) {
      float cm = -INFINITY;
      for (int i = lane; i < nc; i += 32) cm = fmaxf(cm, s[i]);
      for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
      if (lane == 0) stats[0] = cm;
    }
    __syncthreads();
    const float cmax = fmaxf(m, stats[0]);
    if (tid < nc) {
      const float p = expf(__fsub_rn(s[tid], cmax));
      pe[tid] = p;
      p_bf16[tid] = SparseCand<Cand>::Valid(idxs[tid]) ? Bf16ToF32(F32ToBf16(p)) : 0.0f;
    }
    __syncthreads();
    if (tid == 0) {
      const float alpha = expf(__fsub_rn(m, cmax));
      float psum = 0.0f;
      for (int i = 0; i < nc; ++i) psum = __fadd_rn(psum, pe[i]);
      l = __fadd_rn(__fmul_rn(l, alpha), psum);
      stats[1] = alpha;
    }
    m = cmax;
    __syncthreads();
    const float alpha = stats[1];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int k = tid + j * kSparseFastThreads;
      float pv = 0.0f;
      for (int i = 0; i < nc; ++i) {
        if (SparseCand<Cand>::Valid(idxs[i])) {
          pv = __fadd_rn(pv, __fmul_rn(p_bf16[i], Bf16ToF32(kvs[i * kD + k])));
        }
      }
      acc[j] = __fadd_rn(__fmul_rn(acc[j], alpha), pv);
    }
    __syncthreads();
  }
  __shared__ float denom;
  if (tid == 0) denom = __fadd_rn(l, expf(__fsub_rn(sink[h], m)));
  __syncthreads();
  uint16_t* oh = out + (t * n_heads + h) * kD;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int k = tid + j * kSparseFastThreads;
    oh[k] = F32ToBf16(__fdiv_rn(acc[j], denom));
  }
}

}  // namespace ss::cuda
