#include "gpu_worker/kernels/compressor_common.cuh"
#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/paged_kv.h"
#include "gpu_worker/kernels/rope.h"
#include "gpu_worker/kernels/shared_memory.h"
#include "gpu_worker/kernels/sparse_attention_impl.cuh"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint8_t* BlockBase(const KvGeom& g, const int32_t* table, int n_table,
                                              int b) {
  if (b < 0 || b >= n_table) return nullptr;
  return reinterpret_cast<uint8_t*>(g.pool) + static_cast<int64_t>(table[b]) * g.block_bytes;
}

// Ring slot (pos mod W) of the layer's window.
__device__ __forceinline__ uint8_t* WindowRecord(const KvGeom& g, const int32_t* table, int n_table,
                                                 int pos) {
  const int w = g.win_base + pos % g.window;
  uint8_t* b = BlockBase(g, table, n_table, w / g.win_per_block);
  return b == nullptr ? nullptr : b + static_cast<int64_t>(w % g.win_per_block) * g.record_bytes;
}

// Compressed entry j of the layer.
__device__ __forceinline__ uint8_t* EntryRecord(const KvGeom& g, const int32_t* table, int n_table,
                                                int j) {
  uint8_t* b = BlockBase(g, table, n_table, g.first_entry_block + j / g.entries_per_block);
  return b == nullptr
             ? nullptr
             : b + g.main_off + static_cast<int64_t>(j % g.entries_per_block) * g.record_bytes;
}

__device__ __forceinline__ uint8_t* KeyEntry(const KvGeom& g, const int32_t* table, int n_table,
                                             int j) {
  uint8_t* b = BlockBase(g, table, n_table, g.first_entry_block + j / g.keys_per_block);
  const int64_t kb = KvKeyBytes(g.key_dim);
  return b == nullptr ? nullptr : b + g.key_off + static_cast<int64_t>(j % g.keys_per_block) * kb;
}

// The record of candidate j of token tk (nullptr: masked), in KvBuildCandidates' order.
__device__ __forceinline__ const uint8_t* CandidateRecord(const KvGeom& g, const KvToken& tk,
                                                          const int32_t* __restrict__ sel,
                                                          int64_t j) {
  const int32_t* table = reinterpret_cast<const int32_t*>(tk.table);
  if (j < tk.win_width) {
    const int first = tk.pos - g.window + 1 > 0 ? tk.pos - g.window + 1 : 0;
    if (j >= tk.pos - first + 1) return nullptr;
    const int p = first + static_cast<int>(j);
    return p >= tk.chunk_start ? reinterpret_cast<const uint8_t*>(tk.staging) +
                                     static_cast<int64_t>(p - tk.chunk_start) * g.record_bytes
                               : WindowRecord(g, table, tk.n_table, p);
  }
  if (j >= tk.win_width + tk.n_comp) return nullptr;
  const int m = static_cast<int>(j) - tk.win_width;
  if (tk.sel_off >= 0) {
    const int32_t s = sel[tk.sel_off + m];
    return s >= 0 ? EntryRecord(g, table, tk.n_table, s) : nullptr;
  }
  return g.ratio > 0 && m < (tk.pos + 1) / g.ratio ? EntryRecord(g, table, tk.n_table, m) : nullptr;
}

// Dims [k0, k0 + 4) of a record (k0 a multiple of 4) as bf16 (exact), in the order of a row.
__device__ __forceinline__ uint2 RecordQuad(const uint8_t* __restrict__ rec, int nope, int rope,
                                            int k0) {
  uint2 v;
  if (k0 < nope) {
    const uint32_t codes = *reinterpret_cast<const uint32_t*>(rec + k0);
    const float sc = Ue8m0ToF32(rec[nope + 2 * rope + k0 / 64]);
    const uint32_t b0 = F32ToBf16(__fmul_rn(E4m3ToF32(codes & 0xff), sc));
    const uint32_t b1 = F32ToBf16(__fmul_rn(E4m3ToF32((codes >> 8) & 0xff), sc));
    const uint32_t b2 = F32ToBf16(__fmul_rn(E4m3ToF32((codes >> 16) & 0xff), sc));
    const uint32_t b3 = F32ToBf16(__fmul_rn(E4m3ToF32(codes >> 24), sc));
    v.x = b0 | (b1 << 16);
    v.y = b2 | (b3 << 16);
  } else {
    v = *reinterpret_cast<const uint2*>(rec + nope + 2 * (k0 - nope));
  }
  return v;
}

// A record decoded to a bf16 row of d dims (exact), quads first·4, (first + step)·4, ...
__device__ __forceinline__ void DecodeRow(const uint8_t* __restrict__ rec, int d, int nope,
                                          uint16_t* __restrict__ row, int first, int step) {
  for (int k0 = 4 * first; k0 < d; k0 += 4 * step) {
    *reinterpret_cast<uint2*>(row + k0) = RecordQuad(rec, nope, d - nope, k0);
  }
}

// DecodeRow of a kD-dim record by lane `lane` of a warp (quads lane + 32i), all of its loads
// issued before the first store.
template <int kD>
__device__ __forceinline__ void DecodeRowWarp(const uint8_t* __restrict__ rec, int nope,
                                              uint16_t* __restrict__ row, int lane) {
  constexpr int kSteps = kD / 128;
  uint2 v[kSteps];
#pragma unroll
  for (int i = 0; i < kSteps; ++i) v[i] = RecordQuad(rec, nope, kD - nope, 4 * (lane + 32 * i));
#pragma unroll
  for (int i = 0; i < kSteps; ++i) *reinterpret_cast<uint2*>(row + 4 * (lane + 32 * i)) = v[i];
}

// grid (token, candidate group). kRows: one warp per candidate, which also decodes its record
// into rows[(t·n_cand + j)·d, ...) (d = nope + rope, kD when kD > 0; masked rows are left as
// they are).
template <bool kRows, int kD = 0>
__global__ void KvBuildCandidatesKernelImpl(KvGeom g, const KvToken* __restrict__ tokens,
                                            const int32_t* __restrict__ sel, int64_t n_cand,
                                            uint64_t* __restrict__ cand,
                                            uint16_t* __restrict__ rows) {
  const int64_t t = blockIdx.x;
  const KvToken tk = tokens[t];
  const int per = kRows ? static_cast<int>(blockDim.x) / 32 : static_cast<int>(blockDim.x);
  const int k = kRows ? static_cast<int>(threadIdx.x) / 32 : static_cast<int>(threadIdx.x);
  const int64_t j = static_cast<int64_t>(blockIdx.y) * per + k;
  if (j >= n_cand) return;
  const uint8_t* v = CandidateRecord(g, tk, sel, j);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (!kRows || lane == 0) cand[t * n_cand + j] = reinterpret_cast<uint64_t>(v);
  if (kRows && v != nullptr) {
    if constexpr (kD > 0) {
      DecodeRowWarp<kD>(v, g.nope, rows + (t * n_cand + j) * kD, lane);
    } else {
      const int d = g.nope + g.rope;
      DecodeRow(v, d, g.nope, rows + (t * n_cand + j) * d, lane, 32);
    }
  }
}

// One record from bf16 x: warp w < nope/64 quantises tile w, the next warp copies the rope dims
// and writes the scale padding.
__device__ __forceinline__ void EncodeRecord(const uint16_t* __restrict__ x, uint8_t* rec, int nope,
                                             int rope) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tiles = nope / 64;
  uint8_t* scales = rec + nope + 2 * rope;
  if (warp < tiles) {
    const int i0 = warp * 64 + lane, i1 = i0 + 32;
    const float v0 = Bf16ToF32(x[i0]), v1 = Bf16ToF32(x[i1]);
    float amax = fmaxf(fabsf(v0), fabsf(v1));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = Pow2Scale(amax, 1e-4f, 448.0f);
    rec[i0] = F32ToE4m3(fminf(fmaxf(__fdiv_rn(v0, s), -448.0f), 448.0f));
    rec[i1] = F32ToE4m3(fminf(fmaxf(__fdiv_rn(v1, s), -448.0f), 448.0f));
    if (lane == 0) scales[warp] = static_cast<uint8_t>((__float_as_uint(s) >> 23) & 0xff);
  } else if (warp == tiles) {
    uint16_t* r = reinterpret_cast<uint16_t*>(rec + nope);
    for (int k = lane; k < rope; k += 32) r[k] = x[nope + k];
    const int padded = (tiles + 7) / 8 * 8;
    if (lane < padded - tiles) scales[tiles + lane] = 0;
  }
}

template <bool kRing>
__global__ void KvWriteRecordsKernelImpl(KvGeom g, const KvToken* __restrict__ tokens,
                                         const uint16_t* __restrict__ kv) {
  const KvToken tk = tokens[blockIdx.x];
  uint8_t* dst;
  if (kRing) {
    if (tk.pos < tk.chunk_end - g.window) return;
    dst = WindowRecord(g, reinterpret_cast<const int32_t*>(tk.table), tk.n_table, tk.pos);
  } else {
    dst = reinterpret_cast<uint8_t*>(tk.staging) +
          static_cast<int64_t>(tk.pos - tk.chunk_start) * g.record_bytes;
  }
  if (dst == nullptr) return;
  EncodeRecord(kv + static_cast<int64_t>(blockIdx.x) * (g.nope + g.rope), dst, g.nope, g.rope);
}

__global__ void KvEncodeRecordsKernelImpl(const uint16_t* __restrict__ entries,
                                          const uint64_t* __restrict__ dst, int nope, int rope) {
  uint8_t* rec = reinterpret_cast<uint8_t*>(dst[blockIdx.x]);
  if (rec == nullptr) return;
  EncodeRecord(entries + static_cast<int64_t>(blockIdx.x) * (nope + rope), rec, nope, rope);
}

// e2m1 code (sign << 3 | magnitude index) of a value already on the grid.
__device__ __forceinline__ uint32_t E2m1Code(float e) {
  const float a = fabsf(e);
  const uint32_t m = a == 0.0f   ? 0
                     : a == 0.5f ? 1
                     : a == 1.0f ? 2
                     : a == 1.5f ? 3
                     : a == 2.0f ? 4
                     : a == 3.0f ? 5
                     : a == 4.0f ? 6
                                 : 7;
  return (m != 0 && e < 0.0f) ? (8u | m) : m;
}
__device__ __forceinline__ float E2m1Value(uint32_t c) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = mag[c & 7];
  return (c & 8) ? -v : v;
}

// One key per block, one warp per 32-value group.
__global__ void KvEncodeKeysKernelImpl(const uint16_t* __restrict__ keys,
                                       const uint64_t* __restrict__ dst, int hd) {
  uint8_t* out = reinterpret_cast<uint8_t*>(dst[blockIdx.x]);
  if (out == nullptr) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int i = warp * 32 + lane;
  const float x = Bf16ToF32(keys[static_cast<int64_t>(blockIdx.x) * hd + i]);
  float amax = fabsf(x);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = Pow2Scale(amax, Fp4AmaxFloor(), 6.0f);
  float q = __fdiv_rn(x, s);
  q = q < -6.0f ? -6.0f : (6.0f < q ? 6.0f : q);
  const uint32_t code = E2m1Code(RoundE2m1(q));
  const uint32_t hi = __shfl_down_sync(0xffffffffu, code, 1);
  if ((lane & 1) == 0) out[i / 2] = static_cast<uint8_t>(code | (hi << 4));
  if (lane == 0) out[hd / 2 + warp] = static_cast<uint8_t>((__float_as_uint(s) >> 23) & 0xff);
}

__global__ void KvGatherKeysKernelImpl(KvGeom g, const int32_t* __restrict__ table, int n_table,
                                       uint16_t* __restrict__ out) {
  const int j = blockIdx.x, hd = g.key_dim;
  const uint8_t* k = KeyEntry(g, table, n_table, j);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float v = 0.0f;
    if (k != nullptr) {
      const uint32_t byte = k[i / 2];
      v = __fmul_rn(E2m1Value((i & 1) ? byte >> 4 : byte & 15), Ue8m0ToF32(k[hd / 2 + i / 32]));
    }
    out[static_cast<int64_t>(j) * hd + i] = F32ToBf16(v);
  }
}

// Dim k of a record as fp32.
__device__ __forceinline__ float RecordDim(const uint8_t* __restrict__ rec, int nope, int rope,
                                           int k) {
  if (k < nope) {
    return __fmul_rn(E4m3ToF32(rec[k]), Ue8m0ToF32(rec[nope + 2 * rope + k / 64]));
  }
  return Bf16ToF32(reinterpret_cast<const uint16_t*>(rec + nope)[k - nope]);
}

// Candidates given as record addresses.
struct RecordEntries {
  int nope, rope;
  __device__ __forceinline__ float At(uint64_t c, int64_t k) const {
    return RecordDim(reinterpret_cast<const uint8_t*>(c), nope, rope, static_cast<int>(k));
  }
};

__global__ void KvSparseAttentionKernelImpl(const uint16_t* __restrict__ q,
                                            const uint64_t* __restrict__ cand,
                                            const float* __restrict__ sink, int64_t n_heads,
                                            int64_t d, int nope, int64_t n_cand, float scale,
                                            uint16_t* __restrict__ out) {
  const RecordEntries entries{nope, static_cast<int>(d) - nope};
  SparseAttendBlock(q, entries, cand, sink, n_heads, d, n_cand, scale, out);
}

// One block per candidate row r = t·n_cand + j: record cand[r] decoded to bf16 (exact) into
// rows[r·d, (r + 1)·d); masked candidates (0) are skipped (their rows are never read). d / 4
// threads, 4 dims each (the fast kernel's decode, so the same bits).
__global__ void KvDecodeRowsKernelImpl(const uint64_t* __restrict__ cand, int d, int nope,
                                       uint16_t* __restrict__ rows) {
  const int64_t r = blockIdx.x;
  const uint8_t* rec = reinterpret_cast<const uint8_t*>(cand[r]);
  if (rec == nullptr) return;
  DecodeRow(rec, d, nope, rows + r * d, static_cast<int>(threadIdx.x),
            static_cast<int>(blockDim.x));
}

// SparseAttendFastBlock's stage: each chunk's records decoded into shared memory as bf16 (exact), 4
// dims per step.
template <int kD>
struct RecordStage {
  int nope;

  __device__ __forceinline__ void StageRows(int64_t, int, uint4*) {}
  __device__ __forceinline__ void StageEntries(const uint64_t* idxs, int nc, uint4* smem) {
    constexpr int kQuads = kD / 4;
    uint16_t* kvs = reinterpret_cast<uint16_t*>(smem);
    for (int e = static_cast<int>(threadIdx.x); e < nc * kQuads; e += kSparseFastThreads) {
      const int i = e / kQuads, k0 = (e % kQuads) * 4;
      const uint8_t* rec = reinterpret_cast<const uint8_t*>(idxs[i]);
      if (rec == nullptr) continue;
      *reinterpret_cast<uint2*>(kvs + i * kD + k0) = RecordQuad(rec, nope, kD - nope, k0);
    }
  }
};

template <int kD>
__global__ void __launch_bounds__(kSparseFastThreads)
    KvSparseAttentionFastKernelImpl(const uint16_t* __restrict__ q,
                                    const uint64_t* __restrict__ cand,
                                    const float* __restrict__ sink, int64_t n_heads, int nope,
                                    int64_t n_cand, float scale, uint16_t* __restrict__ out) {
  RecordStage<kD> stage{nope};
  SparseAttendFastBlock<kD>(q, cand, sink, n_heads, n_cand, scale, stage, out);
}

// Flash-decoding over the decoded rows (KvSparseAttention) in two launches per slice of at most
// kKvSplitMaxTokens tokens: KvSplitChunkKernelImpl scores each 64-candidate chunk against its
// own max m and writes (m, Σp, Σ bf16(p)·v), KvSplitCombineKernelImpl merges a (token, head)'s
// chunks. The workspace of a slice (KvSplitBytes) is carved as below from the rows scratch past
// the call's T·n_cand rows, and reused by the next slice (in stream order).
struct SplitWork {
  float* pv;    // [T·H·nch, kD] chunk partials Σ bf16(p)·v
  float* cmax;  // [T·H·nch] chunk maxima (−inf: every candidate of the chunk masked)
  float* psum;  // [T·H·nch] chunk sums Σ p
};
// `end`: the first byte past the rows; T: the slice's tokens.
__host__ __device__ inline SplitWork CarveSplit(uint16_t* end, int64_t T, int64_t H, int64_t n_cand,
                                                int64_t d) {
  const int64_t nch = (n_cand + kSparseChunk - 1) / kSparseChunk, n = T * H * nch;
  float* base = reinterpret_cast<float*>(end);
  return {base, base + n * d, base + n * (d + 1)};
}

constexpr int kSplitHeads = 16;  // heads per chunk block: the mma's M
constexpr int kSplitPad = 8;     // floats past each 64-score row: conflict-free float2 stores

// The warp's 8×8 matrix of b16 transposed: lane 4g + u holds elements 2u, 2u + 1 of row g before
// and of column g after.
__device__ __forceinline__ uint32_t Transpose8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// grid (chunk, token, group of 16 heads), kD / 2 threads; warp w owns dims [64w, 64w + 64).
// Lane 4g + u loads, for candidates 8j + g of the chunk (j < 8), the 16-byte pieces at dims
// 64w + 32s + 8u (s < 2) into registers (masked candidates and those past n_cand as zeros), and
// they serve as both operands. Scores: the mma's k-slots 2u, 2u + 1 / 2u + 8, 2u + 9 of the two
// k16 steps of a piece are its dims 0-1 / 2-3 and 4-5 / 6-7, the same permutation for q and k.
// p·V: each 8×8 tile transposed in registers, output column 2u + b of n-tile (s, m) being dim
// 64w + 32s + 8u + 2m + b, so lane u ends with 8 consecutive dims per head and piece. The warps'
// partial scores (16 heads × 64) meet in shared memory, where kD / 32 threads per head sum them
// in warp order, take the chunk's max m, p = exp(s − m) and Σp (a fixed shuffle tree), and
// return bf16(p) as the A operand of p·V. Masked rows are zeros, so they add +0.
template <int kD>
__global__ void __launch_bounds__(kD / 2)
    KvSplitChunkKernelImpl(const uint16_t* __restrict__ q, const uint64_t* __restrict__ cand,
                           int64_t n_heads, int64_t n_cand, float scale,
                           const uint16_t* __restrict__ rows, SplitWork w) {
  constexpr int kWarps = kD / 64, kVecs = kD / 8, kPerHead = kD / 32;
  constexpr int kPerThread = kSparseChunk / kPerHead;
  __shared__ __align__(16) float part[kWarps][kSplitHeads][kSparseChunk + kSplitPad];
  __shared__ uint32_t pb[kSplitHeads][kSparseChunk / 2 + 4];  // bf16 p pairs, padded rows
  __shared__ bool valid[kSparseChunk];
  const int c = blockIdx.x, nch = gridDim.x;
  const int64_t t = blockIdx.y, h0 = static_cast<int64_t>(blockIdx.z) * kSplitHeads;
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, g = (tid & 31) >> 2, u = tid & 3;
  const int64_t c0 = static_cast<int64_t>(c) * kSparseChunk;
  const int nc = static_cast<int>(n_cand - c0 < kSparseChunk ? n_cand - c0 : kSparseChunk);
  const uint64_t* ct = cand + t * n_cand + c0;
  const uint4* rt = reinterpret_cast<const uint4*>(rows + (t * n_cand + c0) * kD) + 8 * warp + u;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  uint4 kv[8][2];
  uint64_t rec[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int i = 8 * j + g;
    rec[j] = i < nc ? ct[i] : 0;
#pragma unroll
    for (int s = 0; s < 2; ++s) kv[j][s] = i < nc ? rt[i * kVecs + 4 * s] : zero;
  }
  uint4 qa[2][2];  // heads g and g + 8 of the group, pieces s
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t h = h0 + g + 8 * r;
    const uint4* qh = reinterpret_cast<const uint4*>(q + (t * n_heads + h) * kD) + 8 * warp + u;
#pragma unroll
    for (int s = 0; s < 2; ++s) qa[r][s] = h < n_heads ? qh[4 * s] : zero;
  }
  if (tid < kSparseChunk) valid[tid] = tid < nc && ct[tid] != 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int s = 0; s < 2; ++s) kv[j][s] = rec[j] != 0 ? kv[j][s] : zero;
  }
  float sc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      MmaBf16(sc[j], qa[0][s].x, qa[1][s].x, qa[0][s].y, qa[1][s].y, kv[j][s].x, kv[j][s].y);
      MmaBf16(sc[j], qa[0][s].z, qa[1][s].z, qa[0][s].w, qa[1][s].w, kv[j][s].z, kv[j][s].w);
    }
    *reinterpret_cast<float2*>(&part[warp][g][8 * j + 2 * u]) = make_float2(sc[j][0], sc[j][1]);
    *reinterpret_cast<float2*>(&part[warp][g + 8][8 * j + 2 * u]) = make_float2(sc[j][2], sc[j][3]);
  }
  __syncthreads();
  {
    const int hh = tid / kPerHead, i0 = (tid % kPerHead) * kPerThread;
    float s[kPerThread];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPerThread; k += 4) {
      float4 dot = *reinterpret_cast<const float4*>(&part[0][hh][i0 + k]);
#pragma unroll
      for (int v = 1; v < kWarps; ++v) {
        const float4 x = *reinterpret_cast<const float4*>(&part[v][hh][i0 + k]);
        dot = make_float4(__fadd_rn(dot.x, x.x), __fadd_rn(dot.y, x.y), __fadd_rn(dot.z, x.z),
                          __fadd_rn(dot.w, x.w));
      }
      const float d4[4] = {dot.x, dot.y, dot.z, dot.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[k + e] = valid[i0 + k + e] ? __fmul_rn(d4[e], scale) : -INFINITY;
        m = fmaxf(m, s[k + e]);
      }
    }
#pragma unroll
    for (int o = kPerHead / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      s[k] = m == -INFINITY ? 0.0f : expf(__fsub_rn(s[k], m));
      l = __fadd_rn(l, s[k]);
    }
    // Partners add the same two values, so every lane of the head ends with the same bits.
#pragma unroll
    for (int o = kPerHead / 2; o > 0; o >>= 1) l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, o));
#pragma unroll
    for (int k = 0; k < kPerThread; k += 2) {
      pb[hh][(i0 + k) / 2] = F32ToBf16(s[k]) | (static_cast<uint32_t>(F32ToBf16(s[k + 1])) << 16);
    }
    if (tid % kPerHead == 0 && h0 + hh < n_heads) {
      const int64_t hc = (t * n_heads + h0 + hh) * nch + c;
      w.cmax[hc] = m;
      w.psum[hc] = l;
    }
  }
  __syncthreads();
  float acc[2][4][4];
#pragma unroll
  for (int s = 0; s < 2; ++s) {
#pragma unroll
    for (int m = 0; m < 4; ++m) acc[s][m][0] = acc[s][m][1] = acc[s][m][2] = acc[s][m][3] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < kSparseChunk / 16; ++kk) {
    const uint32_t a0 = pb[g][8 * kk + u], a1 = pb[g + 8][8 * kk + u];
    const uint32_t a2 = pb[g][8 * kk + 4 + u], a3 = pb[g + 8][8 * kk + 4 + u];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        MmaBf16(acc[s][m], a0, a1, a2, a3, Transpose8x8(U4Word(kv[2 * kk][s], m)),
                Transpose8x8(U4Word(kv[2 * kk + 1][s], m)));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t h = h0 + g + 8 * r;
    if (h >= n_heads) continue;
    float* dst = w.pv + ((t * n_heads + h) * nch + c) * kD + 64 * warp + 8 * u;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      *reinterpret_cast<float4*>(dst + 32 * s) = make_float4(
          acc[s][0][2 * r], acc[s][0][2 * r + 1], acc[s][1][2 * r], acc[s][1][2 * r + 1]);
      *reinterpret_cast<float4*>(dst + 32 * s + 4) = make_float4(
          acc[s][2][2 * r], acc[s][2][2 * r + 1], acc[s][3][2 * r], acc[s][3][2 * r + 1]);
    }
  }
}

// The inverse RoPE of the output's last `dim` dims (cos == nullptr: none): ApplyRope(inverse =
// true)'s arithmetic: RotatePair with s = −sin.
struct OutRope {
  const float* cos;
  const float* sin;
  int dim;
  __device__ __forceinline__ void Unrotate(uint16_t* v, int64_t i) const {
    RotatePair(v, cos[i], -sin[i]);
  }
};

// One block per (token, head), kD / 4 threads of 4 dims: the head's max M over the chunk maxima,
// then in chunk order acc += exp(m − M)·pv and l += exp(m − M)·Σp (a fully masked chunk adds
// nothing), then the sink, the division and the bf16 rounding, then (rope.cos set) the inverse
// RoPE of the rotated pairs among the thread's four values. The first 16 chunks' partials are in
// flight while M is taken (lane c of each warp reads chunk c's max; shuffles), and lane u
// computes the weight of chunk cb + u of a batch for the others.
template <int kD>
__global__ void __launch_bounds__(kD / 4)
    KvSplitCombineKernelImpl(const float* __restrict__ sink, int64_t n_heads, int nch, SplitWork w,
                             OutRope rope, uint16_t* __restrict__ out) {
  constexpr int kBatch = 16;  // chunks whose partials are in flight together
  const int64_t th = blockIdx.x, h = th % n_heads;
  const int k0 = 4 * static_cast<int>(threadIdx.x), lane = static_cast<int>(threadIdx.x) & 31;
  const float* cm = w.cmax + th * nch;
  const float* ps = w.psum + th * nch;
  float4 pv[kBatch];
  const auto load = [&](int cb) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (cb + u < nch) {
        pv[u] = *reinterpret_cast<const float4*>(w.pv + (th * nch + cb + u) * kD + k0);
      }
    }
  };
  load(0);
  float m = -INFINITY;
  for (int c = lane; c < nch; c += 32) m = fmaxf(m, cm[c]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float l = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int cb = 0; cb < nch; cb += kBatch) {
    if (cb > 0) load(cb);
    float my_a = 0.0f, my_psum = 0.0f;  // chunk cb + lane's
    if (lane < kBatch && cb + lane < nch) {
      const float mc = cm[cb + lane];
      my_a = mc == -INFINITY ? 0.0f : expf(__fsub_rn(mc, m));
      my_psum = ps[cb + lane];
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (cb + u < nch) {
        const float a = __shfl_sync(0xffffffffu, my_a, u);
        const float psum = __shfl_sync(0xffffffffu, my_psum, u);
        acc[0] = __fadd_rn(acc[0], __fmul_rn(a, pv[u].x));
        acc[1] = __fadd_rn(acc[1], __fmul_rn(a, pv[u].y));
        acc[2] = __fadd_rn(acc[2], __fmul_rn(a, pv[u].z));
        acc[3] = __fadd_rn(acc[3], __fmul_rn(a, pv[u].w));
        l = __fadd_rn(l, __fmul_rn(a, psum));
      }
    }
  }
  const float denom = __fadd_rn(l, expf(__fsub_rn(sink[h], m)));
  uint16_t o[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) o[u] = F32ToBf16(__fdiv_rn(acc[u], denom));
  if (rope.cos != nullptr) {
    const int64_t pairs = rope.dim / 2, t = th / n_heads;
#pragma unroll
    for (int u = 0; u < 4; u += 2) {
      const int r = k0 + u - (kD - rope.dim);  // even: the pair (u, u + 1) is rotated or not
      if (r >= 0) rope.Unrotate(o + u, t * pairs + r / 2);
    }
  }
  *reinterpret_cast<uint2*>(out + th * kD + k0) = make_uint2(
      o[0] | (static_cast<uint32_t>(o[1]) << 16), o[2] | (static_cast<uint32_t>(o[3]) << 16));
}

bool BadRows(int64_t T) { return T < 0 || T > 0x7fffffff; }
bool BadRecord(int64_t nope, int64_t rope) {
  return nope < 0 || nope % 64 != 0 || nope > 1024 || rope < 0 || rope > 1024 || rope % 4 != 0;
}

}  // namespace

cudaError_t KvBuildCandidates(const KvGeom& g, const KvToken* tokens, int64_t T, const int32_t* sel,
                              int64_t n_cand, uint64_t* cand, cudaStream_t stream, bf16_t* rows) {
  if (BadRows(T) || g.window < 1 || n_cand < 1) return cudaErrorInvalidValue;
  if (rows != nullptr && (BadRecord(g.nope, g.rope) || (n_cand + 3) / 4 > 0xffff)) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  if (rows == nullptr) {
    const unsigned groups = static_cast<unsigned>((n_cand + kThreads - 1) / kThreads);
    if (groups > 0xffff) return cudaErrorInvalidValue;
    KvBuildCandidatesKernelImpl<false>
        <<<dim3(static_cast<unsigned>(T), groups), kThreads, 0, stream>>>(g, tokens, sel, n_cand,
                                                                          cand, nullptr);
  } else {
    const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((n_cand + 3) / 4));
    const int d = g.nope + g.rope;
    if (d == 512) {
      KvBuildCandidatesKernelImpl<true, 512>
          <<<grid, 128, 0, stream>>>(g, tokens, sel, n_cand, cand, Raw(rows));
    } else if (d == 256) {
      KvBuildCandidatesKernelImpl<true, 256>
          <<<grid, 128, 0, stream>>>(g, tokens, sel, n_cand, cand, Raw(rows));
    } else {
      KvBuildCandidatesKernelImpl<true>
          <<<grid, 128, 0, stream>>>(g, tokens, sel, n_cand, cand, Raw(rows));
    }
  }
  return cudaGetLastError();
}

cudaError_t KvStageRecords(const KvGeom& g, const KvToken* tokens, int64_t T, const bf16_t* kv,
                           cudaStream_t stream) {
  if (BadRows(T) || BadRecord(g.nope, g.rope) || g.window < 1) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  KvWriteRecordsKernelImpl<false>
      <<<static_cast<unsigned>(T), 32 * (g.nope / 64 + 1), 0, stream>>>(g, tokens, Raw(kv));
  return cudaGetLastError();
}

cudaError_t KvRingRecords(const KvGeom& g, const KvToken* tokens, int64_t T, const bf16_t* kv,
                          cudaStream_t stream) {
  if (BadRows(T) || BadRecord(g.nope, g.rope) || g.window < 1) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  KvWriteRecordsKernelImpl<true>
      <<<static_cast<unsigned>(T), 32 * (g.nope / 64 + 1), 0, stream>>>(g, tokens, Raw(kv));
  return cudaGetLastError();
}

cudaError_t KvEncodeRecords(const bf16_t* entries, const uint64_t* dst, int64_t n, int64_t nope,
                            int64_t rope, cudaStream_t stream) {
  if (BadRows(n) || BadRecord(nope, rope)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  KvEncodeRecordsKernelImpl<<<static_cast<unsigned>(n), static_cast<unsigned>(32 * (nope / 64 + 1)),
                              0, stream>>>(Raw(entries), dst, static_cast<int>(nope),
                                           static_cast<int>(rope));
  return cudaGetLastError();
}

cudaError_t KvEncodeKeys(const bf16_t* keys, const uint64_t* dst, int64_t n, int64_t hd,
                         cudaStream_t stream) {
  if (BadRows(n) || hd < 32 || hd % 32 != 0 || hd > 1024) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  KvEncodeKeysKernelImpl<<<static_cast<unsigned>(n), static_cast<unsigned>(hd), 0, stream>>>(
      Raw(keys), dst, static_cast<int>(hd));
  return cudaGetLastError();
}

cudaError_t KvGatherKeys(const KvGeom& g, const int32_t* table, int64_t n_table, int64_t n,
                         bf16_t* out, cudaStream_t stream) {
  if (BadRows(n) || BadRows(n_table) || g.key_dim < 32 || g.key_dim % 32 != 0 ||
      g.keys_per_block < 1) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  KvGatherKeysKernelImpl<<<static_cast<unsigned>(n), 128, 0, stream>>>(
      g, table, static_cast<int>(n_table), Raw(out));
  return cudaGetLastError();
}

template <int kD>
cudaError_t LaunchFast(const uint16_t* q, const uint64_t* cand, const float* sink, int64_t T,
                       int64_t n_heads, int nope, int64_t n_cand, float scale, uint16_t* rows,
                       bool rows_decoded, const OutRope& rope, uint16_t* out, cudaStream_t stream) {
  if (rows == nullptr) {
    KvSparseAttentionFastKernelImpl<kD><<<static_cast<unsigned>(T * n_heads), kSparseFastThreads,
                                          static_cast<int>(kSparseChunk * kD * 2), stream>>>(
        q, cand, sink, n_heads, nope, n_cand, scale, out);
    return cudaGetLastError();
  }
  if (!rows_decoded) {
    KvDecodeRowsKernelImpl<<<static_cast<unsigned>(T * n_cand), kD / 4, 0, stream>>>(cand, kD, nope,
                                                                                     rows);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  const SplitWork w = CarveSplit(rows + T * n_cand * kD, std::min<int64_t>(T, kKvSplitMaxTokens),
                                 n_heads, n_cand, kD);
  const unsigned nch = static_cast<unsigned>((n_cand + kSparseChunk - 1) / kSparseChunk);
  for (int64_t t0 = 0; t0 < T; t0 += kKvSplitMaxTokens) {
    const int64_t n = std::min<int64_t>(T - t0, kKvSplitMaxTokens);
    KvSplitChunkKernelImpl<kD>
        <<<dim3(nch, static_cast<unsigned>(n),
                static_cast<unsigned>((n_heads + kSplitHeads - 1) / kSplitHeads)),
           kD / 2, 0, stream>>>(q + t0 * n_heads * kD, cand + t0 * n_cand, n_heads, n_cand, scale,
                                rows + t0 * n_cand * kD, w);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    OutRope r = rope;
    if (r.cos != nullptr) {
      r.cos += t0 * (r.dim / 2);
      r.sin += t0 * (r.dim / 2);
    }
    KvSplitCombineKernelImpl<kD><<<static_cast<unsigned>(n * n_heads), kD / 4, 0, stream>>>(
        sink, n_heads, static_cast<int>(nch), w, r, out + t0 * n_heads * kD);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t KvSparseAttention(const KvSparseAttentionParams& p, cudaStream_t stream) {
  const uint16_t* q = Raw(p.q);
  const uint64_t* cand = p.cand;
  const float* sink = p.sink;
  const int64_t T = p.T, n_heads = p.n_heads, head_dim = p.head_dim, nope = p.nope;
  const int64_t n_cand = p.n_cand;
  const float scale = p.scale;
  uint16_t* out = Raw(p.out);
  uint16_t* rows = Raw(p.rows);
  const bool rows_decoded = p.rows_decoded;
  const float* rope_cos = p.rope_cos;
  const float* rope_sin = p.rope_sin;
  const int64_t rope_dim = p.rope_dim;
  if (T == 0 || n_heads == 0) return cudaSuccess;
  if (head_dim % kSparseThreads != 0 || head_dim > 1024 || n_cand < 1 || T * n_heads > 0x7fffffff ||
      T * n_cand > 0x7fffffff || BadRecord(nope, head_dim - nope)) {
    return cudaErrorInvalidValue;
  }
  if (rope_cos != nullptr &&
      (rope_sin == nullptr || rope_dim < 2 || rope_dim % 2 != 0 || rope_dim > head_dim)) {
    return cudaErrorInvalidValue;
  }
  const int nop = static_cast<int>(nope);
  // The split path applies the inverse RoPE in its combine; the others leave it to ApplyRope.
  const bool fast = head_dim == 512 || head_dim == 256;
  const bool fused_rope = fast && rows != nullptr;
  const OutRope rope{fused_rope ? rope_cos : nullptr, rope_sin, static_cast<int>(rope_dim)};
  cudaError_t e;
  if (head_dim == 512) {
    e = LaunchFast<512>(q, cand, sink, T, n_heads, nop, n_cand, scale, rows, rows_decoded, rope,
                        out, stream);
  } else if (head_dim == 256) {
    e = LaunchFast<256>(q, cand, sink, T, n_heads, nop, n_cand, scale, rows, rows_decoded, rope,
                        out, stream);
  } else {
    KvSparseAttentionKernelImpl<<<static_cast<unsigned>(T * n_heads), kSparseThreads, 0, stream>>>(
        q, cand, sink, n_heads, head_dim, nop, n_cand, scale, out);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess || rope_cos == nullptr || fused_rope) return e;
  return ApplyRope(AsBf16(out), T, n_heads, head_dim, rope_dim, rope_cos, rope_sin, true, stream);
}

std::vector<SharedMemoryOptIn> KvSparseAttentionOptIns() {
  return {{"KvSparseAttention (head_dim 256)",
           reinterpret_cast<const void*>(&KvSparseAttentionFastKernelImpl<256>),
           static_cast<int>(kSparseChunk * 256 * 2)},
          {"KvSparseAttention (head_dim 512)",
           reinterpret_cast<const void*>(&KvSparseAttentionFastKernelImpl<512>),
           static_cast<int>(kSparseChunk * 512 * 2)}};
}

const void* KvBuildCandidatesKernel() {
  return reinterpret_cast<const void*>(&KvBuildCandidatesKernelImpl<false>);
}
const void* KvBuildCandidatesRowsKernel() {
  return reinterpret_cast<const void*>(&KvBuildCandidatesKernelImpl<true, 512>);
}
const void* KvEncodeRecordsKernel() {
  return reinterpret_cast<const void*>(&KvEncodeRecordsKernelImpl);
}
const void* KvEncodeKeysKernel() { return reinterpret_cast<const void*>(&KvEncodeKeysKernelImpl); }
const void* KvGatherKeysKernel() { return reinterpret_cast<const void*>(&KvGatherKeysKernelImpl); }
const void* KvSparseAttentionKernel() {
  return reinterpret_cast<const void*>(&KvSparseAttentionKernelImpl);
}
const void* KvSparseAttentionFastKernel() {
  return reinterpret_cast<const void*>(&KvSparseAttentionFastKernelImpl<512>);
}
const void* KvDecodeRowsKernel() { return reinterpret_cast<const void*>(&KvDecodeRowsKernelImpl); }
const void* KvSplitChunkKernel() {
  return reinterpret_cast<const void*>(&KvSplitChunkKernelImpl<512>);
}
const void* KvSplitCombineKernel() {
  return reinterpret_cast<const void*>(&KvSplitCombineKernelImpl<512>);
}

}  // namespace ss::cuda
