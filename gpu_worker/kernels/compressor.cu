// KV compressor step (spec §3.7); mirrors common/model/compressor.cc (CompressorFeed, Pool).
#include <type_traits>

#include "gpu_worker/kernels/compressor.h"
#include "gpu_worker/kernels/compressor_common.cuh"
#include "gpu_worker/kernels/limits.h"

namespace ss::cuda {
namespace {

constexpr int kThreads = 512;  // one channel per thread for d = 512
constexpr int kWarps = kThreads / 32;
constexpr int kUpdateThreads = 256;
constexpr int kMaxDim = static_cast<int>(kCompressorMaxDim);
constexpr unsigned kMaxGrid = 1u << 20;

struct Params {
  const float* v;
  const float* g;
  int64_t ld;
  const float* ape;
  const float* norm;
  const float* freqs;
  int ratio, d, rope_dim, width;
  bool overlap, indexer, fp8_round;
  float eps, hadamard_scale;
};

// One sequence's view: its first position and block (start / ratio), V/G rows and state.
struct Seq {
  int64_t start, end, row0, cur;
  const float* kv;
  const float* score;
};

__device__ __forceinline__ Seq LoadSeq(const CompressorBatch& b, int64_t s, int ratio) {
  const int64_t r0 = b.row_begin[s], start = b.start[s];
  return Seq{start,           start + (b.row_begin[s + 1] - r0), r0, start / ratio, b.kv_state[s],
             b.score_state[s]};
}

// (score, value) of the token at position t (position r in its block), column col: from this
// step's rows (score = G + ape[r], as the reference's slot write) or from state slot `slot`.
__device__ __forceinline__ void Tap(const Params& p, const Seq& s, int64_t t, int r, int slot,
                                    int col, float& score, float& kv) {
  if (t >= s.start) {
    const int64_t row = (s.row0 + t - s.start) * p.ld + col;
    kv = p.v[row];
    score = __fadd_rn(p.g[row], p.ape[r * p.width + col]);
  } else {
    kv = s.kv[slot * p.width + col];
    score = s.score[slot * p.width + col];
  }
}

// The i-th tap of channel ch of block j. Overlap: taps 0..3 are the A half of block j−1 (state:
// the "current" slots 4+i if that block was current when the step began, else the "previous"
// slots i), taps 4..7 the B half of block j.
__device__ __forceinline__ void BlockTap(const Params& p, const Seq& s, int64_t j, int i, int ch,
                                         float& score, float& kv) {
  if (p.overlap) {
    const int64_t b = i < 4 ? j - 1 : j;
    const int r = i & 3;
    Tap(p, s, 4 * b + r, r, (b == s.cur ? 4 : 0) + r, i < 4 ? ch : p.d + ch, score, kv);
  } else {
    Tap(p, s, p.ratio * j + i, i, i, ch, score, kv);
  }
}

// The reference's double sum of fp32 values rounded once to fp32, or its fp32 stand-in: TwoSum
// compensation (s + c is the exact sum but for the rounding of c).
struct SumF64 {
  double s = 0.0;
  __device__ __forceinline__ void Add(float x) { s += static_cast<double>(x); }
  __device__ __forceinline__ float Value() const { return static_cast<float>(s); }
};
struct SumF32 {
  float s = 0.0f, c = 0.0f;
  __device__ __forceinline__ void Add(float x) {
    float t, e;
    TwoSum(s, x, t, e);
    s = t;
    c = __fadd_rn(c, e);
  }
  __device__ __forceinline__ float Value() const { return __fadd_rn(s, c); }
};

template <bool kFp64>
__device__ __forceinline__ float Exp(float x) {
  return kFp64 ? ExpRnDev(x) : expf(x);
}

// Sum over the block of one partial sum per thread; every thread gets the total. The reference's
// sums of squares are exact in double, so the order does not matter there.
__device__ float BlockSum(SumF64 v, double* scratch) {
  double x = v.s;
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = x;
  __syncthreads();
  SumF64 t;
  for (int w = 0; w < kWarps; ++w) t.s += scratch[w];
  __syncthreads();
  return t.Value();
}
__device__ float BlockSum(SumF32 v, double* scratch) {
  float* f = reinterpret_cast<float*>(scratch);  // kWarps pairs (s, c)
  for (int o = 16; o > 0; o >>= 1) {
    const float so = __shfl_xor_sync(0xffffffffu, v.s, o);
    const float co = __shfl_xor_sync(0xffffffffu, v.c, o);
    float t, e;
    TwoSum(v.s, so, t, e);
    v.c = __fadd_rn(__fadd_rn(v.c, co), e);
    v.s = t;
  }
  if ((threadIdx.x & 31) == 0) {
    f[2 * (threadIdx.x >> 5)] = v.s;
    f[2 * (threadIdx.x >> 5) + 1] = v.c;
  }
  __syncthreads();
  SumF32 t;
  float c = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    t.Add(f[2 * w]);
    c = __fadd_rn(c, f[2 * w + 1]);
  }
  __syncthreads();
  t.c = __fadd_rn(t.c, c);
  return t.Value();
}

// Tap groups (warps per 32 channels) of the pooling: all warps for many taps, else one warp (a
// thread per channel) with 32·kWarps channels per block.
__host__ __device__ __forceinline__ int PoolGroups(int taps) { return taps >= kWarps ? kWarps : 1; }

// Combines the partial sums of the G warps base..base+G−1 for each channel (lane) in warp order;
// every thread of those warps gets its channel's total.
__device__ float CombineWarps(SumF64 v, int base, int G, float (*)[32], float (*)[32],
                              double (*pd)[32]) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  pd[warp][lane] = v.s;
  __syncthreads();
  SumF64 t;
  for (int w = 0; w < G; ++w) t.s += pd[base + w][lane];
  __syncthreads();
  return t.Value();
}
__device__ float CombineWarps(SumF32 v, int base, int G, float (*ps)[32], float (*pc)[32],
                              double (*)[32]) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  ps[warp][lane] = v.s;
  pc[warp][lane] = v.c;
  __syncthreads();
  SumF32 t;
  float c = 0.0f;
  for (int w = 0; w < G; ++w) {
    t.Add(ps[base + w][lane]);
    c = __fadd_rn(c, pc[base + w][lane]);
  }
  __syncthreads();
  t.c = __fadd_rn(t.c, c);
  return t.Value();
}

// Pool of compressor.cc (max, sum of fp32 exps, fp32 probabilities, sum of fp32 products; the
// sums in double as the reference, or compensated fp32). Lane = channel (coalesced tap loads);
// with G = PoolGroups(taps) tap groups, warp w takes the taps i ≡ w mod G of its 32 channels
// and the G partial sums are combined in warp order. That is another order than the
// reference's, but its double sums are exact or within an ulp of double, which the rounding to
// float hides. Writes bf16(c) to the entry's row (the finishing kernel's input).
// grid (max_new · chunks, n_seqs), chunks = ceil(d / (32·kWarps/G)).
template <bool kFp64>
__global__ void __launch_bounds__(kThreads)
    CompressorPoolKernelImpl(Params p, CompressorBatch b, uint16_t* __restrict__ entries) {
  using Sum = typename std::conditional<kFp64, SumF64, SumF32>::type;
  __shared__ float ps[kWarps][32], pc[kWarps][32];
  __shared__ double pd[kWarps][32];
  const int64_t sid = blockIdx.y;
  const Seq s = LoadSeq(b, sid, p.ratio);
  const int n = p.overlap ? 8 : p.ratio;
  const int G = PoolGroups(n), per_block = 32 * (kWarps / G);
  const int chunks = (p.d + per_block - 1) / per_block;
  const int64_t e = blockIdx.x / chunks;
  const int64_t j = s.cur + e;
  if (j >= s.end / p.ratio) return;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int grp = warp % G, base = warp - grp;
  const int ch = static_cast<int>(blockIdx.x % chunks) * per_block + (warp / G) * 32 + lane;
  const bool valid = ch < p.d;
  float sc, kv, mx = -INFINITY;
  for (int i = grp; valid && i < n; i += G) {
    BlockTap(p, s, j, i, ch, sc, kv);
    mx = mx < sc ? sc : mx;  // std::max
  }
  ps[warp][lane] = mx;
  __syncthreads();
  mx = ps[base][lane];
  for (int w = 1; w < G; ++w) mx = mx < ps[base + w][lane] ? ps[base + w][lane] : mx;
  __syncthreads();
  Sum sum;
  for (int i = grp; valid && i < n; i += G) {
    BlockTap(p, s, j, i, ch, sc, kv);
    sum.Add(Exp<kFp64>(__fsub_rn(sc, mx)));
  }
  const float fsum = CombineWarps(sum, base, G, ps, pc, pd);
  Sum acc;
  for (int i = grp; valid && i < n; i += G) {
    BlockTap(p, s, j, i, ch, sc, kv);
    const float prob = __fdiv_rn(Exp<kFp64>(__fsub_rn(sc, mx)), fsum);
    acc.Add(__fmul_rn(kv, prob));
  }
  const float c = CombineWarps(acc, base, G, ps, pc, pd);
  if (grp == 0 && valid) entries[(b.entry_begin[sid] + e) * p.d + ch] = F32ToBf16(c);
}

// The rest of an entry from its bf16(c) row, in place: RMSNorm (MeanSquare: sum of fp32 squares,
// times fp32(1/d)), RoPE, FP8sim or Hadamard + FP4sim. grid (max_new, n_seqs).
template <bool kFp64>
__global__ void __launch_bounds__(kThreads)
    CompressorFinishKernelImpl(Params p, CompressorBatch b, uint16_t* __restrict__ entries) {
  using Sum = typename std::conditional<kFp64, SumF64, SumF32>::type;
  __shared__ float c[kMaxDim];
  __shared__ double scratch[kWarps];
  const int64_t sid = blockIdx.y;
  const Seq s = LoadSeq(b, sid, p.ratio);
  const int64_t j = s.cur + blockIdx.x;
  if (j >= s.end / p.ratio) return;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  uint16_t* out = entries + (b.entry_begin[sid] + blockIdx.x) * p.d;
  Sum sq;
  for (int ch = tid; ch < p.d; ch += kThreads) {
    c[ch] = Bf16ToF32(out[ch]);
    sq.Add(__fmul_rn(c[ch], c[ch]));
  }
  const float ms = __fmul_rn(BlockSum(sq, scratch), __fdiv_rn(1.0f, static_cast<float>(p.d)));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, p.eps)));
  for (int ch = tid; ch < p.d; ch += kThreads) {
    c[ch] = RoundBf16Dev(__fmul_rn(p.norm[ch], __fmul_rn(c[ch], r)));
  }
  __syncthreads();

  // RoPE at the block's first position (RopeCosSin + ApplyRope).
  const int pairs = p.rope_dim / 2;
  const float fpos = static_cast<float>(p.ratio * j);
  for (int i = tid; i < pairs; i += kThreads) {
    const float angle = __fmul_rn(fpos, p.freqs[i]);
    const float cs = static_cast<float>(cos(static_cast<double>(angle)));
    const float sn = static_cast<float>(sin(static_cast<double>(angle)));
    float* e = c + (p.d - p.rope_dim) + 2 * i;
    const float a = e[0], bb = e[1];
    e[0] = RoundBf16Dev(__fsub_rn(__fmul_rn(a, cs), __fmul_rn(bb, sn)));
    e[1] = RoundBf16Dev(__fadd_rn(__fmul_rn(a, sn), __fmul_rn(bb, cs)));
  }
  __syncthreads();

  if (p.indexer) {
    if (warp == 0) {
      const int per = p.d / 32;
      float v[kHadamardMaxPerLane];
#pragma unroll
      for (int k = 0; k < kHadamardMaxPerLane; ++k) v[k] = k < per ? c[lane + 32 * k] : 0.0f;
      WarpHadamardFp4<typename std::conditional<kFp64, double, float>::type>(v, per,
                                                                             p.hadamard_scale);
#pragma unroll
      for (int k = 0; k < kHadamardMaxPerLane; ++k) {
        if (k < per) out[lane + 32 * k] = F32ToBf16(v[k]);
      }
    }
    return;
  }
  // Main: FP8sim_64 of the nope dims (codecs.cc Fp8SimInplace), one warp per 64-block.
  const int nope = p.d - p.rope_dim;
  for (int b0 = warp * 64; b0 < nope; b0 += kWarps * 64) {
    const int len = nope - b0 < 64 ? nope - b0 : 64;
    float amax = 0.0f;
    for (int i = lane; i < len; i += 32) amax = fmaxf(amax, fabsf(c[b0 + i]));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = Pow2Scale(amax, 1e-4f, 448.0f);
    for (int i = lane; i < len; i += 32) {
      float q = __fdiv_rn(c[b0 + i], sc);
      q = q < -448.0f ? -448.0f : (448.0f < q ? 448.0f : q);  // std::clamp
      q = p.fp8_round ? E4m3ToF32(F32ToE4m3(q)) : RoundBf16Dev(q);
      c[b0 + i] = RoundBf16Dev(__fmul_rn(q, sc));
    }
  }
  __syncthreads();
  for (int ch = tid; ch < p.d; ch += kThreads) out[ch] = F32ToBf16(c[ch]);
}

// grid (ceil(width / kUpdateThreads), n_seqs): one thread per state column advances every slot of
// that column, reading the old values it needs before writing any.
__global__ void __launch_bounds__(kUpdateThreads)
    CompressorUpdateKernelImpl(Params p, CompressorBatch b) {
  const int64_t sid = blockIdx.y;
  const int col = static_cast<int>(blockIdx.x) * kUpdateThreads + static_cast<int>(threadIdx.x);
  if (col >= p.width) return;
  const Seq s = LoadSeq(b, sid, p.ratio);
  if (s.end == s.start) return;
  float* kv = b.kv_state[sid];
  float* score = b.score_state[sid];
  const int64_t m = p.ratio, W = p.width;
  // The tokens whose slot write survives: the last m of the step (ratio 4: the "current" slots).
  const int64_t t0 = s.end - m > s.start ? s.end - m : s.start;
  if (p.overlap) {
    float old_kv[4], old_score[4];
    for (int i = 0; i < 4; ++i) {
      old_kv[i] = kv[(4 + i) * W + col];
      old_score[i] = score[(4 + i) * W + col];
    }
    float sc, v;
    for (int64_t t = t0; t < s.end; ++t) {
      Tap(p, s, t, static_cast<int>(t % 4), 0, col, sc, v);
      kv[(4 + t % 4) * W + col] = v;
      score[(4 + t % 4) * W + col] = sc;
    }
    if (s.end / 4 > s.start / 4) {  // a block was emitted: its tokens become the "previous" ones
      const int64_t jl = s.end / 4 - 1;
      for (int i = 0; i < 4; ++i) {
        const int64_t t = 4 * jl + i;
        if (t >= s.start) {
          Tap(p, s, t, i, 0, col, sc, v);
        } else {
          sc = old_score[i];
          v = old_kv[i];
        }
        kv[i * W + col] = v;
        score[i * W + col] = sc;
      }
    }
  } else {
    float sc, v;
    for (int64_t t = t0; t < s.end; ++t) {
      Tap(p, s, t, static_cast<int>(t % m), 0, col, sc, v);
      kv[(t % m) * W + col] = v;
      score[(t % m) * W + col] = sc;
    }
  }
}

__global__ void CompressorResetKernelImpl(float* __restrict__ kv, float* __restrict__ score,
                                          int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    kv[i] = 0.0f;
    score[i] = -INFINITY;
  }
}

bool IsPow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

cudaError_t CompressorResetState(float* kv, float* score, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  CompressorResetKernelImpl<<<static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid),
                              kThreads, 0, stream>>>(kv, score, n);
  return cudaGetLastError();
}

cudaError_t CompressorStep(const CompressorStepParams& sp, cudaStream_t stream) {
  const float *v = sp.v, *g = sp.g, *ape = sp.ape, *norm = sp.norm, *rope_freqs = sp.rope_freqs;
  const int64_t ld = sp.ld;
  const CompressorShape& shape = sp.shape;
  const CompressorBatch& batch = sp.batch;
  uint16_t* entries = Raw(sp.entries);
  const int64_t m = shape.ratio, d = shape.head_dim, rd = shape.rope_dim;
  const bool indexer = shape.kind == CompressorKind::kIndexer;
  const int64_t width = (m == 4 ? 2 : 1) * d;
  if (m < 1 || d < 1 || d > kCompressorMaxDim || rd < 0 || rd % 2 != 0 || rd > d || ld < width ||
      batch.n_seqs < 0 || batch.n_seqs > 65535 || batch.max_new < 0 ||
      batch.max_new >= (int64_t{1} << 27)) {  // × d/32 ≤ 16 pooling blocks each
    return cudaErrorInvalidValue;
  }
  if (indexer && (!IsPow2(d) || d < 32 || d > kHadamardMaxDim)) return cudaErrorInvalidValue;
  if (batch.n_seqs == 0) return cudaSuccess;
  Params p{v,
           g,
           ld,
           ape,
           norm,
           rope_freqs,
           static_cast<int>(m),
           static_cast<int>(d),
           static_cast<int>(rd),
           static_cast<int>(width),
           m == 4,
           indexer,
           shape.fp8_round,
           shape.norm_eps,
           static_cast<float>(1.0 / sqrt(static_cast<double>(d)))};
  const unsigned seqs = static_cast<unsigned>(batch.n_seqs);
  if (batch.max_new > 0) {
    const int64_t per_block = 32 * (kWarps / PoolGroups(m == 4 ? 8 : static_cast<int>(m)));
    const dim3 pool(static_cast<unsigned>(batch.max_new * ((d + per_block - 1) / per_block)), seqs);
    const dim3 finish(static_cast<unsigned>(batch.max_new), seqs);
    if (shape.fp64) {
      CompressorPoolKernelImpl<true><<<pool, kThreads, 0, stream>>>(p, batch, entries);
      CompressorFinishKernelImpl<true><<<finish, kThreads, 0, stream>>>(p, batch, entries);
    } else {
      CompressorPoolKernelImpl<false><<<pool, kThreads, 0, stream>>>(p, batch, entries);
      CompressorFinishKernelImpl<false><<<finish, kThreads, 0, stream>>>(p, batch, entries);
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  CompressorUpdateKernelImpl<<<
      dim3(static_cast<unsigned>((width + kUpdateThreads - 1) / kUpdateThreads), seqs),
      kUpdateThreads, 0, stream>>>(p, batch);
  return cudaGetLastError();
}

const void* CompressorResetKernel() {
  return reinterpret_cast<const void*>(&CompressorResetKernelImpl);
}
const void* CompressorPoolKernel() {
  return reinterpret_cast<const void*>(&CompressorPoolKernelImpl<true>);
}
const void* CompressorPoolFp32Kernel() {
  return reinterpret_cast<const void*>(&CompressorPoolKernelImpl<false>);
}
const void* CompressorFinishKernel() {
  return reinterpret_cast<const void*>(&CompressorFinishKernelImpl<true>);
}
const void* CompressorFinishFp32Kernel() {
  return reinterpret_cast<const void*>(&CompressorFinishKernelImpl<false>);
}
const void* CompressorUpdateKernel() {
  return reinterpret_cast<const void*>(&CompressorUpdateKernelImpl);
}

}  // namespace ss::cuda
