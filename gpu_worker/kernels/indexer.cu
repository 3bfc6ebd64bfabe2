// Lightning indexer (spec §3.8); mirrors common/model/indexer.cc (IndexerSelect) and
// common/codecs.cc (HadamardInplace, Fp4SimInplace).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>

#include "gpu_worker/kernels/compressor_common.cuh"
#include "gpu_worker/kernels/indexer.h"
#include "gpu_worker/kernels/limits.h"
#include "gpu_worker/kernels/paged_kv.h"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxGrid = 1u << 20;

// ---- Hadamard + FP4sim: one warp per row ----
//
// With rope_dim > 0 (IndexerPrepQ), first ApplyRope's rotation of the row's last rope_dim dims
// with cos/sin row `row / heads`: the pair (2i, 2i + 1) sits in lanes l, l ^ 1 of one register,
// and each value is rounded to bf16 as ApplyRope's store would round it.
constexpr int kPrepThreads = 64;  // 64 rows (a decode token's heads) spread over 32 SMs
constexpr int kPrepWarps = kPrepThreads / 32;

// kPer = n / 32 values per lane (a constant, so that no loop of WarpHadamardFp4 is guarded).
template <typename Acc, int kPer>
__global__ void __launch_bounds__(kPrepThreads)
    HadamardFp4KernelImpl(uint16_t* __restrict__ x, int64_t rows, float scale, int64_t heads,
                          int rope_dim, const float* __restrict__ cos_t,
                          const float* __restrict__ sin_t) {
  constexpr int n = 32 * kPer, per = kPer;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kPrepWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  uint16_t* xr = x + row * n;
  float v[kHadamardMaxPerLane];
#pragma unroll
  for (int k = 0; k < kHadamardMaxPerLane; ++k)
    v[k] = k < per ? Bf16ToF32(xr[lane + 32 * k]) : 0.0f;
  if (rope_dim > 0) {
    const float* cr = cos_t + (row / heads) * (rope_dim / 2);
    const float* sr = sin_t + (row / heads) * (rope_dim / 2);
#pragma unroll
    for (int k = 0; k < kHadamardMaxPerLane; ++k) {
      if (k < per) {
        const float other = __shfl_xor_sync(0xffffffffu, v[k], 1);
        const int r = lane + 32 * k - (n - rope_dim);
        if (r >= 0) {
          const float c = cr[r / 2], s = sr[r / 2];
          v[k] = RoundBf16Dev((lane & 1) == 0 ? __fsub_rn(__fmul_rn(v[k], c), __fmul_rn(other, s))
                                              : __fadd_rn(__fmul_rn(other, s), __fmul_rn(v[k], c)));
        }
      }
    }
  }
  WarpHadamardFp4<Acc>(v, per, scale);
#pragma unroll
  for (int k = 0; k < kHadamardMaxPerLane; ++k) {
    if (k < per) xr[lane + 32 * k] = F32ToBf16(v[k]);
  }
}

__global__ void IndexerWeightScaleKernelImpl(const float* __restrict__ proj, int64_t n, float scale,
                                             uint16_t* __restrict__ w) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    w[i] = F32ToBf16(__fmul_rn(RoundBf16Dev(proj[i]), scale));
  }
}

// ---- Scores ----
//
// grid (T, blocks), kScoreThreads threads (4 warps). Every score is one warp's work on a task
// of kKeys consecutive eligible keys of one token: the token's q is staged once per block in
// shared memory as bf16 pairs qs[l][d] = (q_l[d], q_{l+32}[d]) (heads padded to 64 with
// zeros), 16-byte chunks XOR-swizzled by l so that lane l reads 4 dims of its two heads in one
// conflict-free load; the task's keys are decoded once into fp32 rows (read 4 dims at a time
// by broadcast). Per key and head a sequential fp32 dot over d, bf16, relu, × w, bf16, then the
// TwoSum reduction over heads. The tasks of a row are dealt to the row's warps in turn, so a
// decode token's few long rows spread over every SM; blocks past the eligible keys only write
// −inf. A key's score depends on nothing but its own dot and reduction: not on kKeys, the
// grid, or the path below.
//
// Two dot paths, bit-identical: acc = fl(acc + fl(q·k)) as the reference sums, and one fma
// (one rounding of acc + q·k) where q·k is exact in fp32, which then gives the same sum. It is
// exact when both factors are bf16 values (8-bit significands: a 16-bit product) within
// [2^−60, 2^60) or zero, so the product stays normal and finite; the block checks q and each
// task its keys (the decoded MXFP4 keys are bf16 values) and takes the fma only where all pass.
constexpr int kMaxHeads = static_cast<int>(kIndexerMaxHeads);
constexpr int kMaxHeadDim = static_cast<int>(kIndexerMaxHeadDim);
constexpr int kScoreThreads = 128;
constexpr int kScoreWarps = kScoreThreads / 32;
static_assert(kMaxHeads == 64 && kMaxHeadDim == 128, "the q layout assumes 2 heads per lane");
// Rows of few tokens: tasks of fewer keys until there are kScoreMinTasks of them (short rows
// spread over the SMs; long rows keep 8 keys per task, 16 accumulators per lane).
constexpr int64_t kScoreMinTasks = 1024;
// Many rows: 4 tasks per warp (q staged once per 16 tasks).
constexpr int64_t kScoreTasksPerWarp = 4;
// Blocks per SM the registers must leave room for (128 per thread at most).
constexpr int kScoreBlocksPerSmMin = 4;
// log2(kKeys): the reduction levels that also split a task's keys between lanes.
template <int kKeys>
constexpr int kKeySplits = kKeys == 8   ? 3
                           : kKeys == 4 ? 2
                           : kKeys == 2 ? 1
                                        : 0;

// qs index of (lane l, dim d).
__device__ __forceinline__ int QsIndex(int l, int d) {
  return l * kMaxHeadDim + ((((d >> 2) ^ (l & 7)) << 2) | (d & 3));
}

// A bf16 value b for which b·k is exact in fp32 for every such k (see above).
__device__ __forceinline__ bool FmaSafeBf16(uint32_t b) {
  return (b & 0x7fffu) == 0 || ((b >> 7) & 0xffu) - 67u <= 119u;
}
__device__ __forceinline__ bool FmaSafePair(uint32_t p) {
  return FmaSafeBf16(p & 0xffffu) && FmaSafeBf16(p >> 16);
}

// e2m1 code (bit 3: sign; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6) as a float, built from its bits
// (no table in local memory): the same values, −0 included, as paged_kv.cu's E2m1Value.
__device__ __forceinline__ float E2m1Value(uint32_t c) {
  const uint32_t m = c & 7;
  const uint32_t mag = m < 2 ? m * (126u << 23) : ((126u + (m >> 1)) << 23) | ((m & 1) << 22);
  return __uint_as_float(mag | ((c & 8) << 28));
}

// KvGatherKeys' value of e2m1 code c with ue8m0 scale s: bf16(e2m1 · 2^(s−127)). For s in
// [2, 252] the product is normal and finite, so exact and already a bf16 value; the code's bits
// placed in fp32's exponent and mantissa fields give e2m1 · 2^−126 exactly (subnormal for 0.5).
__device__ __forceinline__ float MxKeyValue(uint32_t c, uint32_t s) {
  if (s - 2u <= 250u) {
    const float e = __fmul_rn(__uint_as_float(((c & 7u) << 22) | ((c & 8u) << 28)), 0x1p126f);
    return __fmul_rn(e, __uint_as_float(s << 23));
  }
  return Bf16ToF32(F32ToBf16(__fmul_rn(E2m1Value(c), Ue8m0ToF32(s))));
}

// Paged keys (paged_kv.h): key j of the sequence whose table is `table`, or null outside it.
__device__ __forceinline__ const uint8_t* PagedKey(const KvGeom& g, const int32_t* table,
                                                   int n_table, int64_t j) {
  const int jj = static_cast<int>(j);  // 0 ≤ j < n_cols < 2^31: 32-bit division
  const int64_t b = static_cast<int64_t>(g.first_entry_block) + jj / g.keys_per_block;
  if (b < 0 || b >= n_table) return nullptr;
  return reinterpret_cast<const uint8_t*>(g.pool) + static_cast<int64_t>(table[b]) * g.block_bytes +
         g.key_off + static_cast<int64_t>(jj % g.keys_per_block) * KvKeyBytes(g.key_dim);
}

// A warp's task of kKeys keys [jg, jg + kKeys): lane l holds dims 4l … 4l + 3 of each (paged:
// 4 e2m1 codes and the block's scale; else 4 bf16 values), fetched into registers one task
// ahead, then decoded into the warp's fp32 rows. Keys at or past jv, and paged keys outside the
// table, are 0 (KvGatherKeys' values).
template <bool kPaged, int kKeys>
struct ScoreKeys {
  uint2 raw[kKeys];

  __device__ __forceinline__ void Fetch(const KvGeom& g, const int32_t* table, int n_table,
                                        const uint16_t* kt, bool vec, int64_t jg, int64_t jv,
                                        int hd, int lane) {
    const bool mine = 4 * lane < hd;
    if constexpr (kPaged) {
      // Lane kk finds key kk; each lane then reads its 2 code bytes and scale byte of every key.
      const uint8_t* own = nullptr;
      if (lane < kKeys && jg + lane < jv) own = PagedKey(g, table, n_table, jg + lane);
#pragma unroll
      for (int kk = 0; kk < kKeys; ++kk) {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(own), kk));
        raw[kk] = make_uint2(0, 0);
        if (p != nullptr && mine) {
          raw[kk].x = p[2 * lane] | (static_cast<uint32_t>(p[2 * lane + 1]) << 8) |
                      (static_cast<uint32_t>(p[hd / 2 + lane / 8]) << 16);
          raw[kk].y = 1;
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kKeys; ++kk) {
        const int64_t j = jg + kk;
        raw[kk] = make_uint2(0, 0);
        if (j < jv && mine) {
          const uint16_t* k = kt + j * hd + 4 * lane;
          if (vec) {
            raw[kk] = *reinterpret_cast<const uint2*>(k);
          } else {
            uint32_t v[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = 4 * lane + e < hd ? k[e] : 0u;
            raw[kk] = make_uint2(v[0] | (v[1] << 16), v[2] | (v[3] << 16));
          }
        }
      }
    }
  }

  // Writes the rows ks[kk][4l … 4l + 3]; true where every value of this lane is FmaSafeBf16.
  __device__ __forceinline__ bool Store(float (*ks)[kMaxHeadDim], int hd, int lane) const {
    bool safe = true;
    if (4 * lane >= hd) return safe;
#pragma unroll
    for (int kk = 0; kk < kKeys; ++kk) {
      float v[4];
      if constexpr (kPaged) {
        const uint32_t codes = raw[kk].x & 0xffffu, s = (raw[kk].x >> 16) & 0xffu;
#pragma unroll
        for (int e = 0; e < 4; ++e)
          v[e] = raw[kk].y ? MxKeyValue((codes >> (4 * e)) & 15u, s) : 0.0f;
        // Values e2m1 · 2^(s−127) with magnitudes in [2^(s−128), 6·2^(s−127)].
        safe = safe && (raw[kk].y == 0 || s - 68u <= 116u);
      } else {
        v[0] = Bf16ToF32(static_cast<uint16_t>(raw[kk].x));
        v[1] = Bf16ToF32(static_cast<uint16_t>(raw[kk].x >> 16));
        v[2] = Bf16ToF32(static_cast<uint16_t>(raw[kk].y));
        v[3] = Bf16ToF32(static_cast<uint16_t>(raw[kk].y >> 16));
        safe = safe && FmaSafePair(raw[kk].x) && FmaSafePair(raw[kk].y);
      }
      *reinterpret_cast<float4*>(&ks[kk][4 * lane]) = make_float4(v[0], v[1], v[2], v[3]);
    }
    return safe;
  }
};

// The per-head dots of a task's keys: acc[kk][h] = Σ_d q_{l+32h}[d] · k_kk[d], d in order.
template <bool kFma, int kKeys>
__device__ __forceinline__ void ScoreDots(const uint32_t* qs, const float (*ks)[kMaxHeadDim],
                                          int hd, int lane, float (&acc)[kKeys][2]) {
  const auto add = [](float a, float q, float k) {
    return kFma ? __fmaf_rn(q, k, a) : __fadd_rn(a, __fmul_rn(q, k));
  };
#pragma unroll
  for (int kk = 0; kk < kKeys; ++kk) acc[kk][0] = acc[kk][1] = 0.0f;
  const uint32_t* ql = qs + lane * kMaxHeadDim;
  const int sw = lane & 7, hd4 = hd & ~3;
#pragma unroll 4
  for (int d = 0; d < hd4; d += 4) {
    const uint4 qq = *reinterpret_cast<const uint4*>(ql + (((d >> 2) ^ sw) << 2));
    const uint32_t qw[4] = {qq.x, qq.y, qq.z, qq.w};
    float4 kv[kKeys];
#pragma unroll
    for (int kk = 0; kk < kKeys; ++kk) kv[kk] = *reinterpret_cast<const float4*>(&ks[kk][d]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float q0 = __uint_as_float(qw[e] << 16), q1 = __uint_as_float(qw[e] & 0xffff0000u);
#pragma unroll
      for (int kk = 0; kk < kKeys; ++kk) {
        const float k = e == 0 ? kv[kk].x : e == 1 ? kv[kk].y : e == 2 ? kv[kk].z : kv[kk].w;
        acc[kk][0] = add(acc[kk][0], q0, k);
        acc[kk][1] = add(acc[kk][1], q1, k);
      }
    }
  }
  for (int d = hd4; d < hd; ++d) {
    const uint32_t qw = ql[(((d >> 2) ^ sw) << 2) | (d & 3)];
    const float q0 = __uint_as_float(qw << 16), q1 = __uint_as_float(qw & 0xffff0000u);
#pragma unroll
    for (int kk = 0; kk < kKeys; ++kk) {
      acc[kk][0] = add(acc[kk][0], q0, ks[kk][d]);
      acc[kk][1] = add(acc[kk][1], q1, ks[kk][d]);
    }
  }
}

// The TwoSum reduction over the 64 heads of kKeys keys at once: the butterfly over lanes of
// (s, e) pairs, one TwoSum of a lane's two heads first. Each level's pairs are combined as the
// one-key butterfly combines them (TwoSum's sum and exact error do not depend on the operands'
// order, nor does e + e'), but the first log2(kKeys) levels also split the keys between the two
// lanes of a pair, so that each lane carries half as many further. Returns lane l's key
// l >> (5 − log2 kKeys)'s score (every lane of its group has it). kFinite: no value is NaN,
// so the bf16 roundings may use the conversion instruction (two values at once; the same
// round-to-nearest-even as F32ToBf16, which differs only in a NaN's payload).
template <bool kFinite, int kKeys>
__device__ __forceinline__ float ReduceHeads(const float (&acc)[kKeys][2], float w0, float w1,
                                             int lane) {
  constexpr int kSplits = kKeySplits<kKeys>;
  const auto round2 = [](float a, float b, float(&r)[2]) {
    if constexpr (kFinite) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
      r[0] = __low2float(v);
      r[1] = __high2float(v);
    } else {
      r[0] = RoundBf16Dev(a);
      r[1] = RoundBf16Dev(b);
    }
  };
  float s[kKeys], e[kKeys];
#pragma unroll
  for (int kk = 0; kk < kKeys; ++kk) {
    float dot[2], r[2];
    round2(acc[kk][0], acc[kk][1], dot);
    const float relu0 = dot[0] < 0.0f ? 0.0f : dot[0];  // std::max(dot, 0.0f)
    const float relu1 = dot[1] < 0.0f ? 0.0f : dot[1];
    round2(__fmul_rn(relu0, w0), __fmul_rn(relu1, w1), r);
    TwoSum(r[0], r[1], s[kk], e[kk]);
  }
#pragma unroll
  for (int level = 0; level < 5; ++level) {
    const int o = 16 >> level;
    const bool split = level < kSplits, upper = (lane & o) != 0;
    const int n = split ? kKeys >> (level + 1) : 1;  // keys carried past this level
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const int other = (i + n) & (kKeys - 1);  // i + n while splitting
      const float keep_s = split && upper ? s[other] : s[i];
      const float keep_e = split && upper ? e[other] : e[i];
      const float send_s = split && !upper ? s[other] : s[i];
      const float send_e = split && !upper ? e[other] : e[i];
      const float so = __shfl_xor_sync(0xffffffffu, send_s, o);
      const float eo = __shfl_xor_sync(0xffffffffu, send_e, o);
      float s2, err;
      TwoSum(keep_s, so, s2, err);
      e[i] = __fadd_rn(__fadd_rn(keep_e, eo), err);
      s[i] = s2;
    }
  }
  return RoundBf16Dev(__fadd_rn(s[0], e[0]));
}

// kPaged: keys from the paged pool (g, table) instead of bf16 rows; with row_tokens, token t
// reads its own sequence's table (row_tokens[t]). kKeys keys per task.
template <bool kPaged, int kKeys>
__global__ void __launch_bounds__(kScoreThreads, kScoreBlocksPerSmMin)
    IndexerScoresKernelImpl(const uint16_t* __restrict__ q, const uint16_t* __restrict__ w,
                            const uint16_t* __restrict__ keys,
                            const int64_t* __restrict__ key_row_offset,
                            const int64_t* __restrict__ positions, int heads, int hd, int ratio,
                            int64_t n_cols, float* __restrict__ scores, KvGeom g,
                            const int32_t* __restrict__ table, int n_table,
                            const KvToken* __restrict__ row_tokens) {
  __shared__ __align__(16) uint32_t qs[32 * kMaxHeadDim];
  __shared__ __align__(16) float ks[kScoreWarps][kKeys][kMaxHeadDim];
  const int64_t t = blockIdx.x;
  if (kPaged && row_tokens != nullptr) {
    table = reinterpret_cast<const int32_t*>(row_tokens[t].table);
    n_table = row_tokens[t].n_table;
  }
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t eligible = (positions[t] + 1) / ratio;
  const int64_t jv = eligible < 0 ? 0 : eligible < n_cols ? eligible : n_cols;
  float* out = scores + t * n_cols;
  for (int64_t j = jv + static_cast<int64_t>(blockIdx.y) * kScoreThreads + tid; j < n_cols;
       j += static_cast<int64_t>(gridDim.y) * kScoreThreads) {
    out[j] = -INFINITY;
  }
  const int64_t n_tasks = (jv + kKeys - 1) / kKeys;
  const int64_t task_stride = static_cast<int64_t>(gridDim.y) * kScoreWarps;
  int64_t task = static_cast<int64_t>(blockIdx.y) * kScoreWarps + warp;
  if (static_cast<int64_t>(blockIdx.y) * kScoreWarps >= n_tasks) return;  // the whole block

  const uint16_t* kt =
      kPaged ? nullptr : keys + (key_row_offset != nullptr ? key_row_offset[t] : 0) * hd;
  const bool vec = hd % 4 == 0 && reinterpret_cast<uintptr_t>(keys) % 8 == 0;
  const uint16_t* qt = q + t * heads * hd;
  const bool q_vec = hd % 4 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0;
  // Lane c builds chunk c (dims 4c … 4c + 3) of rows l = warp, warp + 4, …: coalesced 8-byte
  // loads (issued before the first task's table lookup, so that the two latencies overlap), one
  // conflict-free 16-byte store per row.
  constexpr int kRows = 32 / kScoreWarps;
  uint2 qa[kRows], qb[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int l = warp + kScoreWarps * r, c = lane;
    qa[r] = qb[r] = make_uint2(0, 0);
    if (q_vec && 4 * c < hd) {
      if (l < heads) qa[r] = *reinterpret_cast<const uint2*>(qt + l * hd + 4 * c);
      if (l + 32 < heads) qb[r] = *reinterpret_cast<const uint2*>(qt + (l + 32) * hd + 4 * c);
    }
  }
  ScoreKeys<kPaged, kKeys> tk;
  if (task < n_tasks) tk.Fetch(g, table, n_table, kt, vec, task * kKeys, jv, hd, lane);

  const float w0 = lane < heads ? Bf16ToF32(w[t * heads + lane]) : 0.0f;
  const float w1 = lane + 32 < heads ? Bf16ToF32(w[t * heads + lane + 32]) : 0.0f;
  // With the fma's operands also the head weights finite: the fma path's bf16 roundings then
  // see no NaN, and the conversion instruction rounds as F32ToBf16 does.
  bool fma_ok = isfinite(w0) && isfinite(w1);
  if (q_vec) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int l = warp + kScoreWarps * r, c = lane;
      const uint2 a = qa[r], b = qb[r];
      fma_ok =
          fma_ok && FmaSafePair(a.x) && FmaSafePair(a.y) && FmaSafePair(b.x) && FmaSafePair(b.y);
      *reinterpret_cast<uint4*>(&qs[l * kMaxHeadDim + ((c ^ (l & 7)) << 2)]) =
          make_uint4(__byte_perm(a.x, b.x, 0x5410), __byte_perm(a.x, b.x, 0x7632),
                     __byte_perm(a.y, b.y, 0x5410), __byte_perm(a.y, b.y, 0x7632));
    }
  } else {
    for (int i = tid; i < 32 * kMaxHeadDim; i += kScoreThreads) {
      const int l = i / kMaxHeadDim, d = i % kMaxHeadDim;
      const uint32_t lo = l < heads && d < hd ? qt[l * hd + d] : 0u;
      const uint32_t hi = l + 32 < heads && d < hd ? qt[(l + 32) * hd + d] : 0u;
      fma_ok = fma_ok && FmaSafeBf16(lo) && FmaSafeBf16(hi);
      qs[QsIndex(l, d)] = lo | (hi << 16);
    }
  }
  fma_ok = __syncthreads_and(fma_ok) != 0;

  constexpr int kSplits = kKeySplits<kKeys>;
  for (; task < n_tasks; task += task_stride) {
    const int64_t jg = task * kKeys;
    const bool safe = tk.Store(ks[warp], hd, lane);
    if (task + task_stride < n_tasks) {
      tk.Fetch(g, table, n_table, kt, vec, (task + task_stride) * kKeys, jv, hd, lane);
    }
    __syncwarp();
    float acc[kKeys][2];
    float score;
    if (__all_sync(0xffffffffu, safe) && fma_ok) {
      ScoreDots<true, kKeys>(qs, ks[warp], hd, lane, acc);
      score = ReduceHeads<true, kKeys>(acc, w0, w1, lane);
    } else {
      ScoreDots<false, kKeys>(qs, ks[warp], hd, lane, acc);
      score = ReduceHeads<false, kKeys>(acc, w0, w1, lane);
    }
    const int64_t j = jg + (lane >> (5 - kSplits));
    if ((lane & ((32 >> kSplits) - 1)) == 0 && j < jv) out[j] = score;
    __syncwarp();
  }
}

bool IsPow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

using ScoresKernel = void (*)(const uint16_t*, const uint16_t*, const uint16_t*, const int64_t*,
                              const int64_t*, int, int, int, int64_t, float*, KvGeom,
                              const int32_t*, int, const KvToken*);

// Blocks of the kKeys-key scores kernel resident at once on the current device: the SMs times
// what shared memory allows (its static shared memory and the 1 KB the runtime reserves per
// block), at most kScoreBlocksPerSmMin (what __launch_bounds__ leaves the registers room for).
// Device attributes only, so safe during graph capture.
int64_t ResidentScoreBlocks(int keys) {
  int dev = 0, sms = 0, smem = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) !=
          cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it, and assume a small GPU
    return 128;
  }
  const int64_t block = (32 + kScoreWarps * keys) * kMaxHeadDim * 4 + 1024;
  return int64_t{sms} * std::max<int64_t>(1, std::min<int64_t>(kScoreBlocksPerSmMin, smem / block));
}

// The task size and the blocks per row: tasks of 8 keys unless that leaves too few for the SMs;
// a task per warp while that fits in one wave of resident blocks; beyond, few rows take one
// wave (the warps deal through more tasks each) and many rows kScoreTasksPerWarp tasks a warp.
template <bool kPaged>
cudaError_t LaunchScores(const uint16_t* q, const uint16_t* w, const uint16_t* keys,
                         const int64_t* key_row_offset, const int64_t* positions, int64_t T,
                         int64_t heads, int64_t head_dim, int64_t ratio, int64_t n_cols,
                         float* scores, const KvGeom& g, const int32_t* table, int64_t n_table,
                         const KvToken* row_tokens, cudaStream_t stream) {
  constexpr ScoresKernel kKernels[4] = {
      &IndexerScoresKernelImpl<kPaged, 1>, &IndexerScoresKernelImpl<kPaged, 2>,
      &IndexerScoresKernelImpl<kPaged, 4>, &IndexerScoresKernelImpl<kPaged, 8>};
  int splits = 3;
  while (splits > 0 && T * ((n_cols + (1 << splits) - 1) >> splits) < kScoreMinTasks) --splits;
  const ScoresKernel kernel = kKernels[splits];
  const int64_t tasks = (n_cols + (1 << splits) - 1) >> splits;
  const int64_t resident = ResidentScoreBlocks(1 << splits);
  int64_t per_row = (tasks + kScoreWarps - 1) / kScoreWarps;
  if (T * per_row > resident) {
    const int64_t many =
        (tasks + kScoreWarps * kScoreTasksPerWarp - 1) / (kScoreWarps * kScoreTasksPerWarp);
    per_row = T * many >= 4 * resident ? many : std::max<int64_t>(1, resident / T);
  }
  per_row = std::min<int64_t>(per_row, 65535);  // tasks are dealt in turn: any count covers a row
  kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(per_row)), kScoreThreads, 0,
           stream>>>(q, w, keys, key_row_offset, positions, static_cast<int>(heads),
                     static_cast<int>(head_dim), static_cast<int>(ratio), n_cols, scores, g, table,
                     static_cast<int>(n_table), row_tokens);
  return cudaGetLastError();
}

cudaError_t LaunchHadamardFp4(uint16_t* x, int64_t rows, int64_t n, bool fp64, int64_t heads,
                              int64_t rope_dim, const float* cos_t, const float* sin_t,
                              cudaStream_t stream) {
  if (rows < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const float scale = static_cast<float>(1.0 / sqrt(static_cast<double>(n)));
  const unsigned blocks = static_cast<unsigned>((rows + kPrepWarps - 1) / kPrepWarps);
  using Kernel = void (*)(uint16_t*, int64_t, float, int64_t, int, const float*, const float*);
  constexpr Kernel kKernels[2][5] = {
      {HadamardFp4KernelImpl<float, 1>, HadamardFp4KernelImpl<float, 2>,
       HadamardFp4KernelImpl<float, 4>, HadamardFp4KernelImpl<float, 8>,
       HadamardFp4KernelImpl<float, 16>},
      {HadamardFp4KernelImpl<double, 1>, HadamardFp4KernelImpl<double, 2>,
       HadamardFp4KernelImpl<double, 4>, HadamardFp4KernelImpl<double, 8>,
       HadamardFp4KernelImpl<double, 16>}};
  static_assert(kHadamardMaxDim == 32 << 4);
  kKernels[fp64][__builtin_ctzll(n / 32)]<<<blocks, kPrepThreads, 0, stream>>>(
      x, rows, scale, heads, static_cast<int>(rope_dim), cos_t, sin_t);
  return cudaGetLastError();
}

}  // namespace

cudaError_t HadamardFp4SimInplace(bf16_t* x, int64_t rows, int64_t n, bool fp64,
                                  cudaStream_t stream) {
  if (!IsPow2(n) || n < 32 || n > kHadamardMaxDim) return cudaErrorInvalidValue;
  return LaunchHadamardFp4(Raw(x), rows, n, fp64, 1, 0, nullptr, nullptr, stream);
}

cudaError_t IndexerPrepQ(bf16_t* q, int64_t T, int64_t heads, int64_t head_dim, int64_t rope_dim,
                         const float* cos_t, const float* sin_t, bool hadamard_fp64,
                         cudaStream_t stream) {
  if (heads < 1 || !IsPow2(head_dim) || head_dim < 32 || head_dim > kHadamardMaxDim ||
      rope_dim < 2 || rope_dim % 2 != 0 || rope_dim > head_dim) {
    return cudaErrorInvalidValue;
  }
  return LaunchHadamardFp4(Raw(q), T * heads, head_dim, hadamard_fp64, heads, rope_dim, cos_t,
                           sin_t, stream);
}

cudaError_t IndexerWeightScale(const float* proj, int64_t n, float scale, bf16_t* w,
                               cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  IndexerWeightScaleKernelImpl<<<static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid),
                                 kThreads, 0, stream>>>(proj, n, scale, Raw(w));
  return cudaGetLastError();
}

cudaError_t IndexerScores(const IndexerScoresParams& p, cudaStream_t stream) {
  const uint16_t *q = Raw(p.q), *w = Raw(p.w), *keys = Raw(p.keys);
  const int64_t *key_row_offset = p.key_row_offset, *positions = p.positions;
  const int64_t T = p.T, heads = p.heads, head_dim = p.head_dim, ratio = p.ratio, n_cols = p.n_cols;
  float* scores = p.scores;
  if (heads < 1 || heads > kIndexerMaxHeads || head_dim < 1 || head_dim > kIndexerMaxHeadDim ||
      ratio < 1 || ratio > INT_MAX || n_cols < 0 || n_cols > INT_MAX || T < 0 || T > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (T == 0 || n_cols == 0) return cudaSuccess;
  return LaunchScores<false>(q, w, keys, key_row_offset, positions, T, heads, head_dim, ratio,
                             n_cols, scores, KvGeom{}, nullptr, 0, nullptr, stream);
}

namespace {

cudaError_t LaunchKvScores(const uint16_t* q, const uint16_t* w, const KvGeom& g,
                           const int32_t* table, int64_t n_table, const KvToken* tokens,
                           const int64_t* positions, int64_t T, int64_t heads, int64_t ratio,
                           int64_t n_cols, float* scores, cudaStream_t stream) {
  const int64_t head_dim = g.key_dim;
  if (heads < 1 || heads > kIndexerMaxHeads || head_dim < 32 || head_dim % 32 != 0 ||
      head_dim > kIndexerMaxHeadDim || g.keys_per_block < 1 || ratio < 1 || ratio > INT_MAX ||
      n_cols < 0 || n_cols > INT_MAX || T < 0 || T > INT_MAX || n_table < 0 || n_table > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (T == 0 || n_cols == 0) return cudaSuccess;
  return LaunchScores<true>(q, w, nullptr, nullptr, positions, T, heads, head_dim, ratio, n_cols,
                            scores, g, table, n_table, tokens, stream);
}

}  // namespace

cudaError_t KvIndexerScores(const KvIndexerScoresParams& p, const int32_t* table, int64_t n_table,
                            cudaStream_t stream) {
  return LaunchKvScores(Raw(p.q), Raw(p.w), p.g, table, n_table, nullptr, p.positions, p.T, p.heads,
                        p.ratio, p.n_cols, p.scores, stream);
}

cudaError_t KvIndexerScoresTokens(const KvIndexerScoresParams& p, const KvToken* tokens,
                                  cudaStream_t stream) {
  if (tokens == nullptr && p.T > 0) return cudaErrorInvalidValue;
  return LaunchKvScores(Raw(p.q), Raw(p.w), p.g, nullptr, 0, tokens, p.positions, p.T, p.heads,
                        p.ratio, p.n_cols, p.scores, stream);
}

const void* HadamardFp4Kernel() {
  return reinterpret_cast<const void*>(&HadamardFp4KernelImpl<double, 4>);
}
const void* IndexerWeightScaleKernel() {
  return reinterpret_cast<const void*>(&IndexerWeightScaleKernelImpl);
}
const void* KvIndexerScoresKernel() {
  return reinterpret_cast<const void*>(&IndexerScoresKernelImpl<true, 8>);
}
const void* IndexerScoresKernel() {
  return reinterpret_cast<const void*>(&IndexerScoresKernelImpl<false, 8>);
}
}  // namespace ss::cuda
