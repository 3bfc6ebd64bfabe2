// Hyper-connection collapse (HcPre, HcHead) and expand (HcPost), spec §3.3; mirrors
// common/model/hyper_connection.cc operation by operation.

#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/hc_post_common.cuh"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/last_block.cuh"
#include "gpu_worker/kernels/limits.h"
#include "gpu_worker/kernels/rms_norm.h"
#include "gpu_worker/kernels/rms_norm_common.cuh"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads == kNormThreads,
              "HcFinishKernelImpl<., ., ., true> ends in the norm's block");
constexpr int kWarps = kThreads / 32;
constexpr int kMaxMult = static_cast<int>(kHcMaxMult);
constexpr int kMaxMix = (2 + kMaxMult) * kMaxMult;

// float(exp(double(x))): the correctly rounded expf that glibc's std::exp(float) approximates.
__device__ __forceinline__ float ExpRn(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}

__device__ __forceinline__ float Sigmoid(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, ExpRn(-x)));
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block of one value per thread; every thread gets the total.
__device__ float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < kWarps; ++w) s = __fadd_rn(s, scratch[w]);
  __syncthreads();  // scratch may be reused by the caller
  return s;
}

// The reference's HcSplitSinkhorn on mixes[0..(2+hc)·hc), by one thread.
__device__ void SplitSinkhorn(const float* mixes, const float* base, const float* scale, int hc,
                              int iters, float eps, float* pre, float* post, float* c) {
  for (int i = 0; i < hc; ++i) {
    pre[i] = __fadd_rn(Sigmoid(__fadd_rn(__fmul_rn(mixes[i], scale[0]), base[i])), eps);
    post[i] = __fmul_rn(2.0f, Sigmoid(__fadd_rn(__fmul_rn(mixes[hc + i], scale[1]), base[hc + i])));
  }
  for (int i = 0; i < hc * hc; ++i) {
    c[i] = __fadd_rn(__fmul_rn(mixes[2 * hc + i], scale[2]), base[2 * hc + i]);
  }
  for (int j = 0; j < hc; ++j) {
    float* row = c + j * hc;
    float mx = row[0];
    for (int k = 1; k < hc; ++k) mx = row[k] > mx ? row[k] : mx;  // std::max_element: first max
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) {
      row[k] = ExpRn(__fsub_rn(row[k], mx));
      sum = __fadd_rn(sum, row[k]);
    }
    for (int k = 0; k < hc; ++k) row[k] = __fadd_rn(__fdiv_rn(row[k], sum), eps);
  }
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      for (int j = 0; j < hc; ++j) {
        float* row = c + j * hc;
        float sum = 0.0f;
        for (int k = 0; k < hc; ++k) sum = __fadd_rn(sum, row[k]);
        for (int k = 0; k < hc; ++k) row[k] = __fdiv_rn(row[k], __fadd_rn(sum, eps));
      }
    }
    for (int k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int j = 0; j < hc; ++j) sum = __fadd_rn(sum, c[j * hc + k]);
      for (int j = 0; j < hc; ++j) c[j * hc + k] = __fdiv_rn(c[j * hc + k], __fadd_rn(sum, eps));
    }
  }
}

// One block per token. kHead: the head collapse (mix = hc, no post/comb/Sinkhorn).
template <bool kHead>
__global__ void HcCollapseKernelImpl(const uint16_t* __restrict__ streams,
                                     const float* __restrict__ fn, const float* __restrict__ base,
                                     const float* __restrict__ scale, int hc, int64_t dim,
                                     int iters, float hc_eps, float norm_eps,
                                     uint16_t* __restrict__ y, float* __restrict__ pre_out,
                                     float* __restrict__ post_out, float* __restrict__ comb_out) {
  __shared__ float scratch[kWarps];
  __shared__ float mixes[kMaxMix];
  __shared__ float pre[kMaxMult], post[kMaxMult], comb[kMaxMult * kMaxMult];
  const int64_t t = blockIdx.x;
  const int64_t n = hc * dim;
  const uint16_t* X = streams + t * n;
  const int mix = kHead ? hc : (2 + hc) * hc;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;

  float sq = 0.0f;
  for (int64_t i = tid; i < n; i += kThreads) {
    const float v = Bf16ToF32(X[i]);
    sq = __fadd_rn(sq, __fmul_rn(v, v));
  }
  sq = BlockSum(sq, scratch);
  const float mean = __fmul_rn(sq, __frcp_rn(static_cast<float>(n)));
  const float r = __frcp_rn(__fsqrt_rn(__fadd_rn(mean, norm_eps)));

  for (int m = warp; m < mix; m += kWarps) {
    const float* f = fn + m * n;
    float acc = 0.0f;
    for (int64_t i = lane; i < n; i += 32) acc = __fadd_rn(acc, __fmul_rn(Bf16ToF32(X[i]), f[i]));
    acc = WarpSum(acc);
    if (lane == 0) mixes[m] = __fmul_rn(acc, r);
  }
  __syncthreads();

  if (tid == 0) {
    if (kHead) {
      for (int s = 0; s < hc; ++s) {
        pre[s] = __fadd_rn(Sigmoid(__fadd_rn(__fmul_rn(mixes[s], scale[0]), base[s])), hc_eps);
      }
    } else {
      SplitSinkhorn(mixes, base, scale, hc, iters, hc_eps, pre, post, comb);
    }
  }
  __syncthreads();

  if (!kHead) {
    if (tid < hc) {
      pre_out[t * hc + tid] = pre[tid];
      post_out[t * hc + tid] = post[tid];
    }
    if (tid < hc * hc) comb_out[t * hc * hc + tid] = comb[tid];
  }
  for (int64_t i = tid; i < dim; i += kThreads) {
    float acc = __fmul_rn(pre[0], Bf16ToF32(X[i]));
    for (int s = 1; s < hc; ++s) acc = __fadd_rn(acc, __fmul_rn(pre[s], Bf16ToF32(X[s * dim + i])));
    y[t * dim + i] = F32ToBf16(acc);
  }
}

// SplitSinkhorn by one warp, lane e < hc·hc owning comb element e (row e / hc, column e % hc) in
// a register and lane i < hc pre[i] and post[i]: each lane forms the sums its element needs in
// the serial version's order (a row's sum over k, a column's over j, read by shuffles) and applies
// the same operations, so the results are the same bits; only independent work runs side by side.
// hc·hc ≤ 32. All 32 lanes take part in every shuffle (the others' values are never used).
__device__ void SplitSinkhornWarp(const float* mixes, const float* base, const float* scale, int hc,
                                  int iters, float eps, float* pre, float* post, float* c) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int n = hc * hc, j = lane / hc, k = lane % hc, r0 = j * hc;
  const bool own = lane < n;
  if (lane < hc) {
    pre[lane] = __fadd_rn(Sigmoid(__fadd_rn(__fmul_rn(mixes[lane], scale[0]), base[lane])), eps);
    post[lane] =
        __fmul_rn(2.0f, Sigmoid(__fadd_rn(__fmul_rn(mixes[hc + lane], scale[1]), base[hc + lane])));
  }
  float v = own ? __fadd_rn(__fmul_rn(mixes[2 * hc + lane], scale[2]), base[2 * hc + lane]) : 0.0f;
  float mx = __shfl_sync(kAll, v, r0);
  for (int q = 1; q < hc; ++q) {
    const float o = __shfl_sync(kAll, v, r0 + q);
    mx = o > mx ? o : mx;  // std::max_element: first max
  }
  v = ExpRn(__fsub_rn(v, mx));
  float sum = 0.0f;
  for (int q = 0; q < hc; ++q) sum = __fadd_rn(sum, __shfl_sync(kAll, v, r0 + q));
  v = __fadd_rn(__fdiv_rn(v, sum), eps);
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      sum = 0.0f;
      for (int q = 0; q < hc; ++q) sum = __fadd_rn(sum, __shfl_sync(kAll, v, r0 + q));
      v = __fdiv_rn(v, __fadd_rn(sum, eps));
    }
    sum = 0.0f;
    for (int q = 0; q < hc; ++q) sum = __fadd_rn(sum, __shfl_sync(kAll, v, q * hc + k));
    v = __fdiv_rn(v, __fadd_rn(sum, eps));
  }
  if (own) c[lane] = v;
}

// The block collapse for many tokens (HcPre's chunks past the decode split; hc ≤ 4): the same
// chains as HcCollapseKernelImpl<false>, so the same bits, with kTileTokens tokens a block, so that
// each element of fn is read once a tile instead of once a token (fn is mix·hc·dim fp32, 1.5 MiB
// at Flash's shape, against the token's 32 KiB of streams). Each kTileChunk of the hc·dim values
// is staged in shared memory for the tile's tokens and fn's rows; thread (warp w, lane l) carries
// the mix chains of lane l for tokens 4·(w % 4) .. +3 and mix rows kTileMixHalf·(w / 4) ..
// +kTileMixHalf − 1 (elements i ≡ l mod 32, in order), and thread u the squares chains of every
// tile token over i ≡ u mod kThreads (one element a chunk, in order). The reductions are BlockSum's
// and WarpSum's, then a warp's Sinkhorn per token (SplitSinkhornWarp: the same bits) and y as
// HcCollapseKernelImpl forms them.
constexpr int kTileTokens = 16;
constexpr int kTileChunk = kThreads;  // one element of each squares chain a chunk
constexpr int kTileMixHalf = 12;      // mix rows a warp carries: (2 + 4)·4 / 2
constexpr int kTileTokW = 4;          // tokens a warp carries
static_assert(kWarps == 2 * (kTileTokens / kTileTokW), "warps = token groups x mix halves");

__global__ void __launch_bounds__(kThreads, 2)
    HcCollapseTiledKernelImpl(const uint16_t* __restrict__ streams, const float* __restrict__ fn,
                              const float* __restrict__ base, const float* __restrict__ scale,
                              int64_t T, int hc, int64_t dim, int iters, float hc_eps,
                              float norm_eps, uint16_t* __restrict__ y, float* __restrict__ pre_out,
                              float* __restrict__ post_out, float* __restrict__ comb_out) {
  __shared__ __align__(16) float fs[kTileMixHalf * 2][kTileChunk];
  __shared__ __align__(16) uint16_t xs[kTileTokens][kTileChunk];
  __shared__ float sq_w[kTileTokens][kWarps];
  __shared__ float rs[kTileTokens];
  __shared__ float mixes[kTileTokens][kTileMixHalf * 2];
  __shared__ float pre[kTileTokens][4], post[kTileTokens][4], comb[kTileTokens][16];
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTileTokens;
  const int nt = static_cast<int>(T - t0 < kTileTokens ? T - t0 : kTileTokens);
  const int64_t n = hc * dim;
  const int mix = (2 + hc) * hc;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  // 16-byte staging loads where every row of streams and fn starts 16-byte aligned.
  const bool vec = n % 8 == 0 && reinterpret_cast<uintptr_t>(streams) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(fn) % 16 == 0;
  const int tb = (warp % (kTileTokens / kTileTokW)) * kTileTokW;
  const int mb = (warp / (kTileTokens / kTileTokW)) * kTileMixHalf;
  float acc[kTileTokW][kTileMixHalf];
  float sq[kTileTokens];
#pragma unroll
  for (int a = 0; a < kTileTokW; ++a) {
#pragma unroll
    for (int m = 0; m < kTileMixHalf; ++m) acc[a][m] = 0.0f;
  }
#pragma unroll
  for (int a = 0; a < kTileTokens; ++a) sq[a] = 0.0f;
  for (int64_t i0 = 0; i0 < n; i0 += kTileChunk) {
    const int len = static_cast<int>(n - i0 < kTileChunk ? n - i0 : kTileChunk);
    __syncthreads();                 // the previous chunk's readers are done
    if (vec && len == kTileChunk) {  // 16-byte copies, all in flight at once
      for (int k = tid; k < kTileTokens * kTileChunk / 8; k += kThreads) {
        const int a = k / (kTileChunk / 8), c = (k % (kTileChunk / 8)) * 8;
        if (a < nt) {
          CpAsync16(&xs[a][c], streams + (t0 + a) * n + i0 + c);
        } else {
          *reinterpret_cast<uint4*>(&xs[a][c]) = make_uint4(0, 0, 0, 0);
        }
      }
      for (int k = tid; k < mix * kTileChunk / 4; k += kThreads) {
        const int m = k / (kTileChunk / 4), c = (k % (kTileChunk / 4)) * 4;
        CpAsync16(&fs[m][c], fn + m * n + i0 + c);
      }
      CpAsyncCommit();
      CpAsyncWait<0>();
    } else {
      for (int k = tid; k < kTileTokens * kTileChunk; k += kThreads) {
        const int a = k / kTileChunk, c = k % kTileChunk;
        xs[a][c] = a < nt && c < len ? streams[(t0 + a) * n + i0 + c] : uint16_t{0};
      }
      for (int k = tid; k < mix * kTileChunk; k += kThreads) {
        const int m = k / kTileChunk, c = k % kTileChunk;
        fs[m][c] = c < len ? fn[m * n + i0 + c] : 0.0f;
      }
    }
    __syncthreads();
    if (tid < len) {
#pragma unroll
      for (int a = 0; a < kTileTokens; ++a) {
        const float v = Bf16ToF32(xs[a][tid]);
        sq[a] = __fadd_rn(sq[a], __fmul_rn(v, v));
      }
    }
    for (int c = lane; c < len; c += 32) {
      float xv[kTileTokW];
#pragma unroll
      for (int a = 0; a < kTileTokW; ++a) xv[a] = Bf16ToF32(xs[tb + a][c]);
#pragma unroll
      for (int m = 0; m < kTileMixHalf; ++m) {
        if (mb + m >= mix) break;
        const float f = fs[mb + m][c];
#pragma unroll
        for (int a = 0; a < kTileTokW; ++a) acc[a][m] = __fadd_rn(acc[a][m], __fmul_rn(xv[a], f));
      }
    }
  }
  // r per token: BlockSum's order (the warp's butterfly, then the warps in order from 0).
#pragma unroll
  for (int a = 0; a < kTileTokens; ++a) {
    const float v = WarpSum(sq[a]);
    if (lane == 0) sq_w[a][warp] = v;
  }
  __syncthreads();
  if (tid < kTileTokens) {
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) s = __fadd_rn(s, sq_w[tid][w]);
    const float mean = __fmul_rn(s, __frcp_rn(static_cast<float>(n)));
    rs[tid] = __frcp_rn(__fsqrt_rn(__fadd_rn(mean, norm_eps)));
  }
  __syncthreads();
#pragma unroll
  for (int a = 0; a < kTileTokW; ++a) {
#pragma unroll
    for (int m = 0; m < kTileMixHalf; ++m) {
      if (mb + m >= mix) break;
      const float v = WarpSum(acc[a][m]);
      if (lane == 0) mixes[tb + a][mb + m] = __fmul_rn(v, rs[tb + a]);
    }
  }
  __syncthreads();
  for (int a = warp; a < nt; a += kWarps) {
    SplitSinkhornWarp(mixes[a], base, scale, hc, iters, hc_eps, pre[a], post[a], comb[a]);
  }
  __syncthreads();
  if (tid < nt) {
    const int64_t t = t0 + tid;
    for (int s = 0; s < hc; ++s) {
      pre_out[t * hc + s] = pre[tid][s];
      post_out[t * hc + s] = post[tid][s];
    }
    for (int s = 0; s < hc * hc; ++s) comb_out[t * hc * hc + s] = comb[tid][s];
  }
  __syncthreads();
  for (int a = 0; a < nt; ++a) {
    const uint16_t* X = streams + (t0 + a) * n;
    for (int64_t i = tid; i < dim; i += kThreads) {
      float v = __fmul_rn(pre[a][0], Bf16ToF32(X[i]));
      for (int s = 1; s < hc; ++s)
        v = __fadd_rn(v, __fmul_rn(pre[a][s], Bf16ToF32(X[s * dim + i])));
      y[(t0 + a) * dim + i] = F32ToBf16(v);
    }
  }
}

// SplitSinkhornWarp for hc = 4 with everything unrolled, and pre/post in the same warp's spare
// lanes: lanes 0..15 own comb element (lane / 4, lane % 4), lanes 16..19 pre[lane − 16], lanes
// 20..23 post[lane − 20] (their logit is mixes[lane − 16], as in SplitSinkhorn), so the three
// sigmoids' and the softmax's exps and divisions are one instruction each across the warp. `z` is
// the lane's logit mix·scale + base, formed by the caller with SplitSinkhorn's operations. Every
// value is the same operations on the same inputs as SplitSinkhorn, so the same bits; lanes
// 24..31 and the Sinkhorn values of lanes 16..31 are kept finite (exp(0), 1.0) so that no
// division takes its slow path on unused values. Returns comb (lanes 0..15) or pre/post
// (16..23).
__device__ __forceinline__ float SplitSinkhornWarp4(float z, int iters, float eps) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const bool comb = lane < 16;
  const int r0 = lane & ~3, k = lane & 3;
  float mx = __shfl_sync(kAll, z, r0);
#pragma unroll
  for (int q = 1; q < 4; ++q) {
    const float o = __shfl_sync(kAll, z, r0 + q);
    mx = o > mx ? o : mx;  // std::max_element: first max
  }
  const float e = ExpRn(comb ? __fsub_rn(z, mx) : lane < 24 ? -z : 0.0f);
  float sum = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) sum = __fadd_rn(sum, __shfl_sync(kAll, e, r0 + q));
  // Softmax: e / sum + eps; sigmoid: 1 / (1 + e), + eps for pre, · 2 for post.
  const float d = __fdiv_rn(comb ? e : 1.0f, comb ? sum : __fadd_rn(1.0f, e));
  const float w = lane < 20 ? __fadd_rn(d, eps) : __fmul_rn(2.0f, d);
  float v = comb ? w : 1.0f;
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      float a[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) a[q] = __shfl_sync(kAll, v, r0 + q);
      float s = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) s = __fadd_rn(s, a[q]);
      v = __fdiv_rn(v, __fadd_rn(s, eps));
    }
    float a[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) a[q] = __shfl_sync(kAll, v, q * 4 + k);
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; ++q) s = __fadd_rn(s, a[q]);
    v = __fdiv_rn(v, __fadd_rn(s, eps));
  }
  return comb ? v : w;
}

// Thread tid's chain of squares: x[i]² summed over i ≡ tid (mod kThreads) in order, with kAhead
// loads issued before the serial sums that use them.
template <int kAhead>
__device__ __forceinline__ float SquaresChain(const uint16_t* __restrict__ X, int64_t n, int tid) {
  float sq = 0.0f;
  int64_t i0 = tid;
  for (; i0 + (kAhead - 1) * kThreads < n; i0 += kAhead * kThreads) {
    float v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) v[u] = Bf16ToF32(X[i0 + u * kThreads]);
#pragma unroll
    for (int u = 0; u < kAhead; ++u) sq = __fadd_rn(sq, __fmul_rn(v[u], v[u]));
  }
  for (; i0 < n; i0 += kThreads) {
    const float v = Bf16ToF32(X[i0]);
    sq = __fadd_rn(sq, __fmul_rn(v, v));
  }
  return sq;
}

// HcMixKernelImpl's products per shared-memory segment (a multiple of 32 and of kThreads).
constexpr int kMixSeg = 4096;

// Decode split of the block collapse (few tokens: one block per token would leave one SM to read
// all of fn). grid (T, mix): each block computes the token's r exactly as HcCollapseKernelImpl
// does (every thread's sum in the same order, its loads issued ahead) and one mix row with the
// same lane sums (the block forms the products, warp 0's lanes add them in order), so the values
// are the same bits; they go to the token's row of y (as fp32, mix·4 ≤ dim·2 bytes), which
// HcFinishKernelImpl reads back before it overwrites the row with the collapse.

__global__ void HcMixKernelImpl(const uint16_t* __restrict__ streams, const float* __restrict__ fn,
                                int hc, int64_t dim, float norm_eps, uint16_t* __restrict__ y) {
  __shared__ float scratch[kWarps];
  const int64_t t = blockIdx.x;
  const int64_t n = hc * dim;
  const uint16_t* X = streams + t * n;
  const int mix = (2 + hc) * hc;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const float sq = BlockSum(SquaresChain<16>(X, n, tid), scratch);
  const float mean = __fmul_rn(sq, __frcp_rn(static_cast<float>(n)));
  const float r = __frcp_rn(__fsqrt_rn(__fadd_rn(mean, norm_eps)));
  const int m = static_cast<int>(blockIdx.y);
  if (m >= mix) return;
  const float* f = fn + m * n;
  // The products x[i]·f[i] (independent) are formed by the whole block into shared memory,
  // kMixSeg at a time with every load of a segment in flight at once; warp 0's lanes then add
  // their i ≡ lane (mod 32) in order, as one warp summing from memory would.
  constexpr int kPerThread = kMixSeg / kThreads;
  __shared__ float prod[kMixSeg];
  float acc = 0.0f;
  for (int64_t s0 = 0; s0 < n; s0 += kMixSeg) {
    const int len = static_cast<int>(n - s0 < kMixSeg ? n - s0 : kMixSeg);
    float xv[kPerThread], fv[kPerThread];
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int k = tid + u * kThreads;
      xv[u] = k < len ? Bf16ToF32(X[s0 + k]) : 0.0f;
      fv[u] = k < len ? f[s0 + k] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) prod[tid + u * kThreads] = __fmul_rn(xv[u], fv[u]);
    __syncthreads();
    if (warp == 0) {
      for (int k = lane; k < len; k += 32) acc = __fadd_rn(acc, prod[k]);
    }
    __syncthreads();
  }
  if (warp != 0) return;
  acc = WarpSum(acc);
  if (lane == 0) reinterpret_cast<float*>(y + t * dim)[m] = __fmul_rn(acc, r);
}

// The decode split with the mix rows' lane sums spread over blocks. HcMixKernelImpl's sums are
// independent chains: for mix row m, lane l adds x[i]·f[i] over i ≡ l (mod 32) in order, and for
// r, thread u adds x[i]² over i ≡ u (mod kThreads) in order; only the final butterflies combine
// them. grid (T, mix·kLaneParts + 1): block (t, m·kLaneParts + p) forms the products of lanes
// [p·kPartLanes, (p + 1)·kPartLanes) of row m, kLaneSpan per lane at a time, with the whole
// block's loads in flight at once, and kPartLanes threads run the chains; the last block runs the
// kThreads chains of squares. The chains' ends go to the token's row of y as fp32 (lane sums at
// [m·32 + l], squares at [mix·32 + u]); HcFinishKernelImpl<true> runs the butterflies exactly as
// HcMixKernelImpl does (WarpSum per row, BlockSum of the squares), so every mix has the same bits.
// Needs hc·dim % 32 == 0 and (mix·32 + kThreads)·4 ≤ dim·2.
constexpr int kLaneParts = 4;
constexpr int kPartLanes = 32 / kLaneParts;
constexpr int kLaneSpan = 512;
constexpr int kLanePer = kLaneSpan * kPartLanes / kThreads;  // products per thread per span

// acc + p[0] + p[stride] + ... + p[(count − 1)·stride], in that order, 32 loads in flight.
__device__ __forceinline__ float ChainSum(float acc, const float* p, int stride, int count) {
  int k = 0;
  for (; k + 32 <= count; k += 32) {
    float v[32];
#pragma unroll
    for (int q = 0; q < 32; ++q) v[q] = p[(k + q) * stride];
#pragma unroll
    for (int q = 0; q < 32; ++q) acc = __fadd_rn(acc, v[q]);
  }
  for (; k < count; ++k) acc = __fadd_rn(acc, p[k * stride]);
  return acc;
}

// Block b of token t's HcMixLanesKernelImpl grid.
__device__ __forceinline__ void HcMixLanesBlock(const uint16_t* __restrict__ streams,
                                                const float* __restrict__ fn, int hc, int64_t dim,
                                                uint16_t* __restrict__ y, int64_t t, int b) {
  const int64_t n = hc * dim;
  const uint16_t* X = streams + t * n;
  const int mix = (2 + hc) * hc;
  const int tid = static_cast<int>(threadIdx.x);
  float* out = reinterpret_cast<float*>(y + t * dim);
  if (b == mix * kLaneParts) {
    out[mix * 32 + tid] = SquaresChain<32>(X, n, tid);
    return;
  }
  const int m = b / kLaneParts, p = b % kLaneParts;
  const float* f = fn + m * n;
  // prod[k·kPartLanes + l']: the product of lane p·kPartLanes + l' at its k-th element of the span.
  __shared__ float prod[kLaneSpan * kPartLanes];
  const int lq = tid % kPartLanes, kq = tid / kPartLanes;
  const int64_t per = n / 32;  // elements per lane
  const int64_t off = static_cast<int64_t>(p) * kPartLanes + lq;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < per; k0 += kLaneSpan) {
    const int len = static_cast<int>(per - k0 < kLaneSpan ? per - k0 : kLaneSpan);
    float xv[kLanePer], fv[kLanePer];
#pragma unroll
    for (int u = 0; u < kLanePer; ++u) {
      const int k = kq + u * (kThreads / kPartLanes);
      const int64_t i = (k0 + k) * 32 + off;
      xv[u] = k < len ? Bf16ToF32(X[i]) : 0.0f;
      fv[u] = k < len ? f[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kLanePer; ++u) {
      const int k = kq + u * (kThreads / kPartLanes);
      prod[k * kPartLanes + lq] = __fmul_rn(xv[u], fv[u]);
    }
    __syncthreads();
    if (tid < kPartLanes) acc = ChainSum(acc, prod + tid, kPartLanes, len);
    __syncthreads();
  }
  if (tid < kPartLanes) out[m * 32 + p * kPartLanes + tid] = acc;
}

__global__ void __launch_bounds__(kThreads)
    HcMixLanesKernelImpl(const uint16_t* __restrict__ streams, const float* __restrict__ fn, int hc,
                         int64_t dim, uint16_t* __restrict__ y) {
  HcMixLanesBlock(streams, fn, hc, dim, y, blockIdx.x, static_cast<int>(blockIdx.y));
}

// The sublayer's input norm that HcFinishKernelImpl<., ., ., true> runs on its y: RmsNormQuant's
// weight, eps and outputs.
struct NormQuantArgs {
  const float* g = nullptr;
  float eps = 0.0f;
  uint16_t* y = nullptr;
  uint8_t* q = nullptr;
  float* s = nullptr;
};
constexpr int kPre = 16, kPreMult = 4;  // HcFinishKernelImpl's prefetched collapse inputs

// kLanes: the row holds HcMixLanesKernelImpl's chain ends (else HcMixKernelImpl's mixes).
// kHc: 4 for the kernel specialised to hc = 4 (every released model; the argument hc must be 4),
// 0 for any hc. kDefer (hc = 4 only): comb_out gets the Sinkhorn's input logits, for
// HcCombSinkhornKernelImpl (pre and post do not depend on the Sinkhorn's rounds). kNorm (dim =
// kPre·kThreads only): then RmsNormQuant of y (nq), from y's values in registers
// (RmsNormQuantRegsKernelImpl's layout: the same operations, so the same bits).
// HcFinishKernelImpl's work for token t. kL2: y's row was written by other blocks of the same
// launch (HcMixFinishKernelImpl), so it is read through L2, past any stale L1 line.
template <bool kLanes, int kHc, bool kDefer, bool kNorm, bool kL2>
__device__ __forceinline__ void HcFinishRow(
    const uint16_t* __restrict__ streams, const float* __restrict__ base,
    const float* __restrict__ scale, int hc_arg, int64_t dim, int iters, float hc_eps,
    float norm_eps, uint16_t* y, float* __restrict__ pre_out, float* __restrict__ post_out,
    float* __restrict__ comb_out, const NormQuantArgs& nq, int64_t t) {
  static_assert(kHc == 0 || kHc == 4, "the specialised kernel is for hc = 4");
  static_assert(!kDefer || kHc == 4, "the deferred Sinkhorn is for hc = 4");
  const int hc = kHc != 0 ? kHc : hc_arg;
  __shared__ float mixes[kMaxMix];
  __shared__ float pre[kMaxMult], post[kMaxMult], comb[kMaxMult * kMaxMult];
  const uint16_t* X = streams + t * hc * dim;
  const int mix = (2 + hc) * hc;
  const int tid = static_cast<int>(threadIdx.x);
  // hc = 4: warp 0's lane l holds the logit of mix row ml (SplitSinkhornWarp4's lane roles); its
  // base and scale are loaded first, so their latency overlaps everything before the Sinkhorn.
  const int ml = tid < 16 ? 8 + tid : tid < 24 ? tid - 16 : 0;
  float base_l = 0.0f, scale_l = 0.0f;
  if (kHc == 4 && tid < 32) {
    base_l = base[ml];
    scale_l = scale[tid < 16 ? 2 : tid < 20 ? 0 : 1];
  }
  // The collapse's inputs (hc ≤ 4, dim ≤ kThreads·kPre: Flash's 4 × 4096), and the norm's weight,
  // loaded before the Sinkhorn iterations so their latency overlaps them.
  const bool prefetch = hc <= kPreMult && dim <= static_cast<int64_t>(kPre) * kThreads;
  uint16_t xv[kPre][kPreMult];
  float gv[kNorm ? kPre : 1];
  if constexpr (kNorm) {
#pragma unroll
    for (int u = 0; u < kPre; ++u) gv[u] = nq.g[tid + u * kThreads];
  }
  if (prefetch) {
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t i = tid + static_cast<int64_t>(u) * kThreads;
#pragma unroll
      for (int s = 0; s < kPreMult; ++s) xv[u][s] = i < dim && s < hc ? X[s * dim + i] : 0;
    }
  }
  const float* row_p = reinterpret_cast<const float*>(y + t * dim);
  const auto row = [&](int64_t k) { return kL2 ? __ldcg(row_p + k) : row_p[k]; };
  if constexpr (kHc == 4) {
    // The same sums as the kHc = 0 path below (BlockSum and WarpSum's butterflies, the same
    // order per value), with the rows' butterflies interleaved with the squares' and one
    // barrier: each warp parks its unscaled row sums and its squares' sum, warp 0 finishes r.
    __shared__ float scratch[kWarps];
    float z = 0.0f;
    if constexpr (kLanes) {
      constexpr int kMix4 = 24, kRows4 = kMix4 / kWarps;
      const int lane = tid & 31, warp = tid >> 5;
      float lv[kRows4];
#pragma unroll
      for (int q = 0; q < kRows4; ++q) lv[q] = row((warp + q * kWarps) * 32 + lane);
      float sq = row(kMix4 * 32 + tid);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        sq = __fadd_rn(sq, __shfl_xor_sync(0xffffffffu, sq, o));
#pragma unroll
        for (int q = 0; q < kRows4; ++q) {
          lv[q] = __fadd_rn(lv[q], __shfl_xor_sync(0xffffffffu, lv[q], o));
        }
      }
      // Every chain end is read before this barrier, so before y is overwritten.
      if (lane == 0) {
        scratch[warp] = sq;
#pragma unroll
        for (int q = 0; q < kRows4; ++q) mixes[warp + q * kWarps] = lv[q];
      }
      __syncthreads();
      if (tid < 32) {
        float s = 0.0f;
        for (int w = 0; w < kWarps; ++w) s = __fadd_rn(s, scratch[w]);
        const float mean = __fmul_rn(s, __frcp_rn(static_cast<float>(hc * dim)));
        const float r = __frcp_rn(__fsqrt_rn(__fadd_rn(mean, norm_eps)));
        z = __fadd_rn(__fmul_rn(__fmul_rn(mixes[ml], r), scale_l), base_l);
      }
    } else {
      if (tid < 32) z = __fadd_rn(__fmul_rn(row(ml), scale_l), base_l);
      // Warp 0 reads y's row before the barrier below, so before y is overwritten.
    }
    if (tid < 32) {
      const float w = SplitSinkhornWarp4(z, kDefer ? 0 : iters, hc_eps);
      if (tid < 16) {
        comb_out[t * 16 + tid] = kDefer ? z : w;
      } else if (tid < 20) {
        pre[tid - 16] = w;
        pre_out[t * 4 + tid - 16] = w;
      } else if (tid < 24) {
        post_out[t * 4 + tid - 20] = w;
      }
    }
    __syncthreads();
  } else {
    if constexpr (kLanes) {
      // Every chain end is read before BlockSum's first barrier, so before y is overwritten.
      __shared__ float scratch[kWarps];
      constexpr int kRowsPerWarp = (kMaxMix + kWarps - 1) / kWarps;
      const int lane = tid & 31, warp = tid >> 5;
      float lv[kRowsPerWarp];
#pragma unroll
      for (int q = 0; q < kRowsPerWarp; ++q) {
        const int m = warp + q * kWarps;
        lv[q] = m < mix ? row(m * 32 + lane) : 0.0f;
      }
      const float sq = BlockSum(row(mix * 32 + tid), scratch);
      const float mean = __fmul_rn(sq, __frcp_rn(static_cast<float>(hc * dim)));
      const float r = __frcp_rn(__fsqrt_rn(__fadd_rn(mean, norm_eps)));
#pragma unroll
      for (int q = 0; q < kRowsPerWarp; ++q) {
        const int m = warp + q * kWarps;
        if (m < mix) {  // warp-uniform
          const float acc = WarpSum(lv[q]);
          if (lane == 0) mixes[m] = __fmul_rn(acc, r);
        }
      }
    } else {
      if (tid < mix) mixes[tid] = row(tid);
    }
    __syncthreads();
    if (hc * hc <= 32) {
      if (tid < 32) SplitSinkhornWarp(mixes, base, scale, hc, iters, hc_eps, pre, post, comb);
    } else if (tid == 0) {
      SplitSinkhorn(mixes, base, scale, hc, iters, hc_eps, pre, post, comb);
    }
    __syncthreads();
    if (tid < hc) {
      pre_out[t * hc + tid] = pre[tid];
      post_out[t * hc + tid] = post[tid];
    }
    if (tid < hc * hc) comb_out[t * hc * hc + tid] = comb[tid];
  }
  if (prefetch) {
    float yv[kPre];
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t i = tid + static_cast<int64_t>(u) * kThreads;
      if (i >= dim) break;
      float acc = __fmul_rn(pre[0], Bf16ToF32(xv[u][0]));
#pragma unroll
      for (int s = 1; s < kPreMult; ++s) {
        if (s < hc) acc = __fadd_rn(acc, __fmul_rn(pre[s], Bf16ToF32(xv[u][s])));
      }
      const uint16_t o = F32ToBf16(acc);
      y[t * dim + i] = o;
      yv[u] = Bf16ToF32(o);
    }
    if constexpr (kNorm) {
      constexpr int64_t n = int64_t{kPre} * kThreads;
      RmsNormQuantRowRegs<kPre>(yv, gv, nq.eps, nq.y + t * n, nq.q + t * n, nq.s + t * (n / 128));
    }
    return;
  }
  for (int64_t i = tid; i < dim; i += kThreads) {
    float acc = __fmul_rn(pre[0], Bf16ToF32(X[i]));
    for (int s = 1; s < hc; ++s) acc = __fadd_rn(acc, __fmul_rn(pre[s], Bf16ToF32(X[s * dim + i])));
    y[t * dim + i] = F32ToBf16(acc);
  }
}

template <bool kLanes, int kHc, bool kDefer = false, bool kNorm = false>
__global__ void __launch_bounds__(kThreads)
    HcFinishKernelImpl(const uint16_t* __restrict__ streams, const float* __restrict__ base,
                       const float* __restrict__ scale, int hc_arg, int64_t dim, int iters,
                       float hc_eps, float norm_eps, uint16_t* y, float* __restrict__ pre_out,
                       float* __restrict__ post_out, float* __restrict__ comb_out,
                       NormQuantArgs nq) {
  HcFinishRow<kLanes, kHc, kDefer, kNorm, false>(streams, base, scale, hc_arg, dim, iters, hc_eps,
                                                 norm_eps, y, pre_out, post_out, comb_out, nq,
                                                 blockIdx.x);
}

// HcMixLanesKernelImpl and HcFinishKernelImpl<true, 4, true, true> in one launch (the grid of the
// first): each block writes its chain ends as there, then counts itself in sync[t] (after a
// fence), and the token's last block, which sees every chain end, runs the finishing kernel's
// block and sets sync[t] back to 0. The same operations on the same values: the same bits.
__global__ void __launch_bounds__(kThreads)
    HcMixFinishKernelImpl(const uint16_t* __restrict__ streams, const float* __restrict__ fn,
                          const float* __restrict__ base, const float* __restrict__ scale,
                          int64_t dim, int iters, float hc_eps, float norm_eps, uint16_t* y,
                          float* __restrict__ pre_out, float* __restrict__ post_out,
                          float* __restrict__ comb_out, NormQuantArgs nq,
                          uint32_t* __restrict__ sync) {
  const int64_t t = blockIdx.x;
  HcMixLanesBlock(streams, fn, 4, dim, y, t, static_cast<int>(blockIdx.y));
  LastBlockFinishes(sync, t, gridDim.y, [&] {
    HcFinishRow<true, 4, true, true, true>(streams, base, scale, 4, dim, iters, hc_eps, norm_eps, y,
                                           pre_out, post_out, comb_out, nq, t);
  });
}

// 16-byte pieces (kVec: 8 bf16 values, else one value) of a row copied to each of hc streams.
template <bool kVec>
__global__ void HcEmbedStreamsKernelImpl(const uint16_t* __restrict__ rows, int64_t T, int hc,
                                         int64_t dim, uint16_t* __restrict__ streams) {
  const int64_t per_row = kVec ? dim / 8 : dim, n = T * per_row;
  GridStride(n, [&](int64_t i) {
    const int64_t t = i / per_row, j = i % per_row;
    if constexpr (kVec) {
      const uint4 v = reinterpret_cast<const uint4*>(rows)[i];
      uint4* out = reinterpret_cast<uint4*>(streams) + t * hc * per_row + j;
      for (int s = 0; s < hc; ++s) out[s * per_row] = v;
    } else {
      const uint16_t v = rows[i];
      for (int s = 0; s < hc; ++s) streams[(t * hc + s) * dim + j] = v;
    }
  });
}

// Whether `blocks` blocks of `kernel` (kThreads each) are resident at once on the current device.
// The fused mix + finish kernel holds the finish's registers in every block (2 blocks an SM on
// SM 8.6 and 9.0): a grid past one wave (more than a token or two) runs in waves, and the two
// launches it replaces are faster. Occupancy queries only: safe during graph capture.
bool FitsOneWave(const void* kernel, int64_t blocks) {
  int dev = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it, and take the two launches
    return false;
  }
  return blocks <= int64_t{sms} * per_sm;
}

// Tokens up to which HcPre runs the split kernels.
constexpr int64_t kHcSplitMaxTokens = 64;

// The deferred Sinkhorn (hc = 4): one warp per token; lanes 0-15 hold the comb logits that
// HcFinishKernelImpl<., 4, true> left in comb and run SplitSinkhornWarp4 as that kernel's lanes
// would have (the other lanes' values are not read by the comb lanes' shuffles).
__global__ void __launch_bounds__(32)
    HcCombSinkhornKernelImpl(float* __restrict__ comb, int iters, float hc_eps) {
  const int64_t t = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x);
  const float z = lane < 16 ? comb[t * 16 + lane] : 0.0f;
  const float v = SplitSinkhornWarp4(z, iters, hc_eps);
  if (lane < 16) comb[t * 16 + lane] = v;
}

// grid (ceil(dim / kThreads), T); one thread per (token, i) computes all hc new streams from the
// sublayer output X (hc_post_common.cuh), reading the old ones first, so hp.out may alias
// hp.residual where X does not read either.
template <typename X>
__global__ void HcPostKernelImpl(X x, HcPostOperands hp) {
  __shared__ float p[kMaxMult], c[kMaxMult * kMaxMult];
  const int64_t t = blockIdx.y, dim = hp.dim;
  const int hc = static_cast<int>(hp.hc);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < hc) p[tid] = hp.post[t * hc + tid];
  if (tid < hc * hc) c[tid] = hp.comb[t * hc * hc + tid];
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + tid;
  if (i >= dim) return;
  float rv[kHcPostMaxMult];
  HcPostLoadResidual(hp, t, i, rv);
  const float xv = Bf16ToF32(x.Bits(t * dim + i));
  const int64_t at = t * hc * dim + i;
  HcPostFeature(xv, rv, p, c, hc, dim, hp.out + at,
                hp.out_f32 != nullptr ? hp.out_f32 + at : nullptr);
}

template <typename X>
cudaError_t LaunchHcPost(X x, int64_t T, const HcPostOperands& hp, cudaStream_t stream) {
  if (hp.hc < 1 || hp.hc > kMaxMult || hp.dim < 1) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((hp.dim + kThreads - 1) / kThreads),
                  static_cast<unsigned>(T));
  HcPostKernelImpl<X><<<grid, kThreads, 0, stream>>>(x, hp);
  return cudaGetLastError();
}

bool BadMult(int64_t hc) { return hc < 1 || hc > kHcMaxMult; }

// Which of HcPre's paths a call takes.
enum class HcPath { kLanes, kMix, kBlock };
HcPath PathFor(int64_t T, int64_t hc, int64_t dim, const uint16_t* y) {
  const int64_t mix = (2 + hc) * hc;
  const bool split =
      T <= kHcSplitMaxTokens && dim % 2 == 0 && reinterpret_cast<uintptr_t>(y) % 4 == 0;
  if (split && (hc * dim) % 32 == 0 && (mix * 32 + kThreads) * 4 <= dim * 2) return HcPath::kLanes;
  if (split && mix * 4 <= dim * 2) return HcPath::kMix;
  return HcPath::kBlock;
}

// HcPre (defer: HcPreDeferComb's outputs); nq.g set: then RmsNormQuant of y, fused into the
// finishing kernel where it holds y's row in registers (Flash's dim), else a launch of its own.
cudaError_t HcPreImpl(const uint16_t* streams, const float* fn, const float* base,
                      const float* scale, int64_t T, int64_t hc, int64_t dim,
                      int64_t sinkhorn_iters, float hc_eps, float norm_eps, uint16_t* y, float* pre,
                      float* post, float* comb, bool defer, const NormQuantArgs& nq, uint32_t* sync,
                      cudaStream_t stream) {
  if (BadMult(hc) || dim < 1 || sinkhorn_iters < 1) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const int64_t mix = (2 + hc) * hc;
  const HcPath path = PathFor(T, hc, dim, y);
  if (defer && (hc != 4 || path == HcPath::kBlock)) return cudaErrorInvalidValue;
  // The norm after the collapse, where the finishing kernel does not run it.
  const auto norm = [&](cudaError_t e) {
    if (e != cudaSuccess || nq.g == nullptr) return e;
    return RmsNormQuant(AsBf16(y), nq.g, T, dim, nq.eps, AsBf16(nq.y), AsE4m3(nq.q), nq.s, stream);
  };
  if (path == HcPath::kLanes) {
    const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(mix * kLaneParts + 1));
    const bool fuse_norm = defer && nq.g != nullptr && dim == int64_t{kPre} * kThreads;
    if (fuse_norm && sync != nullptr &&
        FitsOneWave(reinterpret_cast<const void*>(HcMixFinishKernelImpl), grid.x * grid.y)) {
      HcMixFinishKernelImpl<<<grid, kThreads, 0, stream>>>(streams, fn, base, scale, dim,
                                                           static_cast<int>(sinkhorn_iters), hc_eps,
                                                           norm_eps, y, pre, post, comb, nq, sync);
      return cudaGetLastError();
    }
    HcMixLanesKernelImpl<<<grid, kThreads, 0, stream>>>(streams, fn, static_cast<int>(hc), dim, y);
    const auto finish = fuse_norm ? HcFinishKernelImpl<true, 4, true, true>
                        : defer   ? HcFinishKernelImpl<true, 4, true>
                        : hc == 4 ? HcFinishKernelImpl<true, 4>
                                  : HcFinishKernelImpl<true, 0>;
    finish<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
        streams, base, scale, static_cast<int>(hc), dim, static_cast<int>(sinkhorn_iters), hc_eps,
        norm_eps, y, pre, post, comb, nq);
    return fuse_norm ? cudaGetLastError() : norm(cudaGetLastError());
  }
  if (path == HcPath::kMix) {
    const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(mix));
    HcMixKernelImpl<<<grid, kThreads, 0, stream>>>(streams, fn, static_cast<int>(hc), dim, norm_eps,
                                                   y);
    const auto finish = defer     ? HcFinishKernelImpl<false, 4, true>
                        : hc == 4 ? HcFinishKernelImpl<false, 4>
                                  : HcFinishKernelImpl<false, 0>;
    finish<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
        streams, base, scale, static_cast<int>(hc), dim, static_cast<int>(sinkhorn_iters), hc_eps,
        norm_eps, y, pre, post, comb, NormQuantArgs{});
    return norm(cudaGetLastError());
  }
  if (hc <= 4) {
    HcCollapseTiledKernelImpl<<<static_cast<unsigned>((T + kTileTokens - 1) / kTileTokens),
                                kThreads, 0, stream>>>(
        streams, fn, base, scale, T, static_cast<int>(hc), dim, static_cast<int>(sinkhorn_iters),
        hc_eps, norm_eps, y, pre, post, comb);
    return norm(cudaGetLastError());
  }
  HcCollapseKernelImpl<false><<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
      streams, fn, base, scale, static_cast<int>(hc), dim, static_cast<int>(sinkhorn_iters), hc_eps,
      norm_eps, y, pre, post, comb);
  return norm(cudaGetLastError());
}

}  // namespace

cudaError_t HcPre(const HcPreParams& p, cudaStream_t stream) {
  return HcPreImpl(Raw(p.streams), p.fn, p.base, p.scale, p.T, p.hc, p.dim, p.sinkhorn_iters,
                   p.hc_eps, p.norm_eps, Raw(p.y), p.pre, p.post, p.comb, false, NormQuantArgs{},
                   nullptr, stream);
}

bool HcPreDefersComb(int64_t T, int64_t hc, int64_t dim, const bf16_t* y) {
  return T >= 1 && hc == 4 && PathFor(T, hc, dim, Raw(y)) != HcPath::kBlock;
}

cudaError_t HcPreDeferComb(const HcPreParams& p, cudaStream_t stream) {
  return HcPreImpl(Raw(p.streams), p.fn, p.base, p.scale, p.T, p.hc, p.dim, p.sinkhorn_iters,
                   p.hc_eps, p.norm_eps, Raw(p.y), p.pre, p.post, p.comb, true, NormQuantArgs{},
                   nullptr, stream);
}

cudaError_t HcPreDeferCombNormQuant(const HcPreParams& p, const HcNormQuantParams& nq,
                                    cudaStream_t stream) {
  if (nq.g == nullptr) return cudaErrorInvalidValue;
  return HcPreImpl(Raw(p.streams), p.fn, p.base, p.scale, p.T, p.hc, p.dim, p.sinkhorn_iters,
                   p.hc_eps, p.norm_eps, Raw(p.y), p.pre, p.post, p.comb, true,
                   NormQuantArgs{nq.g, nq.rms_eps, Raw(nq.xn), Raw(nq.q), nq.s}, nq.sync, stream);
}

cudaError_t HcCombSinkhorn(float* comb, int64_t T, int64_t hc, int64_t sinkhorn_iters, float hc_eps,
                           cudaStream_t stream) {
  if (hc != 4 || sinkhorn_iters < 1 || T < 0) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  HcCombSinkhornKernelImpl<<<static_cast<unsigned>(T), 32, 0, stream>>>(
      comb, static_cast<int>(sinkhorn_iters), hc_eps);
  return cudaGetLastError();
}

cudaError_t HcPost(const bf16_t* x, const bf16_t* residual, const float* post, const float* comb,
                   int64_t T, int64_t hc, int64_t dim, bf16_t* out, cudaStream_t stream) {
  return LaunchHcPost(HcXBf16{Raw(x)}, T, {Raw(residual), post, comb, hc, dim, Raw(out)}, stream);
}

cudaError_t HcPost(const bf16_t* x, int64_t T, const HcPostOperands& hp, cudaStream_t stream) {
  return LaunchHcPost(HcXBf16{Raw(x)}, T, hp, stream);
}

cudaError_t HcPostF32(const float* x, int64_t T, const HcPostOperands& hp, cudaStream_t stream) {
  return LaunchHcPost(HcXF32{x}, T, hp, stream);
}

cudaError_t MoeCombineHcPost(const bf16_t* shared, const float* routed, int64_t T,
                             const HcPostOperands& hp, cudaStream_t stream) {
  return LaunchHcPost(HcXMoeBf16{Raw(shared), routed}, T, hp, stream);
}

cudaError_t MoeCombineF32HcPost(const float* shared, const float* routed, int64_t T,
                                const HcPostOperands& hp, cudaStream_t stream) {
  return LaunchHcPost(HcXMoeF32{shared, routed}, T, hp, stream);
}

cudaError_t HcEmbedStreams(const bf16_t* rows, int64_t T, int64_t hc, int64_t dim, bf16_t* streams,
                           cudaStream_t stream) {
  if (BadMult(hc) || dim < 1 || T < 0) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const bool vec = dim % 8 == 0 && reinterpret_cast<uintptr_t>(Raw(rows)) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(Raw(streams)) % 16 == 0;
  const int64_t n = T * (vec ? dim / 8 : dim);
  const unsigned blocks = GridStrideBlocks(n, kThreads);
  if (vec) {
    HcEmbedStreamsKernelImpl<true>
        <<<blocks, kThreads, 0, stream>>>(Raw(rows), T, static_cast<int>(hc), dim, Raw(streams));
  } else {
    HcEmbedStreamsKernelImpl<false>
        <<<blocks, kThreads, 0, stream>>>(Raw(rows), T, static_cast<int>(hc), dim, Raw(streams));
  }
  return cudaGetLastError();
}

cudaError_t HcHead(const HcHeadParams& p, cudaStream_t stream) {
  if (BadMult(p.hc) || p.dim < 1) return cudaErrorInvalidValue;
  if (p.T == 0) return cudaSuccess;
  HcCollapseKernelImpl<true><<<static_cast<unsigned>(p.T), kThreads, 0, stream>>>(
      Raw(p.streams), p.fn, p.base, p.scale, static_cast<int>(p.hc), p.dim, 0, p.hc_eps, p.norm_eps,
      Raw(p.z), nullptr, nullptr, nullptr);
  return cudaGetLastError();
}

const void* HcEmbedStreamsKernel() {
  return reinterpret_cast<const void*>(&HcEmbedStreamsKernelImpl<true>);
}
const void* HcPreKernel() { return reinterpret_cast<const void*>(&HcCollapseKernelImpl<false>); }
const void* HcPreTiledKernel() { return reinterpret_cast<const void*>(&HcCollapseTiledKernelImpl); }
const void* HcPostKernel() { return reinterpret_cast<const void*>(&HcPostKernelImpl<HcXBf16>); }
const void* HcHeadKernel() { return reinterpret_cast<const void*>(&HcCollapseKernelImpl<true>); }
const void* HcPreMixKernel() { return reinterpret_cast<const void*>(&HcMixKernelImpl); }
const void* HcPreFinishKernel() {
  return reinterpret_cast<const void*>(&HcFinishKernelImpl<false, 4>);
}
const void* HcPreMixLanesKernel() { return reinterpret_cast<const void*>(&HcMixLanesKernelImpl); }
const void* HcPreFinishLanesKernel() {
  return reinterpret_cast<const void*>(&HcFinishKernelImpl<true, 4>);
}
const void* HcPreFinishDeferKernel() {
  return reinterpret_cast<const void*>(&HcFinishKernelImpl<true, 4, true>);
}
const void* HcPreFinishNormKernel() {
  return reinterpret_cast<const void*>(&HcFinishKernelImpl<true, 4, true, true>);
}
const void* HcPreMixFinishKernel() { return reinterpret_cast<const void*>(&HcMixFinishKernelImpl); }
const void* HcCombSinkhornKernel() {
  return reinterpret_cast<const void*>(&HcCombSinkhornKernelImpl);
}

}  // namespace ss::cuda
