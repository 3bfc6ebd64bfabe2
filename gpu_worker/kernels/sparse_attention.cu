#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/sparse_attention.h"

namespace ss::cuda {
namespace {

constexpr int kChunk = 64;
constexpr int kWarps = 4;

// One block per (token, head). Warps split the chunk's candidates for the scores; every thread
// owns head_dim / blockDim dims of the output accumulator.
__global__ void SparseAttentionKernelImpl(const uint16_t* __restrict__ q,
                                          const uint16_t* __restrict__ pool,
                                          const int32_t* __restrict__ cand,
                                          const float* __restrict__ sink, int64_t n_heads,
                                          int64_t d, int64_t n_cand, float scale,
                                          uint16_t* __restrict__ out) {
  const int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const uint16_t* qh = q + (t * n_heads + h) * d;
  const int32_t* ct = cand + t * n_cand;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float s[kChunk];
  __shared__ float p_bf16[kChunk];
  __shared__ float stats[2];  // running max, alpha of this chunk

  constexpr int kMaxDimsPerThread = 1024 / (32 * kWarps);
  const int per = static_cast<int>(d / blockDim.x);
  float acc[kMaxDimsPerThread];
  for (int j = 0; j < kMaxDimsPerThread; ++j) acc[j] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  for (int64_t c0 = 0; c0 < n_cand; c0 += kChunk) {
    const int nc = static_cast<int>(n_cand - c0 < kChunk ? n_cand - c0 : kChunk);
    for (int i = warp; i < nc; i += kWarps) {
      const int32_t idx = ct[c0 + i];
      float dot = 0.0f;
      if (idx >= 0) {
        const uint16_t* e = pool + static_cast<int64_t>(idx) * d;
        for (int64_t k = lane; k < d; k += 32) {
          dot = __fadd_rn(dot, __fmul_rn(Bf16ToF32(qh[k]), Bf16ToF32(e[k])));
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
        if (idx >= 0) pv = __fadd_rn(pv, __fmul_rn(p_bf16[i], Bf16ToF32(pool[static_cast<int64_t>(idx) * d + k])));
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

}  // namespace

cudaError_t SparseAttention(const uint16_t* q, const uint16_t* pool, const int32_t* cand,
                            const float* sink, int64_t T, int64_t n_heads, int64_t head_dim,
                            int64_t n_cand, float scale, uint16_t* out, cudaStream_t stream) {
  if (T == 0 || n_heads == 0) return cudaSuccess;
  if (head_dim % (32 * kWarps) != 0 || head_dim > 1024 || n_cand < 1) {
    return cudaErrorInvalidValue;
  }
  SparseAttentionKernelImpl<<<static_cast<unsigned>(T * n_heads), 32 * kWarps, 0, stream>>>(
      q, pool, cand, sink, n_heads, head_dim, n_cand, scale, out);
  return cudaGetLastError();
}

const void* SparseAttentionKernel() {
  return reinterpret_cast<const void*>(&SparseAttentionKernelImpl);
}

}  // namespace ss::cuda
