#include <algorithm>

#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/fp8_gemm.h"
#include "gpu_worker/kernels/fp8_linear.h"
#include "gpu_worker/kernels/hc_post_common.cuh"
#include "gpu_worker/kernels/hyper_connection.h"

namespace ss::cuda {
namespace {

constexpr int kBlock = 128;

// One warp per (row, 128-block): lane i handles 4 elements.
__global__ void QuantizeActKernelImpl(const uint16_t* __restrict__ x, int64_t n, int64_t nb,
                                      uint8_t* __restrict__ q, float* __restrict__ s) {
  const int64_t row = blockIdx.y;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (b >= nb) return;
  const int lane = threadIdx.x & 31;
  const int64_t i0 = b * kBlock;
  float v[4];
  for (int j = 0; j < 4; ++j) {
    const int64_t i = i0 + lane * 4 + j;
    v[j] = i < n ? Bf16ToF32(x[row * n + i]) : 0.0f;
  }
  QuantizeBlock128(v, lane, n - i0, q + row * n + i0, s + row * nb + b);
}

// e4m3 → fp32 without branches: the 7 magnitude bits placed as an fp32 exponent/mantissa are
// the value times 2^-120 (subnormals included, as fp32 subnormals), so one multiply fixes it.
// Code 0x7f (NaN) decodes as 480; checkpoints and quantised activations never hold it.
__device__ __forceinline__ float E4m3Fast(uint32_t c) {
  return __fmul_rn(__uint_as_float(((c & 0x80u) << 24) | ((c & 0x7fu) << 20)), 0x1p120f);
}

__device__ __forceinline__ void Load16(const uint8_t* p, bool full, int64_t avail, uint8_t* b) {
  if (full) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    for (int j = 0; j < 16; ++j) b[j] = static_cast<uint8_t>(w[j >> 2] >> (8 * (j & 3)));
  } else {
    for (int j = 0; j < 16; ++j) b[j] = j < avail ? p[j] : 0;
  }
}

// General fallback (any in, unaligned pointers): one warp per output feature o, all rows at
// once. Lane l reads 16 consecutive bytes (inside one 128-block), keeps its own partial sum per
// row scaled by s_act·s_w (powers of two, so scaling each partial is exact), and the warp
// reduces once at the end.
template <int kMaxRows, typename OutT>
__global__ void Fp8LinearGenericKernelImpl(const uint8_t* __restrict__ q,
                                           const float* __restrict__ sa, int64_t rows,
                                           const uint8_t* __restrict__ w,
                                           const uint8_t* __restrict__ ws, int64_t out, int64_t in,
                                           bool aligned, OutT* __restrict__ y) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (o >= out) return;
  const int lane = threadIdx.x & 31;
  const int64_t nb = (in + kBlock - 1) / kBlock;
  const uint8_t* wr = w + o * in;
  const uint8_t* wsr = ws + (o / kBlock) * nb;
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int nr = static_cast<int>(rows - r0 < kMaxRows ? rows - r0 : kMaxRows);
    float acc[kMaxRows];
    for (int r = 0; r < kMaxRows; ++r) acc[r] = 0.0f;
    for (int64_t base = lane * 16; base < in; base += 32 * 16) {
      const int64_t b = base / kBlock;
      const bool full = aligned && base + 16 <= in;
      uint8_t wb[16];
      Load16(wr + base, full, in - base, wb);
      float wf[16];
      for (int j = 0; j < 16; ++j) wf[j] = E4m3Fast(wb[j]);
      const float sw = Ue8m0ToF32(wsr[b]);
      for (int r = 0; r < nr; ++r) {
        uint8_t qb[16];
        Load16(q + (r0 + r) * in + base, full, in - base, qb);
        float part = 0.0f;
        for (int j = 0; j < 16; ++j) part = __fadd_rn(part, __fmul_rn(E4m3Fast(qb[j]), wf[j]));
        acc[r] = __fadd_rn(acc[r], __fmul_rn(part, __fmul_rn(sa[(r0 + r) * nb + b], sw)));
      }
    }
    for (int r = 0; r < nr; ++r) {
      for (int off = 16; off > 0; off >>= 1) {
        acc[r] = __fadd_rn(acc[r], __shfl_xor_sync(0xffffffffu, acc[r], off));
      }
    }
    if (lane == 0) {
      for (int r = 0; r < nr; ++r) StoreOut(y + (r0 + r) * out + o, acc[r]);
    }
  }
}

constexpr int kRowsPerPass = 8;
constexpr int kWarpsPerBlock = 8;

// Decode GEMV (rows ≤ 8, in % 128 == 0): one block per one or two tiles of 16 output features,
// the block's warps taking K's 128-blocks in turn (Fp8GemvKernelImpl). The weight tile is the A
// operand of m16n8k16 mma.sync (16 features × 16 k), the ≤ 8 activation rows the B operand (n =
// row): the tensor cores take the multiply-adds off the fp32 pipes, so batch 8 costs what batch 1
// does and the loop is bound by the weight loads. Lane (g, t) takes 16 bytes of feature rows g and
// g+8 and of activation row g per 64 k (U4Word's layout). Each 128-block's mma partial (exact
// products, fp32 sums) is scaled by s_act·s_w·2^16 and added into an fp32 accumulator, as Linear8's
// per-block sums are; warps meet in shared memory in a fixed order (no atomics).
constexpr int kGemvFeatures = 16;
constexpr int kGemvMaxWarps = 16;

// One 128-block: wa/wb = feature rows g, g+8, x = activation row g, [c] = bytes 64c + 16t...
__device__ __forceinline__ void GemvBlockMma(const uint4 (&wa)[2], const uint4 (&wb)[2],
                                             const uint4 (&x)[2], float (&p)[4]) {
#pragma unroll
  for (int c = 0; c < 2; ++c) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t a = U4Word(wa[c], s), b = U4Word(wb[c], s), xs = U4Word(x[c], s);
      MmaF16(p, E4m3x2ToF16x2(a, 0x1404), E4m3x2ToF16x2(b, 0x1404), E4m3x2ToF16x2(a, 0x3424),
             E4m3x2ToF16x2(b, 0x3424), E4m3x2ToF16x2(xs, 0x1404), E4m3x2ToF16x2(xs, 0x3424));
    }
  }
}

// acc += p · s_act[row]·s_w·2^16. Powers of two: each product is exact, so the fma rounds once,
// like Linear8's add. p[0], p[2] belong to activation row 2t, p[1], p[3] to row 2t+1.
__device__ __forceinline__ void GemvScaleAdd(const float (&p)[4], float s0, float s1,
                                             uint32_t sw_byte, float (&acc)[4]) {
  const float sw = __fmul_rn(Ue8m0ToF32(sw_byte), kF16Unscale);
  const float f0 = __fmul_rn(s0, sw), f1 = __fmul_rn(s1, sw);
  acc[0] = __fmaf_rn(p[0], f0, acc[0]);
  acc[1] = __fmaf_rn(p[1], f1, acc[1]);
  acc[2] = __fmaf_rn(p[2], f0, acc[2]);
  acc[3] = __fmaf_rn(p[3], f1, acc[3]);
}

// A lane's operands of one 128-block for kTiles feature tiles; the next block's are loaded while
// one is multiplied.
template <int kTiles>
struct GemvBlock {
  uint4 wa[kTiles][2], wb[kTiles][2], x[2];
  float s0, s1;         // s_act of rows 2t, 2t+1 (0 past `rows`)
  uint32_t sw[kTiles];  // the ue8m0 byte of each tile's 128-block of features
};

// One weight matrix of a launch: w [out, in] e4m3 with its ue8m0 scales ws, output y [rows, out].
template <typename OutT>
struct GemvMatrix {
  const uint8_t* w;
  const uint8_t* ws;
  int64_t out;
  OutT* y;
};

// A launch's matrices: blocks [0, blocks0) compute a's features, the rest b's (b.out = 0: none).
template <typename OutT>
struct GemvMatrices {
  GemvMatrix<OutT> a, b;
  int64_t blocks0;
};

// What the GEMV does with its sums. GemvStoreOut: y, as Fp8Gemv. GemvHcPostOut (bf16 y, one
// matrix): y (if not null), and HcPost of the bf16 result as the sublayer output (hp; the block's
// tokens' post and comb staged in shared memory, each output's old streams loaded before the K
// loop), the bits of Fp8Gemv then HcPost.
struct GemvStoreOut {
  static constexpr bool kHcPost = false;
};
struct GemvHcPostOut {
  static constexpr bool kHcPost = true;
  HcPostOperands hp;
};

// A block computes kTiles tiles of 16 features (kTiles·16 consecutive features); its warps take
// the 128-blocks of K in turn (warp w: blocks w, w + nwarps, ...: at any moment the block's warps
// read adjacent 128-byte pieces of each weight row). Each warp sums its blocks in that order, the
// warps' sums meet in warp order (GemvReduce): a fixed order for a given launch shape.
template <typename OutT, typename Epi, int kTiles>
__global__ void __launch_bounds__(32 * kGemvMaxWarps)
    Fp8GemvKernelImpl(const uint8_t* __restrict__ q, const float* __restrict__ sa, int rows,
                      GemvMatrices<OutT> m, int64_t in, Epi epi) {
  __shared__ float red[kGemvMaxWarps * 128];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int nwarps = blockDim.x >> 5;
  const int64_t nb = in / kBlock;
  const bool second = blockIdx.x >= m.blocks0;
  const uint8_t* __restrict__ w = second ? m.b.w : m.a.w;
  const uint8_t* __restrict__ ws = second ? m.b.ws : m.a.ws;
  const int64_t out = second ? m.b.out : m.a.out;
  OutT* __restrict__ y = second ? m.b.y : m.a.y;
  const int64_t ob =
      (static_cast<int64_t>(blockIdx.x) - (second ? m.blocks0 : 0)) * kGemvFeatures * kTiles;
  // Features past `out` repeat the last one; their results are not stored.
  const uint8_t* pa[kTiles];
  const uint8_t* pb[kTiles];
  const uint8_t* psw[kTiles];
#pragma unroll
  for (int u = 0; u < kTiles; ++u) {
    const int64_t o0 = ob + u * kGemvFeatures;
    pa[u] = w + min(o0 + g, out - 1) * in + 16 * t;
    pb[u] = w + min(o0 + g + 8, out - 1) * in + 16 * t;
    psw[u] = ws + (min(o0, out - 1) / kBlock) * nb;
  }
  const bool live = g < rows;
  // HcPost's inputs, loaded first so their latency overlaps the K loop.
  __shared__ float hp_p[Epi::kHcPost ? kFp8GemvMaxRows * kHcPostMaxMult : 1];
  __shared__ float hp_c[Epi::kHcPost ? kFp8GemvMaxRows * kHcPostMaxMult * kHcPostMaxMult : 1];
  float rv[kTiles][kHcPostMaxMult] = {};
  if constexpr (Epi::kHcPost) {
    const int hc = static_cast<int>(epi.hp.hc);
    for (int i = threadIdx.x; i < rows * hc; i += blockDim.x) hp_p[i] = epi.hp.post[i];
    for (int i = threadIdx.x; i < rows * hc * hc; i += blockDim.x) hp_c[i] = epi.hp.comb[i];
    // With ≥ 128 threads, thread i < 128 stores exactly output i of each tile (GemvReduce).
    const int i = threadIdx.x, r = GemvOutRow(i & 127);
#pragma unroll
    for (int u = 0; u < kTiles; ++u) {
      const int64_t o = ob + u * kGemvFeatures + GemvOutFeature(i & 127);
      if (blockDim.x >= 128 && i < 128 && r < rows && o < out) {
        HcPostLoadResidual(epi.hp, r, o, rv[u]);
      }
    }
  }
  const uint8_t* px = q + (live ? g : 0) * in + 16 * t;
  const float* sa0 = 2 * t < rows ? sa + (2 * t) * nb : nullptr;
  const float* sa1 = 2 * t + 1 < rows ? sa + (2 * t + 1) * nb : nullptr;
  const auto load = [&](GemvBlock<kTiles>& f, int64_t kb) {
    const int64_t off = kb * kBlock;
#pragma unroll
    for (int c = 0; c < 2; ++c) {  // weights are read once: streamed, evict-first
#pragma unroll
      for (int u = 0; u < kTiles; ++u) {
        f.wa[u][c] = __ldcs(reinterpret_cast<const uint4*>(pa[u] + off + 64 * c));
        f.wb[u][c] = __ldcs(reinterpret_cast<const uint4*>(pb[u] + off + 64 * c));
      }
      f.x[c] =
          live ? __ldg(reinterpret_cast<const uint4*>(px + off + 64 * c)) : make_uint4(0, 0, 0, 0);
    }
    f.s0 = sa0 ? __ldg(sa0 + kb) : 0.0f;
    f.s1 = sa1 ? __ldg(sa1 + kb) : 0.0f;
#pragma unroll
    for (int u = 0; u < kTiles; ++u) f.sw[u] = __ldg(psw[u] + kb);
  };
  float acc[kTiles][4] = {};
  DoubleBufferedBlocks<GemvBlock<kTiles>>(warp, nb, nwarps, load,
                                          [&](const GemvBlock<kTiles>& cur) {
#pragma unroll
                                            for (int u = 0; u < kTiles; ++u) {
                                              float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                              GemvBlockMma(cur.wa[u], cur.wb[u], cur.x, p);
                                              GemvScaleAdd(p, cur.s0, cur.s1, cur.sw[u], acc[u]);
                                            }
                                          });
#pragma unroll
  for (int u = 0; u < kTiles; ++u) {
    if (u > 0) __syncthreads();  // the previous tile's sums are read from `red`
    const int64_t o0 = ob + u * kGemvFeatures;
    if constexpr (Epi::kHcPost) {
      const int hc = static_cast<int>(epi.hp.hc);
      const int64_t dim = epi.hp.dim;
      GemvReduce(acc[u], red, rows, o0, out, [&](int r, int64_t o, float sum) {
        // Fewer than 128 threads: a thread stores several outputs, so their old streams are
        // loaded here, not ahead.
        if (blockDim.x < 128) HcPostLoadResidual(epi.hp, r, o, rv[u]);
        const uint16_t xb = F32ToBf16(sum);
        if (y != nullptr) y[r * out + o] = xb;
        const int64_t at = r * hc * dim + o;
        HcPostFeature(Bf16ToF32(xb), rv[u], hp_p + r * hc, hp_c + r * hc * hc, hc, dim,
                      epi.hp.out + at, epi.hp.out_f32 != nullptr ? epi.hp.out_f32 + at : nullptr);
      });
    } else {
      GemvReduceStore(acc[u], red, rows, o0, out, y);
    }
  }
}

bool FastPathFits(const uint8_t* q, const uint8_t* w, int64_t in) {
  return in % kBlock == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

template <typename OutT>
cudaError_t LinearGenericT(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                           const uint8_t* w_scale, int64_t out, int64_t in, OutT* y,
                           cudaStream_t stream) {
  if (rows == 0 || out == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((out + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const bool aligned = in % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w) % 16 == 0;
  Fp8LinearGenericKernelImpl<kRowsPerPass, OutT>
      <<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(q, s_act, rows, w, w_scale, out, in, aligned, y);
  return cudaGetLastError();
}

// One launch of the decode GEMV over ≤ kRowsPerPass rows. Blocks of two 16-feature tiles where
// that still gives about a block per multiprocessor (fewer blocks, each loading its activations
// once for both), else one tile.
template <typename OutT, typename Epi>
cudaError_t GemvLaunchPass(const uint8_t* q, const float* s_act, int64_t rows, int64_t in,
                           const GemvMatrix<OutT>& a, const GemvMatrix<OutT>& b, const Epi& epi,
                           cudaStream_t stream) {
  const int64_t nb = in / kBlock;
  const auto tiles_of = [](int64_t out, int64_t f) { return (out + f - 1) / f; };
  const int64_t blocks16 = tiles_of(a.out, kGemvFeatures) + tiles_of(b.out, kGemvFeatures);
  // (The HcPost epilogue keeps one tile: its second tile's streams spill and cost more than the
  // tile saves.)
  const bool two = !Epi::kHcPost && blocks16 >= 2 * DeviceSmCount() * 9 / 10;
  const int64_t f = kGemvFeatures * (two ? 2 : 1);
  const int64_t blocks0 = tiles_of(a.out, f);
  const int64_t blocks = blocks0 + tiles_of(b.out, f);
  // wq_b (in = 1024): 4 warps; wo_b (in = 8192): 8. Measured on an H200 (bench/RESULTS.md).
  const int64_t warps = GemvWarpsPerBlock(blocks16, nb, kGemvMaxWarps);
  const dim3 grid(static_cast<unsigned>(blocks)), block(static_cast<unsigned>(32 * warps));
  const GemvMatrices<OutT> m{a, b, blocks0};
  if constexpr (!Epi::kHcPost) {
    if (two) {
      Fp8GemvKernelImpl<OutT, Epi, 2>
          <<<grid, block, 0, stream>>>(q, s_act, static_cast<int>(rows), m, in, epi);
      return cudaGetLastError();
    }
  }
  Fp8GemvKernelImpl<OutT, Epi, 1>
      <<<grid, block, 0, stream>>>(q, s_act, static_cast<int>(rows), m, in, epi);
  return cudaGetLastError();
}

// The decode GEMV of one or two matrices (b.out = 0: one) on the same activations, one launch
// per 8 rows; the fast path must fit (FastPathFits) for every matrix.
template <typename OutT>
cudaError_t GemvLaunch(const uint8_t* q, const float* s_act, int64_t rows, int64_t in,
                       const GemvMatrix<OutT>& a, const GemvMatrix<OutT>& b, cudaStream_t stream) {
  const int64_t nb = in / kBlock;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowsPerPass) {
    const int64_t nr = std::min<int64_t>(kRowsPerPass, rows - r0);
    const cudaError_t e = GemvLaunchPass<OutT>(
        q + r0 * in, s_act + r0 * nb, nr, in, {a.w, a.ws, a.out, a.y + r0 * a.out},
        {b.w, b.ws, b.out, b.out > 0 ? b.y + r0 * b.out : nullptr}, GemvStoreOut{}, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <typename OutT>
cudaError_t GemvT(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                  const uint8_t* w_scale, int64_t out, int64_t in, OutT* y, cudaStream_t stream) {
  if (rows == 0 || out == 0) return cudaSuccess;
  if (!FastPathFits(q, w, in)) {
    return LinearGenericT(q, s_act, rows, w, w_scale, out, in, y, stream);
  }
  return GemvLaunch<OutT>(q, s_act, rows, in, {w, w_scale, out, y}, {nullptr, nullptr, 0, nullptr},
                          stream);
}

// An output buffer as the public entry points' element type.
bf16_t* Typed(uint16_t* y) { return AsBf16(y); }
float* Typed(float* y) { return y; }

template <typename OutT>
cudaError_t LinearT(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                    const uint8_t* w_scale, int64_t out, int64_t in, OutT* y, cudaStream_t stream) {
  if (rows <= kFp8GemvMaxRows) return GemvT(q, s_act, rows, w, w_scale, out, in, y, stream);
  if (out == 0) return cudaSuccess;
  return FastPathFits(q, w, in) ? Fp8Gemm(AsE4m3(q), s_act, rows, AsE4m3(w), AsUe8m0(w_scale), out,
                                          in, Typed(y), stream)
                                : LinearGenericT(q, s_act, rows, w, w_scale, out, in, y, stream);
}

}  // namespace

cudaError_t QuantizeActE4m3(const bf16_t* x, int64_t rows, int64_t n, e4m3_t* q, float* s,
                            cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  const dim3 grid(static_cast<unsigned>((nb + 7) / 8), static_cast<unsigned>(rows));
  QuantizeActKernelImpl<<<grid, 256, 0, stream>>>(Raw(x), n, nb, Raw(q), s);
  return cudaGetLastError();
}

cudaError_t Fp8LinearGeneric(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                             const ue8m0_t* w_scale, int64_t out, int64_t in, bf16_t* y,
                             cudaStream_t stream) {
  return LinearGenericT(Raw(q), s_act, rows, Raw(w), Raw(w_scale), out, in, Raw(y), stream);
}
cudaError_t Fp8LinearGeneric(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                             const ue8m0_t* w_scale, int64_t out, int64_t in, float* y,
                             cudaStream_t stream) {
  return LinearGenericT(Raw(q), s_act, rows, Raw(w), Raw(w_scale), out, in, y, stream);
}
cudaError_t Fp8Gemv(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                    const ue8m0_t* w_scale, int64_t out, int64_t in, bf16_t* y,
                    cudaStream_t stream) {
  return GemvT(Raw(q), s_act, rows, Raw(w), Raw(w_scale), out, in, Raw(y), stream);
}
cudaError_t Fp8Gemv(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                    const ue8m0_t* w_scale, int64_t out, int64_t in, float* y,
                    cudaStream_t stream) {
  return GemvT(Raw(q), s_act, rows, Raw(w), Raw(w_scale), out, in, y, stream);
}
cudaError_t Fp8Linear(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                      const ue8m0_t* w_scale, int64_t out, int64_t in, bf16_t* y,
                      cudaStream_t stream) {
  return LinearT(Raw(q), s_act, rows, Raw(w), Raw(w_scale), out, in, Raw(y), stream);
}
cudaError_t Fp8LinearPair(const Fp8LinearPairParams& p, cudaStream_t stream) {
  const uint8_t* q = Raw(p.q);
  const float* s_act = p.s_act;
  const int64_t rows = p.rows, in = p.in;
  const uint8_t *w0 = Raw(p.m0.w), *w_scale0 = Raw(p.m0.w_scale);
  const uint8_t *w1 = Raw(p.m1.w), *w_scale1 = Raw(p.m1.w_scale);
  const int64_t out0 = p.m0.out, out1 = p.m1.out;
  uint16_t *y0 = Raw(p.m0.y), *y1 = Raw(p.m1.y);
  if (rows == 0 || out0 == 0 || out1 == 0 || rows > kFp8GemvMaxRows || !FastPathFits(q, w0, in) ||
      !FastPathFits(q, w1, in)) {
    const cudaError_t e = LinearT(q, s_act, rows, w0, w_scale0, out0, in, y0, stream);
    return e == cudaSuccess ? LinearT(q, s_act, rows, w1, w_scale1, out1, in, y1, stream) : e;
  }
  return GemvLaunch<uint16_t>(q, s_act, rows, in, {w0, w_scale0, out0, y0},
                              {w1, w_scale1, out1, y1}, stream);
}
cudaError_t Fp8Linear(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                      const ue8m0_t* w_scale, int64_t out, int64_t in, float* y,
                      cudaStream_t stream) {
  return LinearT(Raw(q), s_act, rows, Raw(w), Raw(w_scale), out, in, y, stream);
}

cudaError_t Fp8LinearHcPost(const Fp8LinearHcPostParams& p, cudaStream_t stream) {
  const uint8_t *q = Raw(p.q), *w = Raw(p.w), *w_scale = Raw(p.w_scale);
  const float* s_act = p.s_act;
  const int64_t rows = p.rows, out = p.out, in = p.in;
  uint16_t* y = Raw(p.y);
  const HcPostOperands& hp = p.hp;
  if (hp.hc < 1 || hp.hc > kHcPostMaxMult || hp.dim != out) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (rows <= kFp8GemvMaxRows && FastPathFits(q, w, in)) {
    return GemvLaunchPass<uint16_t>(q, s_act, rows, in, {w, w_scale, out, y},
                                    {nullptr, nullptr, 0, nullptr}, GemvHcPostOut{hp}, stream);
  }
  if (y == nullptr) return cudaErrorInvalidValue;
  const cudaError_t e = LinearT(q, s_act, rows, w, w_scale, out, in, y, stream);
  return e == cudaSuccess ? HcPost(AsBf16(y), rows, hp, stream) : e;
}

const void* Fp8LinearHcPostKernel() {
  return reinterpret_cast<const void*>(&Fp8GemvKernelImpl<uint16_t, GemvHcPostOut, 1>);
}
const void* QuantizeActE4m3Kernel() {
  return reinterpret_cast<const void*>(&QuantizeActKernelImpl);
}
const void* Fp8LinearKernel() {
  return reinterpret_cast<const void*>(&Fp8GemvKernelImpl<uint16_t, GemvStoreOut, 2>);
}
const void* Fp8LinearGenericKernel() {
  return reinterpret_cast<const void*>(&Fp8LinearGenericKernelImpl<kRowsPerPass, uint16_t>);
}

}  // namespace ss::cuda
