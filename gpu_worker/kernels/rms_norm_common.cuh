// RMSNorm pieces shared by rms_norm.cu and the kernels that end in the norm of what they produce
// (HcPre's collapse followed by the sublayer's input norm): one 256-thread block per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/fp8_common.cuh"

namespace ss::cuda {

constexpr int kNormThreads = 256;

// The block's r = 1/sqrt(mean(x²) + eps) from each thread's sum of squares: the warps'
// butterflies, then warp 0's over the warps' sums. Every thread gets r.
__device__ __forceinline__ float BlockRms(float sum, int64_t n, float eps) {
  __shared__ float partial[kNormThreads / 32];
  for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < kNormThreads / 32 ? partial[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    if (threadIdx.x == 0) partial[0] = s;
  }
  __syncthreads();
  const float mean = __fmul_rn(partial[0], __frcp_rn(static_cast<float>(n)));
  return __frcp_rn(__fsqrt_rn(__fadd_rn(mean, eps)));
}

// RMSNorm and its spec §5.2 quantisation of a row of n = kPer·kNormThreads values held in
// registers: thread tid holds elements tid + u·kNormThreads as xv[u] (bf16 values as fp32) and
// the norm weight's as gv[u]. Its sum of squares runs over u in order (RmsNorm's order), the bf16
// result goes to y and through shared memory to the warps that quantise its 128-blocks to q / s.
template <int kPer>
__device__ __forceinline__ void RmsNormQuantRowRegs(const float (&xv)[kPer], const float (&gv)[kPer],
                                                    float eps, uint16_t* __restrict__ y,
                                                    uint8_t* __restrict__ q,
                                                    float* __restrict__ s) {
  constexpr int64_t n = int64_t{kPer} * kNormThreads, nb = n / 128;
  __shared__ uint16_t ys[n];
  const int tid = static_cast<int>(threadIdx.x);
  float sum = 0.0f;
#pragma unroll
  for (int u = 0; u < kPer; ++u) sum = __fadd_rn(sum, __fmul_rn(xv[u], xv[u]));
  const float r = BlockRms(sum, n, eps);
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const uint16_t o = F32ToBf16(__fmul_rn(gv[u], __fmul_rn(xv[u], r)));
    y[tid + u * kNormThreads] = o;
    ys[tid + u * kNormThreads] = o;
  }
  __syncthreads();
  const int lane = tid & 31, warp = tid >> 5;
  for (int64_t b = warp; b < nb; b += kNormThreads / 32) {
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = Bf16ToF32(ys[b * 128 + lane * 4 + j]);
    QuantizeBlock128(v, lane, 128, q + b * 128, s + b);
  }
}

}  // namespace ss::cuda
