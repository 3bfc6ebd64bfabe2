#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/mxfp4_moe_common.cuh"
#include "gpu_worker/kernels/mxfp4_moe_decode.h"
#include "gpu_worker/kernels/shared_memory.h"

namespace ss::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 4;
constexpr int kMaxChunk = 4;   // routes per pass (columns of the m16n8 tile; 8 would fit)
constexpr int kRowPitch = 80;  // a weight row's 64 bytes, padded: ldmatrix rows on distinct banks
constexpr int kStageBytes = 16 * kRowPitch + 16 * 4;  // 16 rows and their scale words
constexpr int kWeightSmem = kWarps * kStages * kStageBytes;
constexpr int kMaxSmem = 96 * 1024;
constexpr float kActUnscale = 4194304.0f;  // 2^22: f16 e4m3 (2^-8) times f16 e2m1 (2^-14)
constexpr int kUpRows = kWarps * 8;        // intermediate rows per up block
constexpr int kDownRows = kWarps * 16;     // output features per down block
constexpr int kMaxRoutes = kMxfp4MoeDecodeMaxRoutes;

// An activation row's bytes in shared memory: K f16 codes plus 64 (routes 2 apart fall on
// different halves of the banks for the B-fragment loads).
__host__ __device__ constexpr int64_t ActPitch(int64_t k) { return 2 * k + 64; }
__host__ __device__ constexpr int64_t DecodeSmem(int chunk, int64_t k) {
  return kWeightSmem + chunk * (ActPitch(k) + (k / 128) * 4);
}

struct DecodeArgs {
  const uint16_t* x;
  const int32_t* slots;
  const float* weights;
  int TK, K, n_slots, chunk;  // chunk: routes per pass the shared memory holds
  const uint8_t* base;
  Mxfp4ExpertLayout L;
  uint16_t* h;
  float* y;
  float limit;
  bool round_output;
};

// The block's expert and its routes (ascending choice index): the blockIdx.y-th distinct slot in
// [0, n_slots) among the T·K choices, in ascending slot order; returns false (uniformly) when
// there are fewer distinct slots.
struct BlockRoutes {
  int32_t val[kMaxRoutes];
  int32_t first[kMaxRoutes];
  int32_t route[kMaxRoutes];
  int32_t slot, n;
};
__device__ bool FindBlockRoutes(const DecodeArgs& a, BlockRoutes& s) {
  const int i = threadIdx.x;
  if (i == 0) {
    s.slot = -1;
    s.n = 0;
  }
  int v = -1;
  if (i < a.TK) {
    v = a.slots[i];
    v = v >= 0 && v < a.n_slots ? v : -1;
    s.val[i] = v;
  }
  __syncthreads();
  if (i < a.TK) {
    bool first = v >= 0;
    for (int j = 0; j < i && first; ++j) first = s.val[j] != v;
    s.first[i] = first;
  }
  __syncthreads();
  if (i < a.TK && s.first[i]) {
    int rank = 0;
    for (int j = 0; j < a.TK; ++j) rank += s.first[j] && s.val[j] < v;
    if (rank == static_cast<int>(blockIdx.y)) s.slot = v;
  }
  __syncthreads();
  const int slot = s.slot;
  if (slot < 0) return false;
  if (i < a.TK && v == slot) {
    int idx = 0;
    for (int j = 0; j < i; ++j) idx += s.val[j] == slot;
    s.route[idx] = i;
    if (s.first[i]) {
      int n = 0;
      for (int j = 0; j < a.TK; ++j) n += s.val[j] == slot;
      s.n = n;
    }
  }
  __syncthreads();
  return true;
}

// Quantises rows[r] (r < rows; bf16 [k]) in 1x128 blocks as FakeQuantE4m3 does (QuantizeBlock128)
// into act: row r at r·ActPitch(k), each 8-element chunk as the f16x2 pairs (0,4), (1,5), (2,6),
// (3,7) of its codes' values times 2^-8 (the B fragments of the two mmas of its K group), and
// ascale[r·(k/128) + b] = the block's scale times 2^22. Block-wide; ends with __syncthreads.
template <typename RowOf>
__device__ void QuantizeRows(const RowOf& row_of, int rows, int64_t k, uint8_t* act,
                             float* ascale) {
  __shared__ __align__(16) uint8_t codes[kWarps][128];
  __shared__ float sc[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t nb = k / 128, total = rows * nb;
  constexpr int kBatch = 4;  // a warp's blocks whose loads are in flight together
  for (int64_t it0 = warp; it0 < total; it0 += kBatch * kWarps) {
    uint2 raw[kBatch] = {};
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      const int64_t it = it0 + q * kWarps;
      if (it < total) {
        raw[q] = *reinterpret_cast<const uint2*>(row_of(static_cast<int>(it / nb)) +
                                                 (it % nb) * 128 + lane * 4);
      }
    }
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      const int64_t it = it0 + q * kWarps;
      if (it >= total) break;
      const int r = static_cast<int>(it / nb);
      const int64_t b = it % nb;
      const float v[4] = {Bf16ToF32(raw[q].x & 0xffffu), Bf16ToF32(raw[q].x >> 16),
                          Bf16ToF32(raw[q].y & 0xffffu), Bf16ToF32(raw[q].y >> 16)};
      QuantizeBlock128(v, lane, 128, codes[warp], &sc[warp]);
      __syncwarp();
      if (lane < 16) {
        const uint2 c = *reinterpret_cast<const uint2*>(codes[warp] + lane * 8);
        const uint32_t w0 = __byte_perm(c.x, c.y, 0x5140), w1 = __byte_perm(c.x, c.y, 0x7362);
        *reinterpret_cast<uint4*>(act + r * ActPitch(k) + (b * 16 + lane) * 16) =
            make_uint4(E4m3x2ToF16x2(w0, 0x1404), E4m3x2ToF16x2(w0, 0x3424),
                       E4m3x2ToF16x2(w1, 0x1404), E4m3x2ToF16x2(w1, 0x3424));
      }
      if (lane == 0) ascale[r * nb + b] = __fmul_rn(sc[warp], kActUnscale);
      __syncwarp();
    }
  }
  __syncthreads();
}

// Eight e2m1 codes (a word: element 2j the low nibble of byte j) as four f16x2 holding each
// code's value times 2^-14: p = (e0, e4), (e1, e5), (e2, e6), (e3, e7). An f16 whose low byte is 0
// and whose high byte is sign << 7 | magnitude << 1 (the code's 3 magnitude bits as exponent bits
// 1..0 and the top mantissa bit) is that value; the bytes are formed for the low and the high
// nibbles of all four bytes at once.
__device__ __forceinline__ void E2m1x8ToF16x2(uint32_t w, uint32_t (&p)[4]) {
  const uint32_t even = ((w << 4) & 0x80808080u) | ((w << 1) & 0x0e0e0e0eu);  // e0, e2, e4, e6
  const uint32_t odd = (w & 0x80808080u) | ((w >> 3) & 0x0e0e0e0eu);          // e1, e3, e5, e7
  p[0] = __byte_perm(even, 0u, 0x2404);
  p[1] = __byte_perm(odd, 0u, 0x2404);
  p[2] = even & 0xff00ff00u;
  p[3] = odd & 0xff00ff00u;
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

// One K-block (4 groups) of a warp's 16 weight rows (stage: 16 rows at kRowPitch, then their
// scale words) against the chunk's routes: acc[] as m16n8 fragment (rows g, g + 8; routes 2t,
// 2t + 1). act_row: route g's activation row when route_g (g < the chunk's routes; else any
// row, read and replaced by zeros), sa0/sa1: the block scales (times 2^22) of routes 2t, 2t + 1.
__device__ __forceinline__ void ConsumeKBlock(const uint8_t* stage, const uint8_t* act_row,
                                              bool route_g, int64_t kb, float sa0, float sa1,
                                              int lane, float (&acc)[4]) {
  const int g = lane >> 2, t = lane & 3;
  uint32_t lo[4], hi[4];
  LdMatrixX4(lo, stage + (lane & 7) * kRowPitch + (lane >> 3) * 16);
  LdMatrixX4(hi, stage + (8 + (lane & 7)) * kRowPitch + (lane >> 3) * 16);
  const uint32_t* sw = reinterpret_cast<const uint32_t*>(stage + 16 * kRowPitch);
  const uint32_t s_lo = sw[g], s_hi = sw[g + 8];
#pragma unroll
  for (int gi = 0; gi < 4; ++gi) {
    uint4 b = *reinterpret_cast<const uint4*>(act_row + (kb * 16 + gi * 4 + t) * 16);
    if (!route_g) b = make_uint4(0u, 0u, 0u, 0u);  // a select: the mmas stay converged
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t wl[4], wh[4];
    E2m1x8ToF16x2(lo[gi], wl);
    E2m1x8ToF16x2(hi[gi], wh);
    MmaF16(p, wl[0], wh[0], wl[1], wh[1], b.x, b.y);
    MmaF16(p, wl[2], wh[2], wl[3], wh[3], b.z, b.w);
    const float w_lo = Ue8m0ToF32((s_lo >> (8 * gi)) & 0xffu);
    const float w_hi = Ue8m0ToF32((s_hi >> (8 * gi)) & 0xffu);
    acc[0] = __fmaf_rn(p[0], __fmul_rn(w_lo, sa0), acc[0]);
    acc[1] = __fmaf_rn(p[1], __fmul_rn(w_lo, sa1), acc[1]);
    acc[2] = __fmaf_rn(p[2], __fmul_rn(w_hi, sa0), acc[2]);
    acc[3] = __fmaf_rn(p[3], __fmul_rn(w_hi, sa1), acc[3]);
  }
}

// A warp's 16 weight rows over nk K-blocks: issue(stage, kb) copies K-block kb's rows and scale
// words into `stage` (cp.async). The first kStages − 1 K-blocks are issued by Prefetch before the
// activations are ready; Run consumes them all.
template <typename Issue>
struct WarpStream {
  const Issue& issue;
  uint8_t* stages;
  int64_t nk;
  __device__ void Prefetch() const {
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < nk) issue(stages + s * kStageBytes, static_cast<int64_t>(s));
      CpAsyncCommit();
    }
  }
  __device__ void Run(const uint8_t* act, int64_t pitch, const float* ascale, int rows,
                      float (&acc)[4]) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint8_t* act_row = act + (g < rows ? g : 0) * pitch;
    const int r0 = 2 * t < rows ? 2 * t : 0, r1 = 2 * t + 1 < rows ? 2 * t + 1 : 0;
    for (int64_t kb = 0; kb < nk; ++kb) {
      CpAsyncWait<kStages - 2>();
      __syncwarp();
      const int64_t next = kb + kStages - 1;
      if (next < nk) issue(stages + (next % kStages) * kStageBytes, next);
      CpAsyncCommit();
      ConsumeKBlock(stages + (kb % kStages) * kStageBytes, act_row, g < rows, kb,
                    ascale[r0 * nk + kb], ascale[r1 * nk + kb], lane, acc);
      __syncwarp();
    }
    CpAsyncWait<0>();
  }
};

// Up: block (64 intermediate rows of one part, expert i). Warp w: rows n .. n+7 of w1 (m16 rows
// 0..7) and of w3 (rows 8..15), n = n0 + 8w.
__global__ void __launch_bounds__(kThreads) Mxfp4MoeDecodeUpKernelImpl(const DecodeArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ BlockRoutes br;
  if (!FindBlockRoutes(a, br)) return;
  const Mxfp4ExpertLayout& L = a.L;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t tiles_per_part = L.part_inter / kUpRows;
  const int part = static_cast<int>(blockIdx.x / tiles_per_part);
  const int64_t n = (blockIdx.x % tiles_per_part) * kUpRows + warp * 8;
  const int64_t dim = L.dim, nk = dim / 128, rb = dim / 2, sb = dim / 32;
  const int64_t kb_step = L.tile_rows == 0 ? 64 : L.tile_rows * 64;
  const uint8_t* ex = a.base + static_cast<int64_t>(br.slot) * L.expert_bytes;
  // Lane l copies 16-byte chunks l and l + 32 of each K-block (row i >> 2, chunk i & 3) and, for
  // l < 16, row l's scale word.
  const uint8_t* src[2];
  for (int q = 0; q < 2; ++q) {
    const int i = lane + 32 * q, r = i >> 2;
    const uint8_t* w = ex + (r < 8 ? L.w1[part] : L.w3[part]);
    src[q] = w + RowBlockOffset(n + (r & 7), 0, rb, L.tile_rows) + (i & 3) * 16;
  }
  const uint8_t* ssrc =
      ex + (lane < 8 ? L.w1_scale[part] : L.w3_scale[part]) + (n + (lane & 7)) * sb;
  const auto issue = [&](uint8_t* st, int64_t kb) {
    for (int q = 0; q < 2; ++q) {
      const int i = lane + 32 * q;
      CpAsync16(st + (i >> 2) * kRowPitch + (i & 3) * 16, src[q] + kb * kb_step);
    }
    if (lane < 16) CpAsync4(st + 16 * kRowPitch + lane * 4, ssrc + kb * 4);
  };
  const WarpStream<decltype(issue)> ws{issue, smem + warp * kStages * kStageBytes, nk};
  uint8_t* act = smem + kWeightSmem;
  float* ascale = reinterpret_cast<float*>(act + a.chunk * ActPitch(dim));
  const int64_t hw = L.parts * L.part_inter;
  for (int c0 = 0; c0 < br.n; c0 += a.chunk) {
    const int rows = min(a.chunk, br.n - c0);
    ws.Prefetch();
    __syncthreads();  // the previous chunk's readers of act are done
    QuantizeRows([&](int r) { return a.x + static_cast<int64_t>(br.route[c0 + r] / a.K) * dim; },
                 rows, dim, act, ascale);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    ws.Run(act, ActPitch(dim), ascale, rows, acc);
    const int g = lane >> 2, t = lane & 3;
    for (int c = 0; c < 2; ++c) {
      const int r = 2 * t + c;
      if (r >= rows) continue;
      const int route = br.route[c0 + r];
      const float gv = RoundBf16(acc[c]), uv = RoundBf16(acc[2 + c]);
      const float v = __fmul_rn(a.weights[route], SwiGluValue(gv, uv, a.limit));
      a.h[route * hw + part * L.part_inter + n + g] = F32ToBf16(v);
    }
  }
}

// Down: block (128 output features n0 .., expert i). Warp w: rows n .. n+15 of w2, n = n0 + 16w,
// over K = parts·part_inter (part p's K-blocks p·kpp .. p·kpp + kpp − 1).
__global__ void __launch_bounds__(kThreads) Mxfp4MoeDecodeDownKernelImpl(const DecodeArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ BlockRoutes br;
  if (!FindBlockRoutes(a, br)) return;
  const Mxfp4ExpertLayout& L = a.L;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n = blockIdx.x * kDownRows + warp * 16;
  const int64_t dim = L.dim, hw = L.parts * L.part_inter, kpp = L.part_inter / 128;
  const int64_t nk = hw / 128, rb = L.part_inter / 2;
  const int64_t kb_step = L.tile_rows == 0 ? 64 : L.tile_rows * 64;
  const uint8_t* ex = a.base + static_cast<int64_t>(br.slot) * L.expert_bytes;
  int64_t off[2];
  for (int q = 0; q < 2; ++q) {
    const int i = lane + 32 * q;
    off[q] = RowBlockOffset(n + (i >> 2), 0, rb, L.tile_rows) + (i & 3) * 16;
  }
  const int64_t soff = (n + (lane & 15)) * L.w2_scale_stride + L.w2_scale_col0;
  const auto issue = [&](uint8_t* st, int64_t kb) {
    const int part = static_cast<int>(kb / kpp);
    const int64_t kbl = kb % kpp;
    const uint8_t* w2 = ex + L.w2[part];
    for (int q = 0; q < 2; ++q) {
      const int i = lane + 32 * q;
      CpAsync16(st + (i >> 2) * kRowPitch + (i & 3) * 16, w2 + off[q] + kbl * kb_step);
    }
    if (lane < 16) CpAsync4(st + 16 * kRowPitch + lane * 4, ex + L.w2_scale[part] + soff + kbl * 4);
  };
  const WarpStream<decltype(issue)> ws{issue, smem + warp * kStages * kStageBytes, nk};
  uint8_t* act = smem + kWeightSmem;
  float* ascale = reinterpret_cast<float*>(act + a.chunk * ActPitch(hw));
  for (int c0 = 0; c0 < br.n; c0 += a.chunk) {
    const int rows = min(a.chunk, br.n - c0);
    ws.Prefetch();
    __syncthreads();
    QuantizeRows([&](int r) { return a.h + static_cast<int64_t>(br.route[c0 + r]) * hw; }, rows, hw,
                 act, ascale);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    ws.Run(act, ActPitch(hw), ascale, rows, acc);
    const int g = lane >> 2, t = lane & 3;
    for (int c = 0; c < 2; ++c) {
      const int r = 2 * t + c;
      if (r >= rows) continue;
      float v0 = acc[c], v1 = acc[2 + c];
      if (a.round_output) {
        v0 = RoundBf16(v0);
        v1 = RoundBf16(v1);
      }
      float* yrow = a.y + static_cast<int64_t>(br.route[c0 + r]) * dim;
      yrow[n + g] = v0;
      yrow[n + g + 8] = v1;
    }
  }
}

}  // namespace

cudaError_t Mxfp4MoeDecode(const Mxfp4MoeDecodeParams& p, cudaStream_t stream) {
  const Mxfp4ExpertLayout& L = p.layout;
  if (p.T < 0 || p.T > kMxfp4MoeDecodeMaxRoutes || p.K < 1 || p.K > kMxfp4MoeMaxTopK ||
      p.T * p.K > kMxfp4MoeDecodeMaxRoutes || p.n_slots < 0 || p.n_slots > kMxfp4MoeMaxExperts ||
      !Mxfp4LayoutOk(L) || !AlignedTo(p.x, 16) || !AlignedTo(p.h, 16) || !AlignedTo(p.base, 16) ||
      !AlignedTo(p.y, 4)) {
    return cudaErrorInvalidValue;
  }
  const int TK = static_cast<int>(p.T * p.K);
  if (TK == 0 || p.n_slots == 0) return cudaSuccess;
  const int64_t hw = L.parts * L.part_inter;
  int chunk = TK < kMaxChunk ? TK : kMaxChunk;
  const auto smem = [&](int c) {
    const int64_t up = DecodeSmem(c, L.dim), down = DecodeSmem(c, hw);
    return up > down ? up : down;
  };
  while (chunk > 1 && smem(chunk) > kMaxSmem) --chunk;
  if (smem(chunk) > kMaxSmem) return cudaErrorInvalidValue;  // dim or parts·part_inter too large
  DecodeArgs a;
  a.x = Raw(p.x);
  a.slots = p.slots;
  a.weights = p.weights;
  a.TK = TK;
  a.K = p.K;
  a.n_slots = p.n_slots;
  a.chunk = chunk;
  a.base = p.base;
  a.L = L;
  a.h = Raw(p.h);
  a.y = p.y;
  a.limit = p.limit;
  a.round_output = p.round_output_bf16;
  const unsigned experts = static_cast<unsigned>(TK < p.n_slots ? TK : p.n_slots);
  const dim3 up_grid(static_cast<unsigned>(hw / kUpRows), experts);
  Mxfp4MoeDecodeUpKernelImpl<<<up_grid, kThreads, DecodeSmem(chunk, L.dim), stream>>>(a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 down_grid(static_cast<unsigned>(L.dim / kDownRows), experts);
  Mxfp4MoeDecodeDownKernelImpl<<<down_grid, kThreads, DecodeSmem(chunk, hw), stream>>>(a);
  return cudaGetLastError();
}

std::vector<SharedMemoryOptIn> Mxfp4MoeDecodeOptIns() {
  return {
      {"Mxfp4MoeDecode (up)", reinterpret_cast<const void*>(&Mxfp4MoeDecodeUpKernelImpl), kMaxSmem},
      {"Mxfp4MoeDecode (down)", reinterpret_cast<const void*>(&Mxfp4MoeDecodeDownKernelImpl),
       kMaxSmem}};
}

const void* Mxfp4MoeDecodeUpKernel() {
  return reinterpret_cast<const void*>(&Mxfp4MoeDecodeUpKernelImpl);
}
const void* Mxfp4MoeDecodeDownKernel() {
  return reinterpret_cast<const void*>(&Mxfp4MoeDecodeDownKernelImpl);
}

}  // namespace ss::cuda
