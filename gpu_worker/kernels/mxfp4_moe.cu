#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/mxfp4_moe.h"
#include "gpu_worker/kernels/mxfp4_moe_common.cuh"
#include "gpu_worker/kernels/shared_memory.h"

namespace ss::cuda {
namespace {

// ---- The grouped GEMMs' tiling ------------------------------------------------------------------
//
// A work item is one tile of kBM routes of one expert (MoeRouting::tile_offsets) times kBRows
// weight rows: the up kernel's rows are 64 intermediate rows of w1 and the same 64 of w3 (so a
// thread holds gate and up of the same element and the SwiGLU runs in registers), the down
// kernel's are 128 rows of w2 (output features). K streams one 128-block a stage through a
// 3-stage cp.async pipeline of the activations (bf16, gathered rows) and the raw weight bytes
// (e2m1 pairs and the four ue8m0 scales of each row). 8 warps, each all 64 routes times 16 weight
// rows (up: 8 of w1 and the same 8 of w3); each lane decodes its B fragment's e2m1 codes to bf16
// in registers once for the four m16 tiles. Work items are taken route tile by route tile (a
// tile's weight-row items consecutive), so that the blocks running at once share a few route
// tiles' activations and one or two experts' weights in L2 rather than each reading its own.
//
// K order inside a 32-group. The mma's k index is permuted the same way for both operands: lane
// t's 16 activation bytes (8 bf16) of a group and its 4 weight bytes (8 e2m1) are the group's
// elements 8t .. 8t+7; mma #0 takes 8t..8t+3, mma #1 8t+4..8t+7. Each group's 32 products are
// summed by the two mmas from zero, scaled by the weights' ue8m0 scale and added to the fp32
// accumulator in K order: Linear4's order, whose group partial is the exact sum rounded once.
constexpr int kBM = kMxfp4MoeTileRoutes;  // 64 routes per tile
constexpr int kBK = 128;                  // K per stage: one activation-scale block
constexpr int kBRows = 128;               // weight rows per tile
constexpr int kUpInter = 64;              // intermediate rows per up tile (w1 and w3 each)
constexpr int kThreads = 256;
constexpr int kStages = 3;
// Shared rows: activations 256 bytes padded to 320 (the 16-byte fragment loads of rows g and g+1
// fall in opposite halves of the banks), weights 64 bytes padded to 80 (lanes (g, t) read word
// 20g + t + 4·group mod 32: distinct banks).
constexpr int kAPitch = 320;
constexpr int kBPitch = 80;
constexpr int kStageBytes = kBM * kAPitch + kBRows * kBPitch + kBRows * 4;
constexpr int kGemmSmem = kStages * kStageBytes;
static_assert(kGemmSmem + 1024 <= kSm86MaxSharedPerBlock);
constexpr int kMaxCtas = 1024;  // work items are strided over at most this many blocks
constexpr int kMaxTopK = kMxfp4MoeMaxTopK;

// Rows of the routing kernel's per-warp histograms.
constexpr int kRouteWarps = 8;

// Eight e2m1 codes (a word, element 2j in the low nibble of byte j) as four bf16 pairs holding
// their exact values: out[j] = (element 2j, element 2j+1). The magnitude's 3 bits select the bf16's
// low and high bytes from two byte tables (PRMT); the sign bit moves to bit 15 / 31.
__device__ __forceinline__ void E2m1x8ToBf16x2(uint32_t w, uint32_t (&out)[4]) {
  // bf16 of {0, 0.5, 1, 1.5, 2, 3, 4, 6}: low bytes {00,00,80,C0,00,40,80,C0}, high bytes
  // {00,3F,3F,3F,40,40,40,40}.
  constexpr uint32_t kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;
  constexpr uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u;
  const uint32_t mag = w & 0x77777777u;
  const uint32_t lo0 = __byte_perm(kLo0, kLo1, mag), hi0 = __byte_perm(kHi0, kHi1, mag);
  const uint32_t lo1 = __byte_perm(kLo0, kLo1, mag >> 16), hi1 = __byte_perm(kHi0, kHi1, mag >> 16);
  out[0] = __byte_perm(lo0, hi0, 0x5140) | ((w << 12) & 0x8000u) | ((w << 24) & 0x80000000u);
  out[1] = __byte_perm(lo0, hi0, 0x7362) | ((w << 4) & 0x8000u) | ((w << 16) & 0x80000000u);
  out[2] = __byte_perm(lo1, hi1, 0x5140) | ((w >> 4) & 0x8000u) | ((w << 8) & 0x80000000u);
  out[3] = __byte_perm(lo1, hi1, 0x7362) | ((w >> 12) & 0x8000u) | (w & 0x80000000u);
}

// The tile of sorted routes a work item covers.
struct RouteTile {
  int expert;    // in [expert_begin, expert_end)
  int64_t row0;  // first sorted position
  int rows;      // 1..kBM
};

// Tile j of the group (counted from the group's first tile).
__device__ __forceinline__ RouteTile FindTile(const MoeRouting& r, int eb, int ee, int64_t j) {
  const int64_t J = r.tile_offsets[eb] + j;
  int lo = eb, hi = ee;  // tile_offsets[lo] <= J < tile_offsets[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (r.tile_offsets[mid] <= J) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  RouteTile t;
  t.expert = lo;
  t.row0 = r.offsets[lo] + (J - r.tile_offsets[lo]) * kBM;
  const int64_t left = r.offsets[lo + 1] - t.row0;
  t.rows = static_cast<int>(left < kBM ? left : kBM);
  return t;
}

// One stage's fragment loads and mmas: acc[mi][ni] += the products of K-block `st` for a warp
// owning all kBM routes (kMi = 4 m16 tiles) and the kNi n8 tiles of B whose first shared rows are
// brow[ni]. Each group's partial p (exact products, summed from zero) is scaled and added as
// fma(p, s_w, acc): p·s_w is exact (a power of two), so that is Linear4's multiply then add.
constexpr int kMi = kBM / 16;
constexpr int kNi = 2;
__device__ __forceinline__ void ConsumeStage(const uint8_t* st, const int (&brow)[kNi], int lane,
                                             float (&acc)[kMi][kNi][4]) {
  const uint8_t* a = st;
  const uint8_t* b = st + kBM * kAPitch;
  const uint32_t* s = reinterpret_cast<const uint32_t*>(st + kBM * kAPitch + kBRows * kBPitch);
  const int g = lane >> 2, t = lane & 3;
  uint32_t sc[kNi][2];
#pragma unroll
  for (int ni = 0; ni < kNi; ++ni) {
    sc[ni][0] = s[brow[ni] + 2 * t];
    sc[ni][1] = s[brow[ni] + 2 * t + 1];
  }
#pragma unroll 2  // fully unrolled, the live fragments pass 128 registers
  for (int gi = 0; gi < 4; ++gi) {
    uint32_t bf[kNi][4];
    float s0[kNi], s1[kNi];
#pragma unroll
    for (int ni = 0; ni < kNi; ++ni) {
      const uint32_t w =
          *reinterpret_cast<const uint32_t*>(b + (brow[ni] + g) * kBPitch + gi * 16 + t * 4);
      E2m1x8ToBf16x2(w, bf[ni]);
      s0[ni] = Ue8m0ToF32((sc[ni][0] >> (8 * gi)) & 0xffu);
      s1[ni] = Ue8m0ToF32((sc[ni][1] >> (8 * gi)) & 0xffu);
    }
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi) {
      const int r = mi * 16 + g;
      const uint4 a0 = *reinterpret_cast<const uint4*>(a + r * kAPitch + gi * 64 + t * 16);
      const uint4 a1 = *reinterpret_cast<const uint4*>(a + (r + 8) * kAPitch + gi * 64 + t * 16);
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) {
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        MmaBf16(p, a0.x, a1.x, a0.y, a1.y, bf[ni][0], bf[ni][1]);
        MmaBf16(p, a0.z, a1.z, a0.w, a1.w, bf[ni][2], bf[ni][3]);
        acc[mi][ni][0] = __fmaf_rn(p[0], s0[ni], acc[mi][ni][0]);
        acc[mi][ni][1] = __fmaf_rn(p[1], s1[ni], acc[mi][ni][1]);
        acc[mi][ni][2] = __fmaf_rn(p[2], s0[ni], acc[mi][ni][2]);
        acc[mi][ni][3] = __fmaf_rn(p[3], s1[ni], acc[mi][ni][3]);
      }
    }
  }
}

struct GroupArgs {
  MoeRouting routing;
  int eb, ee;
  const uint8_t* base;
  Mxfp4ExpertLayout L;
  const uint16_t* xq;
  uint16_t* h;
  float* y;
  float limit;
  bool round_output;
};

// Up: for each work item (part p, 64 intermediate rows n0.., route tile), g = bf16(xq·w1ᵀ),
// u = bf16(xq·w3ᵀ), h[pos, p·part_inter + n] = bf16(w_route · SwiGLU(g, u)).
__global__ void __launch_bounds__(kThreads, 2) Mxfp4MoeUpKernelImpl(const GroupArgs args) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int32_t s_tok[kBM];
  __shared__ float s_wt[kBM];
  const MoeRouting& R = args.routing;
  const Mxfp4ExpertLayout& L = args.L;
  const int64_t tiles = R.tile_offsets[args.ee] - R.tile_offsets[args.eb];
  const int64_t ntn = L.parts * (L.part_inter / kUpInter);
  const int64_t items = tiles * ntn;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t dim = L.dim, nk = dim / kBK, hw = L.parts * L.part_inter;
  const int brow[kNi] = {warp * 8, 64 + warp * 8};  // gate rows, the same rows of up
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t j = item / ntn, nt = item % ntn;
    const RouteTile rt = FindTile(R, args.eb, args.ee, j);
    const int part = static_cast<int>(nt / (L.part_inter / kUpInter));
    const int64_t n0 = (nt % (L.part_inter / kUpInter)) * kUpInter;
    __syncthreads();  // the previous item's readers of s_tok / s_wt are done
    if (threadIdx.x < kBM) {
      const int64_t pos = rt.row0 + min(static_cast<int>(threadIdx.x), rt.rows - 1);
      s_tok[threadIdx.x] = R.route_token[pos];
      s_wt[threadIdx.x] = R.route_weight[pos];
    }
    __syncthreads();
    const uint8_t* ex = args.base + static_cast<int64_t>(rt.expert - args.eb) * L.expert_bytes;
    const uint8_t *w1 = ex + L.w1[part], *w3 = ex + L.w3[part];
    const uint8_t *s1 = ex + L.w1_scale[part], *s3 = ex + L.w3_scale[part];
    const int64_t rb = dim / 2, sb = dim / 32;
    float acc[kMi][kNi][4] = {};
    CpAsyncPipeline<kStages>(
        nk,
        [&](int stage, int64_t kb) {
          uint8_t* st = smem + stage * kStageBytes;
          for (int i = threadIdx.x; i < kBM * 16; i += kThreads) {
            const int r = i >> 4, c = i & 15;
            CpAsync16(st + r * kAPitch + c * 16,
                      args.xq + static_cast<int64_t>(s_tok[r]) * dim + kb * kBK + c * 8);
          }
          uint8_t* b = st + kBM * kAPitch;
          for (int i = threadIdx.x; i < kBRows * 4; i += kThreads) {
            const int r = i >> 2, c = i & 3;
            const uint8_t* w = r < 64 ? w1 : w3;
            CpAsync16(b + r * kBPitch + c * 16,
                      w + RowBlockOffset(n0 + (r & 63), kb, rb, L.tile_rows) + c * 16);
          }
          if (threadIdx.x < kBRows) {
            const int r = threadIdx.x;
            const uint8_t* s = r < 64 ? s1 : s3;
            CpAsync4(st + kBM * kAPitch + kBRows * kBPitch + r * 4,
                     s + (n0 + (r & 63)) * sb + kb * 4);
          }
        },
        [&](int stage, int64_t) { ConsumeStage(smem + stage * kStageBytes, brow, lane, acc); });
    // Epilogue: tile 0 holds gate, tile 1 the up values of the same elements.
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = mi * 16 + g + hr * 8;
        if (r >= rt.rows) continue;
        const float wt = s_wt[r];
        uint16_t* hrow = args.h + (rt.row0 + r) * hw + part * L.part_inter + n0;
        uint32_t packed = 0;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float gv = RoundBf16(acc[mi][0][hr * 2 + c]);
          const float uv = RoundBf16(acc[mi][1][hr * 2 + c]);
          const float v = __fmul_rn(wt, SwiGluValue(gv, uv, args.limit));
          packed |= static_cast<uint32_t>(F32ToBf16(v)) << (16 * c);
        }
        *reinterpret_cast<uint32_t*>(hrow + brow[0] + 2 * t) = packed;
      }
    }
  }
}

// Down: for each work item (128 output features n0.., route tile), y[slot, n] = (bf16 of, when
// round_output) Σ_p h[pos, part p]·w2[p]ᵀ.
__global__ void __launch_bounds__(kThreads, 2) Mxfp4MoeDownKernelImpl(const GroupArgs args) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int32_t s_slot[kBM];
  const MoeRouting& R = args.routing;
  const Mxfp4ExpertLayout& L = args.L;
  const int64_t tiles = R.tile_offsets[args.ee] - R.tile_offsets[args.eb];
  const int64_t dim = L.dim;
  const int64_t ntn = dim / kBRows;
  const int64_t items = tiles * ntn;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t kpp = L.part_inter / kBK, nk = L.parts * kpp, hw = L.parts * L.part_inter;
  const int64_t rb = L.part_inter / 2;
  const int brow[kNi] = {warp * 16, warp * 16 + 8};
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t j = item / ntn, nt = item % ntn;
    const RouteTile rt = FindTile(R, args.eb, args.ee, j);
    const int64_t n0 = nt * kBRows;
    __syncthreads();
    if (threadIdx.x < kBM) {
      s_slot[threadIdx.x] = R.route_slot[rt.row0 + min(static_cast<int>(threadIdx.x), rt.rows - 1)];
    }
    __syncthreads();
    const uint8_t* ex = args.base + static_cast<int64_t>(rt.expert - args.eb) * L.expert_bytes;
    float acc[kMi][kNi][4] = {};
    CpAsyncPipeline<kStages>(
        nk,
        [&](int stage, int64_t kb) {
          const int part = static_cast<int>(kb / kpp);
          const int64_t kbl = kb % kpp;
          uint8_t* st = smem + stage * kStageBytes;
          for (int i = threadIdx.x; i < kBM * 16; i += kThreads) {
            const int r = i >> 4, c = i & 15;
            const int64_t pos = rt.row0 + min(r, rt.rows - 1);
            CpAsync16(st + r * kAPitch + c * 16, args.h + pos * hw + kb * kBK + c * 8);
          }
          uint8_t* b = st + kBM * kAPitch;
          const uint8_t* w2 = ex + L.w2[part];
          for (int i = threadIdx.x; i < kBRows * 4; i += kThreads) {
            const int r = i >> 2, c = i & 3;
            CpAsync16(b + r * kBPitch + c * 16,
                      w2 + RowBlockOffset(n0 + r, kbl, rb, L.tile_rows) + c * 16);
          }
          if (threadIdx.x < kBRows) {
            const int r = threadIdx.x;
            CpAsync4(
                st + kBM * kAPitch + kBRows * kBPitch + r * 4,
                ex + L.w2_scale[part] + (n0 + r) * L.w2_scale_stride + L.w2_scale_col0 + kbl * 4);
          }
        },
        [&](int stage, int64_t) { ConsumeStage(smem + stage * kStageBytes, brow, lane, acc); });
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = mi * 16 + g + hr * 8;
        if (r >= rt.rows) continue;
        float* yrow = args.y + static_cast<int64_t>(s_slot[r]) * dim + n0;
#pragma unroll
        for (int ni = 0; ni < kNi; ++ni) {
          float v0 = acc[mi][ni][hr * 2], v1 = acc[mi][ni][hr * 2 + 1];
          if (args.round_output) {
            v0 = RoundBf16(v0);
            v1 = RoundBf16(v1);
          }
          *reinterpret_cast<float2*>(yrow + brow[ni] + 2 * t) = make_float2(v0, v1);
        }
      }
    }
  }
}

// Linear4's activation quantisation returned as values (FakeQuantE4m3): one warp per
// (row, 128-block), lane l holding elements 4l .. 4l+3. Rows [*row_lo, *row_hi) when row_lo is
// set (the group's sorted positions), else [0, rows); a grid-stride loop over the warps.
__global__ void __launch_bounds__(256)
    FakeQuantE4m3KernelImpl(const uint16_t* x, int64_t rows, int64_t n, uint16_t* y,
                            const int32_t* row_lo, const int32_t* row_hi) {
  const int64_t lo = row_lo ? *row_lo : 0, hi = row_lo ? *row_hi : rows;
  const int64_t nb = n / 128, total = (hi - lo) * nb;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t wi = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       wi < total; wi += warps) {
    const int64_t r = lo + wi / nb, b = wi % nb;
    const int64_t off = r * n + b * 128 + lane * 4;
    const uint2 raw = *reinterpret_cast<const uint2*>(x + off);
    float v[4] = {Bf16ToF32(raw.x & 0xffffu), Bf16ToF32(raw.x >> 16), Bf16ToF32(raw.y & 0xffffu),
                  Bf16ToF32(raw.y >> 16)};
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j]));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = Pow2Scale(amax, 1e-4f, 448.0f);
    const float inv = __frcp_rn(sc);
    uint16_t o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint8_t c = F32ToE4m3(fminf(fmaxf(__fmul_rn(v[j], inv), -448.0f), 448.0f));
      o[j] = F32ToBf16(__fmul_rn(E4m3ToF32(c), sc));
    }
    *reinterpret_cast<uint2*>(y + off) = make_uint2(o[0] | (static_cast<uint32_t>(o[1]) << 16),
                                                    o[2] | (static_cast<uint32_t>(o[3]) << 16));
  }
}

// Counting sort of the route slots by expert in one block: each warp owns a contiguous range of
// slots; pass 1 counts its experts (lanes with equal ids found by __match_any_sync), a scan gives
// every (warp, expert) its first position, pass 2 places the slots in order. Deterministic: no
// atomics.
__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeBuildRoutingKernelImpl(const int32_t* __restrict__ ids, const float* __restrict__ weights,
                              int64_t TK, int K, int E, int eb, int ee, MoeRouting R) {
  __shared__ int32_t hist[kRouteWarps][kMxfp4MoeMaxExperts];
  __shared__ int32_t warp_tot[kRouteWarps][2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < kRouteWarps * kMxfp4MoeMaxExperts; i += blockDim.x) {
    hist[i / kMxfp4MoeMaxExperts][i % kMxfp4MoeMaxExperts] = 0;
  }
  __syncthreads();
  const int64_t seg = ((TK + kRouteWarps - 1) / kRouteWarps + 31) / 32 * 32;
  const int64_t lo = warp * seg, hi = min(TK, lo + seg);
  const uint32_t lt = (1u << lane) - 1u;
  for (int64_t base = lo; base < hi; base += 32) {
    const int64_t i = base + lane;
    const int e = i < hi ? ids[i] : -1;
    const bool valid = e >= eb && e < ee;
    const uint32_t peers = __match_any_sync(0xffffffffu, valid ? e : -1);
    if (valid && (peers & lt) == 0) hist[warp][e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  // Thread i owns experts 4i .. 4i+3 (E <= 1024 = 4 x 256 threads).
  int tot[4], til[4], sum_tot = 0, sum_til = 0;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int e = threadIdx.x * 4 + q;
    int c = 0;
    if (e < E) {
      for (int w = 0; w < kRouteWarps; ++w) c += hist[w][e];
    }
    tot[q] = c;
    til[q] = (c + kBM - 1) / kBM;
    sum_tot += c;
    sum_til += til[q];
  }
  // Block-wide exclusive scan of (sum_tot, sum_til).
  int inc_tot = sum_tot, inc_til = sum_til;
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, inc_tot, o);
    const int b = __shfl_up_sync(0xffffffffu, inc_til, o);
    if (lane >= o) {
      inc_tot += a;
      inc_til += b;
    }
  }
  if (lane == 31) {
    warp_tot[warp][0] = inc_tot;
    warp_tot[warp][1] = inc_til;
  }
  __syncthreads();
  int pre_tot = inc_tot - sum_tot, pre_til = inc_til - sum_til;
  for (int w = 0; w < warp; ++w) {
    pre_tot += warp_tot[w][0];
    pre_til += warp_tot[w][1];
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int e = threadIdx.x * 4 + q;
    if (e <= E) {
      R.offsets[e] = pre_tot;
      R.tile_offsets[e] = pre_til;
    }
    if (e < E) {
      int run = pre_tot;
      for (int w = 0; w < kRouteWarps; ++w) {
        const int c = hist[w][e];
        hist[w][e] = run;
        run += c;
      }
    }
    pre_tot += tot[q];
    pre_til += til[q];
  }
  if (E == 4 * static_cast<int>(blockDim.x) && threadIdx.x == blockDim.x - 1) {
    R.offsets[E] = pre_tot;  // E = 1024: the end is no thread's expert
    R.tile_offsets[E] = pre_til;
  }
  __syncthreads();
  for (int64_t base = lo; base < hi; base += 32) {
    const int64_t i = base + lane;
    const int e = i < hi ? ids[i] : -1;
    const bool valid = e >= eb && e < ee;
    const uint32_t peers = __match_any_sync(0xffffffffu, valid ? e : -1);
    if (valid) {
      const int pos = hist[warp][e] + __popc(peers & lt);
      R.route_token[pos] = static_cast<int32_t>(i / K);
      R.route_slot[pos] = static_cast<int32_t>(i);
      R.route_weight[pos] = weights[i];
    }
    __syncwarp();
    if (valid && (peers & lt) == 0) hist[warp][e] += __popc(peers);
    __syncwarp();
  }
}

// sum[t, 4c .. 4c+3]: t's routes in ascending (expert id, k), added in fp32 from 0.
__global__ void __launch_bounds__(256)
    MoeCombineRoutesKernelImpl(const float* __restrict__ y, const int32_t* __restrict__ ids,
                               int64_t T, int K, int64_t dim, int eb, int ee, bool accumulate,
                               float* __restrict__ sum) {
  const int64_t d4 = dim / 4;
  GridStride(T * d4, [&](int64_t i) {
    const int64_t t = i / d4, c = i % d4;
    int order[kMaxTopK];
    int n = 0;
    for (int k = 0; k < K; ++k) {
      const int e = ids[t * K + k];
      if (e < eb || e >= ee) continue;
      int m = n++;
      while (m > 0 && ids[t * K + order[m - 1]] > e) {
        order[m] = order[m - 1];
        --m;
      }
      order[m] = k;
    }
    float4 acc = accumulate ? reinterpret_cast<const float4*>(sum + t * dim)[c]
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int q = 0; q < n; ++q) {
      const float4 v = reinterpret_cast<const float4*>(y + (t * K + order[q]) * dim)[c];
      acc.x = __fadd_rn(acc.x, v.x);
      acc.y = __fadd_rn(acc.y, v.y);
      acc.z = __fadd_rn(acc.z, v.z);
      acc.w = __fadd_rn(acc.w, v.w);
    }
    reinterpret_cast<float4*>(sum + t * dim)[c] = acc;
  });
}

unsigned GemmGrid(int64_t items) {
  return static_cast<unsigned>(items < kMaxCtas ? (items > 0 ? items : 1) : kMaxCtas);
}

}  // namespace

int64_t MoeRoutingScratchBytes(int64_t, int, int) { return 0; }

cudaError_t MoeBuildRouting(const MoeBuildRoutingParams& p, cudaStream_t stream) {
  if (p.E < 1 || p.E > kMxfp4MoeMaxExperts || p.K < 1 || p.K > kMaxTopK || p.T < 0 ||
      p.expert_begin < 0 || p.expert_end < p.expert_begin || p.expert_end > p.E ||
      p.T * p.K > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  MoeBuildRoutingKernelImpl<<<1, kRouteWarps * 32, 0, stream>>>(
      p.ids, p.weights, p.T * p.K, p.K, p.E, p.expert_begin, p.expert_end, p.routing);
  return cudaGetLastError();
}

cudaError_t FakeQuantE4m3(const bf16_t* x, int64_t rows, int64_t n, bf16_t* y,
                          cudaStream_t stream) {
  if (rows < 0 || n <= 0 || n % 128 != 0 || !AlignedTo(x, 8) || !AlignedTo(y, 8)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  const int64_t warps = rows * (n / 128);
  const int64_t blocks = (warps + 7) / 8;
  FakeQuantE4m3KernelImpl<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(
      Raw(x), rows, n, Raw(y), nullptr, nullptr);
  return cudaGetLastError();
}

cudaError_t Mxfp4MoeGroup(const Mxfp4MoeGroupParams& p, cudaStream_t stream) {
  const Mxfp4ExpertLayout& L = p.layout;
  if (p.T < 0 || p.K < 1 || p.K > kMaxTopK || p.expert_begin < 0 || p.expert_end < p.expert_begin ||
      p.expert_end > kMxfp4MoeMaxExperts || !Mxfp4LayoutOk(L) || !AlignedTo(p.base, 16) ||
      !AlignedTo(p.xq, 16) || !AlignedTo(p.h, 16) || !AlignedTo(p.y, 8)) {
    return cudaErrorInvalidValue;
  }
  const int64_t TK = p.T * p.K;
  if (TK == 0 || p.expert_begin == p.expert_end) return cudaSuccess;
  GroupArgs a;
  a.routing = p.routing;
  a.eb = p.expert_begin;
  a.ee = p.expert_end;
  a.base = p.base;
  a.L = L;
  a.xq = Raw(p.xq);
  a.h = Raw(p.h);
  a.y = p.y;
  a.limit = p.limit;
  a.round_output = p.round_output_bf16;
  // The most route tiles the group can have: every expert's last tile may be partial.
  const int64_t max_tiles = (TK + kBM - 1) / kBM + (p.expert_end - p.expert_begin);
  const int64_t hw = L.parts * L.part_inter;
  Mxfp4MoeUpKernelImpl<<<GemmGrid(max_tiles * (hw / kUpInter)), kThreads, kGemmSmem, stream>>>(a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int64_t qwarps = TK * (hw / 128);
  const int64_t qblocks = (qwarps + 7) / 8;
  FakeQuantE4m3KernelImpl<<<static_cast<unsigned>(qblocks < 2048 ? qblocks : 2048), 256, 0,
                            stream>>>(a.h, TK, hw, a.h, p.routing.offsets + p.expert_begin,
                                      p.routing.offsets + p.expert_end);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  Mxfp4MoeDownKernelImpl<<<GemmGrid(max_tiles * (L.dim / kBRows)), kThreads, kGemmSmem, stream>>>(
      a);
  return cudaGetLastError();
}

cudaError_t MoeCombineRoutes(const MoeCombineRoutesParams& p, cudaStream_t stream) {
  if (p.T < 0 || p.K < 1 || p.K > kMaxTopK || p.dim <= 0 || p.dim % 4 != 0 || !AlignedTo(p.y, 16) ||
      !AlignedTo(p.sum, 16)) {
    return cudaErrorInvalidValue;
  }
  if (p.T == 0) return cudaSuccess;
  MoeCombineRoutesKernelImpl<<<GridStrideBlocks(p.T * p.dim / 4, 256), 256, 0, stream>>>(
      p.y, p.ids, p.T, p.K, p.dim, p.expert_begin, p.expert_end, p.accumulate, p.sum);
  return cudaGetLastError();
}

__global__ void __launch_bounds__(256)
    SplitResidentRoutesKernelImpl(const int32_t* __restrict__ ids, int64_t n,
                                  const int32_t* __restrict__ slot_of, int E,
                                  int32_t* __restrict__ resident, int32_t* __restrict__ host,
                                  unsigned long long* __restrict__ counts,
                                  unsigned long long* __restrict__ expert_counts) {
  GridStride(n, [&](int64_t i) {
    const int32_t e = ids[i];
    const int32_t slot = e >= 0 && e < E ? slot_of[e] : -1;
    resident[i] = slot;
    host[i] = slot >= 0 ? -1 : e;
    if (counts != nullptr && e >= 0 && e < E) {
      atomicAdd(&counts[0], 1ull);
      if (slot >= 0) atomicAdd(&counts[1], 1ull);
    }
    if (expert_counts != nullptr && slot >= 0) atomicAdd(&expert_counts[e], 1ull);
  });
}

cudaError_t SplitResidentRoutes(const SplitResidentRoutesParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.E < 0 || p.E > kMxfp4MoeMaxExperts) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  SplitResidentRoutesKernelImpl<<<GridStrideBlocks(p.n, 256), 256, 0, stream>>>(
      p.ids, p.n, p.slot_of, p.E, p.resident, p.host, p.counts, p.expert_counts);
  return cudaGetLastError();
}

std::vector<SharedMemoryOptIn> Mxfp4MoeOptIns() {
  return {
      {"Mxfp4MoeGroup (up)", reinterpret_cast<const void*>(&Mxfp4MoeUpKernelImpl), kGemmSmem},
      {"Mxfp4MoeGroup (down)", reinterpret_cast<const void*>(&Mxfp4MoeDownKernelImpl), kGemmSmem}};
}

const void* MoeBuildRoutingKernel() {
  return reinterpret_cast<const void*>(&MoeBuildRoutingKernelImpl);
}
const void* FakeQuantE4m3Kernel() {
  return reinterpret_cast<const void*>(&FakeQuantE4m3KernelImpl);
}
const void* Mxfp4MoeGemmUpKernel() { return reinterpret_cast<const void*>(&Mxfp4MoeUpKernelImpl); }
const void* Mxfp4MoeGemmDownKernel() {
  return reinterpret_cast<const void*>(&Mxfp4MoeDownKernelImpl);
}
const void* MoeCombineRoutesKernel() {
  return reinterpret_cast<const void*>(&MoeCombineRoutesKernelImpl);
}
const void* SplitResidentRoutesKernel() {
  return reinterpret_cast<const void*>(&SplitResidentRoutesKernelImpl);
}

}  // namespace ss::cuda
