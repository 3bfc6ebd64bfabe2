// The MoE router (router.h); mirrors common/model/moe.cc Route.
#include <climits>

#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/router.h"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kLogitRows = 8;    // token rows per pass over a gate row
constexpr int kLogitChunk = 64;  // token rows per block row of the grid
constexpr int kMaxExperts = static_cast<int>(kRouterMaxExperts);
constexpr int kMaxTopK = static_cast<int>(kRouterMaxTopK);

// float(f(double(x))): the correctly rounded float function glibc's expf/log1pf approximate.
__device__ __forceinline__ float ExpRn(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}
__device__ __forceinline__ float Log1pRn(float x) {
  return static_cast<float>(log1p(static_cast<double>(x)));
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// grid (ceil(E / kWarps), ceil(T / kLogitChunk)): one warp per expert e and chunk of tokens,
// logits[t][e] = Σ_i x[t][i]·gate[e][i] with each lane summing its i ≡ lane (mod 32) in order,
// then a butterfly, so the result does not depend on T or on the batching.
__global__ void RouterLogitsKernelImpl(const uint16_t* __restrict__ x,
                                       const uint16_t* __restrict__ gate, int64_t T, int64_t E,
                                       int64_t dim, float* __restrict__ logits) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (e >= E) return;
  const uint16_t* g = gate + e * dim;
  const int64_t t_begin = static_cast<int64_t>(blockIdx.y) * kLogitChunk;
  const int64_t t_end = T - t_begin < kLogitChunk ? T : t_begin + kLogitChunk;
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kLogitRows) {
    const int nr = static_cast<int>(t_end - t0 < kLogitRows ? t_end - t0 : kLogitRows);
    float acc[kLogitRows];
#pragma unroll
    for (int r = 0; r < kLogitRows; ++r) acc[r] = 0.0f;
    // kAhead dims per lane loaded before the in-order sums that use them (at decode a warp's
    // pass over its gate row is a chain of dependent loads otherwise).
    constexpr int kAhead = 8;
    int64_t i = lane;
    for (; i + (kAhead - 1) * 32 < dim; i += kAhead * 32) {
      float gv[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) gv[u] = Bf16ToF32(g[i + u * 32]);
#pragma unroll
      for (int r = 0; r < kLogitRows; ++r) {
        if (r < nr) {
          float xv[kAhead];
#pragma unroll
          for (int u = 0; u < kAhead; ++u) xv[u] = Bf16ToF32(x[(t0 + r) * dim + i + u * 32]);
#pragma unroll
          for (int u = 0; u < kAhead; ++u) acc[r] = __fadd_rn(acc[r], __fmul_rn(xv[u], gv[u]));
        }
      }
    }
    for (; i < dim; i += 32) {
      const float gv = Bf16ToF32(g[i]);
#pragma unroll
      for (int r = 0; r < kLogitRows; ++r) {
        if (r < nr) acc[r] = __fadd_rn(acc[r], __fmul_rn(Bf16ToF32(x[(t0 + r) * dim + i]), gv));
      }
    }
#pragma unroll
    for (int r = 0; r < kLogitRows; ++r) {
      const float s = WarpSum(acc[r]);
      if (lane == 0 && r < nr) logits[(t0 + r) * E + e] = s;
    }
  }
}

// Decode (T ≤ kRowMaxTokens, dim ≤ kRowMaxDim): grid (E, T), one block per (expert, token). The
// block forms the products x[t][i]·gate[e][i] with all its loads in flight at once into shared
// memory; warp 0's lane l then adds its i ≡ l (mod 32) in order and the warp runs the same
// butterfly, so the logit has the same bits as RouterLogitsKernelImpl's (whose warp per expert
// otherwise walks its gate row as a chain of dependent loads).
constexpr int kRowMaxTokens = 8;
constexpr int kRowMaxDim = 8192;

__global__ void __launch_bounds__(kThreads)
    RouterLogitsRowKernelImpl(const uint16_t* __restrict__ x, const uint16_t* __restrict__ gate,
                              int64_t E, int64_t dim, float* __restrict__ logits) {
  __shared__ float prod[kRowMaxDim];
  const int64_t e = blockIdx.x, t = blockIdx.y;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  const uint16_t* g = gate + e * dim;
  const uint16_t* xr = x + t * dim;
  constexpr int kPer = kRowMaxDim / kThreads;
  float pv[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int i = tid + u * kThreads;
    pv[u] = i < dim ? __fmul_rn(Bf16ToF32(xr[i]), Bf16ToF32(g[i])) : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int i = tid + u * kThreads;
    if (i < dim) prod[i] = pv[u];
  }
  __syncthreads();
  if (tid >= 32) return;
  const int count = lane < dim ? static_cast<int>((dim - lane + 31) / 32) : 0;
  const float* p = prod + lane;
  float acc = 0.0f;
  int k = 0;
  for (; k + 32 <= count; k += 32) {
    float v[32];
#pragma unroll
    for (int q = 0; q < 32; ++q) v[q] = p[(k + q) * 32];
#pragma unroll
    for (int q = 0; q < 32; ++q) acc = __fadd_rn(acc, v[q]);
  }
  for (; k < count; ++k) acc = __fadd_rn(acc, p[k * 32]);
  const float s = WarpSum(acc);
  if (lane == 0) logits[t * E + e] = s;
}

// (v, i) beats (bv, bi): larger value, equal values to the lower index; bi == INT_MAX is "none".
__device__ __forceinline__ bool Beats(float v, int i, float bv, int bi) {
  return bi == INT_MAX || v > bv || (v == bv && i < bi);
}

// A bad hash-table id gives a NaN weight rather than an out-of-bounds read.
__device__ __forceinline__ float ScoreOf(const float* score, int e, int E) {
  return static_cast<unsigned>(e) < static_cast<unsigned>(E) ? score[e] : NAN;
}

// One warp per token.
__global__ void RouterSelectKernelImpl(const float* __restrict__ logits,
                                       const float* __restrict__ bias,
                                       const int32_t* __restrict__ tid2eid,
                                       const int64_t* __restrict__ token_ids, int E, int k,
                                       float route_scale, int32_t* __restrict__ indices,
                                       float* __restrict__ weights) {
  __shared__ float score[kMaxExperts];
  __shared__ float biased[kMaxExperts];
  __shared__ unsigned char taken[kMaxExperts];
  __shared__ int sel[kMaxTopK];
  const int64_t t = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x);
  const bool hash = tid2eid != nullptr;
  for (int e = lane; e < E; e += 32) {
    const float l = logits[t * E + e];
    score[e] = __fsqrt_rn(l > 20.0f ? l : Log1pRn(ExpRn(l)));
    if (!hash) biased[e] = __fadd_rn(score[e], bias[e]);
    taken[e] = 0;
  }
  __syncwarp();
  if (hash) {
    if (lane < k) sel[lane] = tid2eid[token_ids[t] * k + lane];
  } else {
    for (int j = 0; j < k; ++j) {
      float bv = -INFINITY;
      int bi = INT_MAX;
      for (int e = lane; e < E; e += 32) {
        if (!taken[e] && Beats(biased[e], e, bv, bi)) {
          bv = biased[e];
          bi = e;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi != INT_MAX && Beats(ov, oi, bv, bi)) {
          bv = ov;
          bi = oi;
        }
      }
      if (lane == 0) {
        sel[j] = bi;
        taken[bi] = 1;
      }
      __syncwarp();
    }
  }
  __syncwarp();
  if (lane == 0) {
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum = __fadd_rn(sum, ScoreOf(score, sel[i], E));
    for (int i = 0; i < k; ++i) {
      indices[t * k + i] = sel[i];
      weights[t * k + i] = __fmul_rn(__fdiv_rn(ScoreOf(score, sel[i], E), sum), route_scale);
    }
  }
}

}  // namespace

cudaError_t Route(const RouteParams& p, cudaStream_t stream) {
  const uint16_t* x = Raw(p.x);
  const uint16_t* gate = Raw(p.gate);
  const float* bias = p.bias;
  const int32_t* tid2eid = p.tid2eid;
  const int64_t* token_ids = p.token_ids;
  const int64_t T = p.T, E = p.E, dim = p.dim, k = p.k;
  const float route_scale = p.route_scale;
  float* logits = p.logits;
  int32_t* indices = p.indices;
  float* weights = p.weights;
  if (E < 1 || E > kRouterMaxExperts || k < 1 || k > E || k > kRouterMaxTopK || dim < 1) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  if (T <= kRowMaxTokens && dim <= kRowMaxDim) {
    RouterLogitsRowKernelImpl<<<dim3(static_cast<unsigned>(E), static_cast<unsigned>(T)), kThreads,
                                0, stream>>>(x, gate, E, dim, logits);
  } else {
    const dim3 lgrid(static_cast<unsigned>((E + kWarps - 1) / kWarps),
                     static_cast<unsigned>((T + kLogitChunk - 1) / kLogitChunk));
    RouterLogitsKernelImpl<<<lgrid, kThreads, 0, stream>>>(x, gate, T, E, dim, logits);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  RouterSelectKernelImpl<<<static_cast<unsigned>(T), 32, 0, stream>>>(
      logits, bias, tid2eid, token_ids, static_cast<int>(E), static_cast<int>(k), route_scale,
      indices, weights);
  return cudaGetLastError();
}

const void* RouterLogitsKernel() { return reinterpret_cast<const void*>(&RouterLogitsKernelImpl); }
const void* RouterLogitsRowKernel() {
  return reinterpret_cast<const void*>(&RouterLogitsRowKernelImpl);
}
const void* RouterSelectKernel() { return reinterpret_cast<const void*>(&RouterSelectKernelImpl); }

}  // namespace ss::cuda
