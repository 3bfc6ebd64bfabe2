// Lightning indexer (spec §3.8); mirrors common/model/indexer.cc (IndexerSelect) and
// common/codecs.cc (HadamardInplace, Fp4SimInplace).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>

#include "gpu_worker/kernels/block_kernels.h"
#include "gpu_worker/kernels/compressor_common.cuh"
#include "gpu_worker/kernels/compressor_kernels.h"
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

// kPaged: keys from the paged pool (g, table) instead of bf16 rows. kKeys keys per task.
template <bool kPaged, int kKeys>
__global__ void __launch_bounds__(kScoreThreads, kScoreBlocksPerSmMin)
    IndexerScoresKernelImpl(const uint16_t* __restrict__ q, const uint16_t* __restrict__ w,
                            const uint16_t* __restrict__ keys,
                            const int64_t* __restrict__ key_row_offset,
                            const int64_t* __restrict__ positions, int heads, int hd, int ratio,
                            int64_t n_cols, float* __restrict__ scores, KvGeom g,
                            const int32_t* __restrict__ table, int n_table) {
  __shared__ __align__(16) uint32_t qs[32 * kMaxHeadDim];
  __shared__ __align__(16) float ks[kScoreWarps][kKeys][kMaxHeadDim];
  const int64_t t = blockIdx.x;
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

// ---- Top-k ----

constexpr int kTopKThreads = 512;
constexpr int kTopKWarps = kTopKThreads / 32;
constexpr int kMaxTopK = static_cast<int>(kIndexerMaxTopK);

// Order-preserving unsigned image of a float (larger float, larger key).
__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Selection keys: (score key, ~index) as one 64-bit value, so that the larger one is the higher
// score, then the lower index; every column's is distinct.
__device__ __forceinline__ unsigned long long SelKey(uint32_t u, int64_t i) {
  return (static_cast<unsigned long long>(u) << 32) |
         static_cast<unsigned long long>(0xffffffffu - static_cast<uint32_t>(i));
}
// The output entry of a selection key: its column, or −1 for a masked (−inf) score.
__device__ __forceinline__ int32_t SelColumn(unsigned long long key) {
  const uint32_t u = static_cast<uint32_t>(key >> 32);
  return u == OrderKey(-INFINITY)
             ? -1
             : static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key & 0xffffffffull));
}

// Sorts a[0, n) descending (n ≤ kMaxTopK; a has room for the next power of two): zero padding,
// then a bitonic sort, the strides below 32 of each size in registers.
template <int kBlockThreads>
__device__ void SortDescending(unsigned long long* a, int n) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  int P = 1;
  while (P < n) P <<= 1;
  for (int i = n + tid; i < P; i += kBlockThreads) a[i] = 0ull;
  __syncthreads();
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      if (stride < 32) {
        // The remaining strides of this size within each warp, in registers.
        for (int base = 0; base < P; base += kBlockThreads) {
          const int i = base + tid;
          if (base + (tid & ~31) >= P) break;
          unsigned long long x = i < P ? a[i] : 0ull;
          const bool descending = (i & size) == 0;
          for (int st = stride; st > 0; st >>= 1) {
            const unsigned long long y = __shfl_xor_sync(0xffffffffu, x, st);
            const bool lower = (lane & st) == 0;
            const unsigned long long hi = x > y ? x : y, lo = x > y ? y : x;
            x = lower == descending ? hi : lo;
          }
          if (i < P) a[i] = x;
        }
        __syncthreads();
        break;
      }
      for (int i = tid; i < P; i += kBlockThreads) {
        const int jx = i ^ stride;
        if (jx > i) {
          const unsigned long long x = a[i], y = a[jx];
          const bool descending = (i & size) == 0;
          if (descending ? x < y : x > y) {
            a[i] = y;
            a[jx] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}

// One block per row. Finds the k-th largest key by 8-bit digits from the top; after each digit
// the entries are "above" (high bits greater than the prefix: all selected), "tied" (equal
// high bits) or out. Stops early when every tied entry is needed. Then collects the above
// entries and the `need` lowest-index tied ones (a block-wide scan in index order), and sorts
// the k 64-bit keys (score key, ~index) descending.
// kPer > 0: the row's keys are read once into registers (n_cols ≤ kPer·kTopKThreads, column
// j·kTopKThreads + tid in keys[j]); 0: every pass reads the row.
template <int kPer>
__global__ void __launch_bounds__(kTopKThreads)
    IndexerTopKKernelImpl(const float* __restrict__ scores, int64_t n_cols, int k,
                          int32_t* __restrict__ sel) {
  __shared__ unsigned hist[256];
  __shared__ unsigned long long cand[kMaxTopK];
  __shared__ unsigned warp_ties[kTopKWarps];
  __shared__ uint32_t sh_prefix, sh_mask, sh_need;
  __shared__ unsigned sh_count;
  const float* row = scores + static_cast<int64_t>(blockIdx.x) * n_cols;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  constexpr int kRegs = kPer > 0 ? kPer : 1;
  constexpr int kChunks = kPer > 0 ? kPer : 0x7fffffff;
  uint32_t keys[kRegs];
  if constexpr (kPer > 0) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t i = static_cast<int64_t>(j) * kTopKThreads + tid;
      keys[j] = i < n_cols ? OrderKey(row[i]) : 0u;
    }
  }
  // The key of column i = j·kTopKThreads + tid (< n_cols).
  const auto key_at = [&](int j, int64_t i) -> uint32_t {
    if constexpr (kPer > 0) {
      return keys[j];
    } else {
      return OrderKey(row[i]);
    }
  };

  uint32_t prefix = 0, mask = 0, need = static_cast<uint32_t>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kTopKThreads) hist[i] = 0;
    __syncthreads();
    // Lanes with the same digit add once (scores share their top bits, so the bins are few).
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int64_t b = static_cast<int64_t>(j) * kTopKThreads;
      if (b >= n_cols) break;
      const int64_t i = b + tid;
      const uint32_t u = i < n_cols ? key_at(j, i) : 0u;
      const bool in = i < n_cols && (u & mask) == prefix;
      const uint32_t bin = in ? (u >> shift) & 0xffu : 256u;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], static_cast<unsigned>(__popc(peers)));
    }
    __syncthreads();
    // The digit: the largest d ≥ 1 with Σ_{j ≥ d} hist[j] ≥ need, else 0 (a suffix scan over
    // the 256 bins by the first 8 warps, bin 255 − tid per thread).
    const int d = 255 - tid;
    unsigned h = 0, incl = 0;  // incl: Σ hist[j], d ≤ j < the warp's first bin + 1
    if (tid < 256) {
      h = hist[d];
      incl = h;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      if (lane == 31) warp_ties[warp] = incl;
    }
    __syncthreads();
    if (tid < 256) {
      unsigned before = 0;
      for (int wi = 0; wi < warp; ++wi) before += warp_ties[wi];
      const unsigned above = before + incl - h;  // Σ_{j > d} hist[j]
      if ((above + h >= need || d == 0) && above < need) {
        sh_prefix = prefix | (static_cast<uint32_t>(d) << shift);
        sh_mask = mask | (0xffu << shift);
        sh_need = need - above;
        sh_count = h;
      }
    }
    __syncthreads();
    prefix = sh_prefix;
    mask = sh_mask;
    need = sh_need;
    const bool all_tied_needed = sh_count == need;
    __syncthreads();
    if (all_tied_needed) break;
  }

  // Collect in index order so that the first `need` tied entries are the lowest-index ones.
  if (tid == 0) sh_count = 0;
  __syncthreads();
  uint32_t tie_base = 0;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t base = static_cast<int64_t>(j) * kTopKThreads;
    if (base >= n_cols) break;
    const int64_t i = base + tid;
    uint32_t u = 0;
    bool above = false, tied = false;
    if (i < n_cols) {
      u = key_at(j, i);
      above = (u & mask) > prefix;
      tied = (u & mask) == prefix;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, tied);
    if (lane == 0) warp_ties[warp] = __popc(ballot);
    __syncthreads();
    uint32_t rank = tie_base + __popc(ballot & ((1u << lane) - 1u)), total = 0;
    for (int wi = 0; wi < kTopKWarps; ++wi) {
      if (wi < warp) rank += warp_ties[wi];
      total += warp_ties[wi];
    }
    if (above || (tied && rank < need)) {
      const unsigned slot = atomicAdd(&sh_count, 1u);
      if (slot < static_cast<unsigned>(k)) {
        cand[slot] = SelKey(u, i);
      }
    }
    tie_base += total;
    __syncthreads();  // warp_ties is rewritten by the next chunk
  }

  SortDescending<kTopKThreads>(cand, k);
  int32_t* out = sel + static_cast<int64_t>(blockIdx.x) * k;
  for (int i = tid; i < k; i += kTopKThreads) out[i] = SelColumn(cand[i]);
}

// Wide-digit top-k for long rows: one block of kFilterThreads per row, no workspace. An 11-bit
// histogram of the row's top key bits (then 11 and 10 more bits within the bin that holds the
// k-th largest, while needed) bounds the k-th largest key from below by a prefix that at most
// kFilterCap entries reach; those entries go to shared memory as selection keys, where an 8-bit
// radix select over the 64-bit keys (skipping digits that every candidate shares) finds the k
// largest, which are sorted as above. So a row of 16K-256K columns takes 2-3 passes over the
// row instead of 5, each with every load of a thread in flight. Two cases skip the candidates:
// a k-th largest of −inf (fewer than k finite scores: the finite ones, then −1s) and more than
// kFilterCap − k entries equal to the k-th largest key (the ones above it, then the lowest-index
// equal ones, found by a scan in index order). Same output as the kernels above.
constexpr int kFilterThreads = 1024;
constexpr int kFilterWarps = kFilterThreads / 32;
constexpr int kFilterCap = 4096;
constexpr int kFilterRegs = 16;  // rows of ≤ 16384 columns stay in registers
constexpr int kFilterBins = 2048;
constexpr uint32_t kMaskedBin = 0x007fffffu >> 21;  // OrderKey(−inf)'s first digit

struct DigitPick {
  unsigned digit, above, count;  // the digit, entries in higher bins, entries in its bin
};

// The bin of the need-th largest entry (1 ≤ need ≤ Σ hist): the largest d with
// Σ_{j ≥ d} hist[j] ≥ need. Thread t sums bins from the top down, a block scan gives each its
// count of higher bins. Ends with a barrier, after which hist may be rewritten.
template <int kBlockThreads>
__device__ DigitPick PickDigit(const unsigned* hist, int bins, unsigned need, unsigned* warp_sums,
                               DigitPick* pick) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int per = (bins + kBlockThreads - 1) / kBlockThreads, top = bins - per * tid;
  unsigned local = 0;
  for (int b = 1; b <= per; ++b) local += top - b >= 0 ? hist[top - b] : 0u;
  unsigned incl = local;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const unsigned x = lane < kBlockThreads / 32 ? warp_sums[lane] : 0u;
    unsigned s = x;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned v = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += v;
    }
    if (lane < kBlockThreads / 32) warp_sums[lane] = s - x;
  }
  __syncthreads();
  unsigned before = warp_sums[warp] + incl - local;
  for (int b = 1; b <= per && top - b >= 0; ++b) {
    const unsigned h = hist[top - b];
    if (before < need && before + h >= need) {
      *pick = DigitPick{static_cast<unsigned>(top - b), before, h};
    }
    before += h;
  }
  __syncthreads();
  return *pick;
}

// A slot from *counter (shared or global) for each lane with pred, one atomic per warp (any
// lanes active).
__device__ __forceinline__ unsigned AggregatedSlot(unsigned* counter, bool pred) {
  const unsigned active = __activemask(), votes = __ballot_sync(active, pred);
  const int lane = static_cast<int>(threadIdx.x) & 31, leader = __ffs(active) - 1;
  unsigned base = 0;
  if (lane == leader && votes != 0) base = atomicAdd(counter, static_cast<unsigned>(__popc(votes)));
  base = __shfl_sync(active, base, leader);
  return base + static_cast<unsigned>(__popc(votes & ((1u << lane) - 1u)));
}

// f(key, column) for each column of the thread's share of a row read from memory: 16-byte loads,
// four of them in flight per thread.
template <typename F>
__device__ __forceinline__ void ForEachRowKey(const float* __restrict__ row, int64_t n, F&& f) {
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t align = ((16u - (reinterpret_cast<uintptr_t>(row) & 15u)) & 15u) >> 2;
  const int64_t head = align < n ? align : n;
  if (tid < head) f(OrderKey(row[tid]), static_cast<int64_t>(tid));
  const float4* body = reinterpret_cast<const float4*>(row + head);
  const int64_t n4 = (n - head) >> 2;
  int64_t q = tid;
  for (; q + 3 * kFilterThreads < n4; q += 4 * kFilterThreads) {
    float4 v[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) v[r] = body[q + r * kFilterThreads];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t i = head + 4 * (q + r * kFilterThreads);
      f(OrderKey(v[r].x), i);
      f(OrderKey(v[r].y), i + 1);
      f(OrderKey(v[r].z), i + 2);
      f(OrderKey(v[r].w), i + 3);
    }
  }
  for (; q < n4; q += kFilterThreads) {
    const float4 v = body[q];
    const int64_t i = head + 4 * q;
    f(OrderKey(v.x), i);
    f(OrderKey(v.y), i + 1);
    f(OrderKey(v.z), i + 2);
    f(OrderKey(v.w), i + 3);
  }
  const int64_t i = head + 4 * n4 + tid;
  if (i < n) f(OrderKey(row[i]), i);
}

struct FilterShared {
  unsigned long long stage[kMaxTopK];  // the histograms, then the k winners
  unsigned long long cand[kFilterCap];
  unsigned warp_sums[kFilterWarps];
  DigitPick pick;
  unsigned n_cand, n_won;
};
static_assert(sizeof(FilterShared::stage) >= kFilterBins * sizeof(unsigned),
              "stage holds the first histogram");

// The filtered top-k of one row by a block of kFilterThreads threads. kRegs > 0: the row's keys
// are read once into registers (n_cols ≤ kRegs·kFilterThreads).
template <int kRegs>
__device__ void FilteredTopKRow(const float* __restrict__ row, int64_t n_cols, int k,
                                int32_t* __restrict__ out, FilterShared& sh) {
  unsigned* hist = reinterpret_cast<unsigned*>(sh.stage);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  uint32_t keys[kRegs > 0 ? kRegs : 1];
  if constexpr (kRegs > 0) {
#pragma unroll
    for (int j = 0; j < kRegs; ++j) {
      const int64_t i = static_cast<int64_t>(j) * kFilterThreads + tid;
      keys[j] = i < n_cols ? OrderKey(row[i]) : 0u;
    }
  }
  const auto for_each = [&](auto&& f) {
    if constexpr (kRegs > 0) {
#pragma unroll
      for (int j = 0; j < kRegs; ++j) {
        const int64_t i = static_cast<int64_t>(j) * kFilterThreads + tid;
        if (i < n_cols) f(keys[j], i);
      }
    } else {
      ForEachRowKey(row, n_cols, f);
    }
  };

  // The prefix of the k-th largest key, digit by digit, until at most kFilterCap entries reach it.
  uint32_t prefix = 0, mask = 0;
  unsigned need = static_cast<unsigned>(k), above = 0;
  enum { kSearching, kCandidates, kMasked, kTies } found = kSearching;
  for (int level = 0; level < 3 && found == kSearching; ++level) {
    const int shift = level == 0 ? 21 : level == 1 ? 10 : 0, bins = level == 2 ? 1024 : kFilterBins;
    for (int b = tid; b < bins; b += kFilterThreads) hist[b] = 0;
    __syncthreads();
    for_each([&](uint32_t u, int64_t) {
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & (bins - 1)], 1u);
    });
    __syncthreads();
    const DigitPick p = PickDigit<kFilterThreads>(hist, bins, need, sh.warp_sums, &sh.pick);
    prefix |= p.digit << shift;
    mask |= static_cast<uint32_t>(bins - 1) << shift;
    above += p.above;
    need -= p.above;
    if (level == 0 && p.digit == kMaskedBin) {
      found = kMasked;
    } else if (above + p.count <= kFilterCap) {
      found = kCandidates;
    } else if (level == 2) {
      found = kTies;
    }
  }

  // The candidates: every entry at or above the prefix; for kMasked and kTies the ones above.
  if (tid == 0) sh.n_cand = 0;
  __syncthreads();
  for_each([&](uint32_t u, int64_t i) {
    const bool in = found == kCandidates ? (u & mask) >= prefix : (u & mask) > prefix;
    const unsigned slot = AggregatedSlot(&sh.n_cand, in);
    if (in) sh.cand[slot] = SelKey(u, i);
  });
  unsigned n_sel = static_cast<unsigned>(k);  // entries of the selection, the rest −1
  if (found == kMasked) n_sel = above;
  if (found == kTies) {
    // After the `above` entries, the `need` lowest-index ones equal to the key `prefix`, in
    // index order: chunks of 4 columns per thread, a block scan of their counts.
    unsigned base = 0;
    for (int64_t c0 = 0; c0 < n_cols && base < need; c0 += 4 * kFilterThreads) {
      const int64_t i0 = c0 + 4 * tid;
      unsigned m = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (i0 + e < n_cols && OrderKey(row[i0 + e]) == prefix) m |= 1u << e;
      }
      const unsigned cnt = static_cast<unsigned>(__popc(m));
      unsigned incl = cnt;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      if (lane == 31) sh.warp_sums[warp] = incl;
      __syncthreads();
      unsigned rank = base + incl - cnt, total = 0;
      for (int wi = 0; wi < kFilterWarps; ++wi) {
        if (wi < warp) rank += sh.warp_sums[wi];
        total += sh.warp_sums[wi];
      }
      for (int e = 0; e < 4; ++e) {
        if ((m >> e) & 1u) {
          if (rank < need) sh.cand[above + rank] = SelKey(prefix, i0 + e);
          ++rank;
        }
      }
      base += total;
      __syncthreads();  // warp_sums is rewritten by the next chunk
    }
  }
  __syncthreads();
  const unsigned n_in = found == kCandidates ? sh.n_cand : n_sel;

  // The n_sel largest of cand[0, n_in): digits of 8 bits from the top, as the radix kernel.
  unsigned long long cprefix = 0, cmask = 0;
  if (n_in > n_sel) {
    unsigned long long any = 0, all = ~0ull;
    for (unsigned i = tid; i < n_in; i += kFilterThreads) {
      any |= sh.cand[i];
      all &= sh.cand[i];
    }
    for (int o = 16; o > 0; o >>= 1) {
      any |= __shfl_xor_sync(0xffffffffu, any, o);
      all &= __shfl_xor_sync(0xffffffffu, all, o);
    }
    if (lane == 0) {
      sh.stage[warp] = any;
      sh.stage[kFilterWarps + warp] = all;
    }
    __syncthreads();
    any = 0;
    all = ~0ull;
    for (int wi = 0; wi < kFilterWarps; ++wi) {
      any |= sh.stage[wi];
      all &= sh.stage[kFilterWarps + wi];
    }
    __syncthreads();
    unsigned cneed = n_sel;
    for (int shift = 56; shift >= 0; shift -= 8) {
      const unsigned long long dm = 0xffull << shift;
      if (((any ^ all) & dm) == 0) {  // the same digit in every candidate
        cprefix |= all & dm;
        cmask |= dm;
        continue;
      }
      for (int b = tid; b < 256; b += kFilterThreads) hist[b] = 0;
      __syncthreads();
      for (unsigned i = tid; i < n_in; i += kFilterThreads) {
        const unsigned long long c = sh.cand[i];
        if ((c & cmask) == cprefix) atomicAdd(&hist[(c >> shift) & 0xffu], 1u);
      }
      __syncthreads();
      const DigitPick p = PickDigit<kFilterThreads>(hist, 256, cneed, sh.warp_sums, &sh.pick);
      cprefix |= static_cast<unsigned long long>(p.digit) << shift;
      cmask |= dm;
      cneed -= p.above;
      if (p.count == cneed) break;
    }
  }
  if (tid == 0) sh.n_won = 0;
  __syncthreads();
  for (unsigned i = tid; i < n_in; i += kFilterThreads) {
    const unsigned long long c = sh.cand[i];
    const bool won = (c & cmask) >= cprefix;
    const unsigned slot = AggregatedSlot(&sh.n_won, won);
    if (won) sh.stage[slot] = c;
  }
  __syncthreads();
  SortDescending<kFilterThreads>(sh.stage, static_cast<int>(n_sel));
  for (int i = tid; i < k; i += kFilterThreads) {
    out[i] = i < static_cast<int>(n_sel) ? SelColumn(sh.stage[i]) : -1;
  }
}

template <int kRegs>
__global__ void __launch_bounds__(kFilterThreads)
    IndexerTopKFilterKernelImpl(const float* __restrict__ scores, int64_t n_cols, int k,
                                int32_t* __restrict__ sel) {
  __shared__ FilterShared sh;
  FilteredTopKRow<kRegs>(scores + static_cast<int64_t>(blockIdx.x) * n_cols, n_cols, k,
                         sel + static_cast<int64_t>(blockIdx.x) * k, sh);
}

// Split top-k for a few long rows (decode): the filtered kernel's first histogram and its
// candidates spread over many blocks, the final order by counting. Three launches, each over the
// whole row at once (one SM per row pays the filtered kernel's ~50 barriers and its serial sort):
//  1. blocks of kSplitCols columns add their 11-bit histogram of the key's top bits into the
//     row's histogram (global atomics of the non-empty bins);
//  2. the same blocks each find the bin of the k-th largest from that histogram and append
//     their entries at or above it (or above the −inf bin: fewer than k finite scores) to the
//     row's candidate list as selection keys;
//  3. blocks of kSplitRankCands candidates count, for each, the candidates above it: that count
//     is its output position (the keys are distinct). More than kFilterCap candidates (many
//     entries in the k-th largest's bin) and block 0 of the row runs the filtered kernel's code.
// The rows' histograms, candidate lists and counters are the caller's scratch of kSplitMaxRows
// rows (IndexerTopKScratchBytes, zeroed once when allocated), left zeroed for the next call (the
// histogram by launch 3, the counter by launch 1): calls sharing one scratch must not overlap
// (one stream, or ordered by events), as one backend's decode steps are.
constexpr int kSplitMaxRows = 8;
constexpr int kSplitThreads = 256;
constexpr int kSplitCols = 2048;  // 8 per thread
constexpr int kSplitRankCands = 64;
constexpr int64_t kSplitMinCols = 4096;

struct SplitRow {
  unsigned hist[kFilterBins];  // launch 1 adds, 2 reads, 3 zeroes
  unsigned n_cand;             // launch 1 zeroes, 2 counts, 3 reads
  unsigned n_sel;              // launch 2: k, or the finite scores when fewer
  unsigned overflow;           // launch 2: more than kFilterCap candidates
  unsigned long long cand[kFilterCap];
};

__global__ void __launch_bounds__(kSplitThreads)
    IndexerTopKSplitHistKernelImpl(const float* __restrict__ scores, int64_t n_cols,
                                   SplitRow* __restrict__ rows) {
  __shared__ unsigned hist[kFilterBins];
  SplitRow& r = rows[blockIdx.x];
  const float* row = scores + static_cast<int64_t>(blockIdx.x) * n_cols;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * kSplitCols;
  if (blockIdx.y == 0 && tid == 0) r.n_cand = 0;
  float v[kSplitCols / kSplitThreads];
#pragma unroll
  for (int e = 0; e < kSplitCols / kSplitThreads; ++e) {
    const int64_t i = j0 + e * kSplitThreads + tid;
    v[e] = i < n_cols ? row[i] : 0.0f;
  }
  for (int b = tid; b < kFilterBins; b += kSplitThreads) hist[b] = 0;
  __syncthreads();
#pragma unroll
  for (int e = 0; e < kSplitCols / kSplitThreads; ++e) {
    if (j0 + e * kSplitThreads + tid < n_cols) atomicAdd(&hist[OrderKey(v[e]) >> 21], 1u);
  }
  __syncthreads();
  for (int b = tid; b < kFilterBins; b += kSplitThreads) {
    if (hist[b] != 0) atomicAdd(&r.hist[b], hist[b]);
  }
}

__global__ void __launch_bounds__(kSplitThreads)
    IndexerTopKSplitCandKernelImpl(const float* __restrict__ scores, int64_t n_cols, int k,
                                   SplitRow* __restrict__ rows) {
  __shared__ unsigned hist[kFilterBins];
  __shared__ unsigned warp_sums[kSplitThreads / 32];
  __shared__ DigitPick pick;
  SplitRow& r = rows[blockIdx.x];
  const float* row = scores + static_cast<int64_t>(blockIdx.x) * n_cols;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * kSplitCols;
  float v[kSplitCols / kSplitThreads];
#pragma unroll
  for (int e = 0; e < kSplitCols / kSplitThreads; ++e) {
    const int64_t i = j0 + e * kSplitThreads + tid;
    v[e] = i < n_cols ? row[i] : 0.0f;
  }
  for (int b = tid; b < kFilterBins; b += kSplitThreads) hist[b] = r.hist[b];
  __syncthreads();
  const DigitPick p =
      PickDigit<kSplitThreads>(hist, kFilterBins, static_cast<unsigned>(k), warp_sums, &pick);
  const bool masked = p.digit == kMaskedBin;
  const bool overflow = !masked && p.above + p.count > kFilterCap;
  if (blockIdx.y == 0 && tid == 0) {
    r.n_sel = masked ? p.above : static_cast<unsigned>(k);
    r.overflow = overflow;
  }
  if (overflow) return;
#pragma unroll
  for (int e = 0; e < kSplitCols / kSplitThreads; ++e) {
    const int64_t i = j0 + e * kSplitThreads + tid;
    const uint32_t u = OrderKey(v[e]), d = u >> 21;
    const bool in = i < n_cols && (masked ? d > p.digit : d >= p.digit);
    const unsigned slot = AggregatedSlot(&r.n_cand, in);
    if (in) r.cand[slot] = SelKey(u, i);
  }
}

__global__ void __launch_bounds__(kFilterThreads)
    IndexerTopKSplitRankKernelImpl(const float* __restrict__ scores, int64_t n_cols, int k,
                                   int32_t* __restrict__ sel, SplitRow* __restrict__ rows) {
  __shared__ FilterShared sh;
  SplitRow& r = rows[blockIdx.x];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  int32_t* out = sel + static_cast<int64_t>(blockIdx.x) * k;
  if (blockIdx.y == 0) {
    for (int b = tid; b < kFilterBins; b += kFilterThreads) r.hist[b] = 0;
  }
  const unsigned n_sel = r.n_sel, n = r.n_cand;
  if (r.overflow != 0) {
    if (blockIdx.y == 0) {
      FilteredTopKRow<0>(scores + static_cast<int64_t>(blockIdx.x) * n_cols, n_cols, k, out, sh);
    }
    return;
  }
  if (blockIdx.y == 0) {
    for (int i = static_cast<int>(n_sel) + tid; i < k; i += kFilterThreads) out[i] = -1;
  }
  const unsigned c0 = blockIdx.y * kSplitRankCands;
  if (c0 >= n) return;
  for (unsigned i = tid; i < n; i += kFilterThreads) sh.cand[i] = r.cand[i];
  __syncthreads();
  // Lane l counts for candidates c0 + l and c0 + 32 + l over warp w's share of the list.
  unsigned* partial = reinterpret_cast<unsigned*>(sh.stage);  // [kFilterWarps][kSplitRankCands]
  const unsigned long long a = c0 + lane < n ? sh.cand[c0 + lane] : ~0ull;
  const unsigned long long b = c0 + 32 + lane < n ? sh.cand[c0 + 32 + lane] : ~0ull;
  unsigned ca = 0, cb = 0;
  for (unsigned j = warp; j < n; j += kFilterWarps) {
    const unsigned long long c = sh.cand[j];
    ca += c > a;
    cb += c > b;
  }
  partial[warp * kSplitRankCands + lane] = ca;
  partial[warp * kSplitRankCands + 32 + lane] = cb;
  __syncthreads();
  if (tid < kSplitRankCands && c0 + tid < n) {
    unsigned rank = 0;
    for (int w = 0; w < kFilterWarps; ++w) rank += partial[w * kSplitRankCands + tid];
    if (rank < n_sel) out[rank] = SelColumn(sh.cand[c0 + tid]);
  }
}

// Counting top-k for short rows (decode): the output position of column i is its rank, the
// number of columns j whose (key, −index) is larger (key_j > key_i, or equal with j < i): the
// same order as the kernel above (above, then the lowest-index ties, sorted descending). grid
// (T, ceil(n_cols / 32)): each block copies the row's keys to shared memory (zero padding past
// n_cols, which never counts) and ranks 32 columns, one per lane, its 8 warps splitting the row;
// no select passes, no sort, one barrier.
constexpr int kRankThreads = 256;
constexpr int kRankWarps = kRankThreads / 32;

__global__ void __launch_bounds__(kRankThreads)
    IndexerTopKRankKernelImpl(const float* __restrict__ scores, int n_cols, int k,
                              int32_t* __restrict__ sel) {
  extern __shared__ uint4 row_keys[];  // ceil(n_cols / 4)
  __shared__ unsigned partial[kRankWarps][32];
  uint32_t* keys = reinterpret_cast<uint32_t*>(row_keys);
  const float* row = scores + static_cast<int64_t>(blockIdx.x) * n_cols;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int n4 = (n_cols + 3) / 4;
#pragma unroll 4
  for (int j = tid; j < 4 * n4; j += kRankThreads) keys[j] = j < n_cols ? OrderKey(row[j]) : 0u;
  __syncthreads();
  const int i0 = static_cast<int>(blockIdx.y) * 32, i = i0 + lane;
  const uint32_t ki = i < n_cols ? keys[i] : 0u;
  unsigned c = 0;
  // Columns before the block's 32 count when ≥ (ties go to the lower index), after them when >,
  // among them (chunk i0/4 + warp) by both key and index.
  for (int q = warp; q < i0 / 4; q += kRankWarps) {
    const uint4 v = row_keys[q];
    c += (v.x >= ki) + (v.y >= ki) + (v.z >= ki) + (v.w >= ki);
  }
  if (i0 / 4 + warp < n4) {
    const uint4 v = row_keys[i0 / 4 + warp];
    const int j = i0 + 4 * warp;
    c += (v.x > ki || (v.x == ki && j < i)) + (v.y > ki || (v.y == ki && j + 1 < i)) +
         (v.z > ki || (v.z == ki && j + 2 < i)) + (v.w > ki || (v.w == ki && j + 3 < i));
  }
  for (int q = i0 / 4 + kRankWarps + warp; q < n4; q += kRankWarps) {
    const uint4 v = row_keys[q];
    c += (v.x > ki) + (v.y > ki) + (v.z > ki) + (v.w > ki);
  }
  partial[warp][lane] = c;
  __syncthreads();
  if (warp == 0 && i < n_cols) {
    unsigned rank = 0;
#pragma unroll
    for (int w = 0; w < kRankWarps; ++w) rank += partial[w][lane];
    if (rank < static_cast<unsigned>(k)) {
      sel[static_cast<int64_t>(blockIdx.x) * k + rank] = ki == OrderKey(-INFINITY) ? -1 : i;
    }
  }
}

// The counting kernel while a call compares at most kRankMaxPairs key pairs (T · n_cols²; the
// radix kernel's passes and sort cost far more at one short row) on rows of ≤ kRankMaxCols.
constexpr int64_t kRankMaxCols = 8192;  // 32 KB of keys
constexpr int64_t kRankMaxPairs = int64_t{1} << 26;

// The wide-digit kernel above this many columns (where the radix kernel reads the row from
// memory in every pass, or holds 32 keys per thread).
constexpr int64_t kFilterMinCols = 4096;

cudaError_t LaunchTopK(const float* scores, int64_t T, int64_t n_cols, int64_t k,
                       IndexerTopKKind kind, int32_t* sel, void* scratch, cudaStream_t stream) {
  switch (kind) {
    case IndexerTopKKind::kCounting: {
      const int64_t n4 = (n_cols + 3) / 4;
      IndexerTopKRankKernelImpl<<<dim3(static_cast<unsigned>(T),
                                       static_cast<unsigned>((n_cols + 31) / 32)),
                                  kRankThreads, static_cast<size_t>(16 * n4), stream>>>(
          scores, static_cast<int>(n_cols), static_cast<int>(k), sel);
      return cudaGetLastError();
    }
    case IndexerTopKKind::kRadix: {
      const auto kernel = n_cols <= 4 * kTopKThreads    ? IndexerTopKKernelImpl<4>
                          : n_cols <= 32 * kTopKThreads ? IndexerTopKKernelImpl<32>
                                                        : IndexerTopKKernelImpl<0>;
      kernel<<<static_cast<unsigned>(T), kTopKThreads, 0, stream>>>(scores, n_cols,
                                                                    static_cast<int>(k), sel);
      return cudaGetLastError();
    }
    case IndexerTopKKind::kFiltered: {
      const auto kernel = n_cols <= kFilterRegs * kFilterThreads
                              ? IndexerTopKFilterKernelImpl<kFilterRegs>
                              : IndexerTopKFilterKernelImpl<0>;
      kernel<<<static_cast<unsigned>(T), kFilterThreads, 0, stream>>>(scores, n_cols,
                                                                      static_cast<int>(k), sel);
      return cudaGetLastError();
    }
    case IndexerTopKKind::kSplit: {
      SplitRow* rows = static_cast<SplitRow*>(scratch);
      const dim3 slices(static_cast<unsigned>(T),
                        static_cast<unsigned>((n_cols + kSplitCols - 1) / kSplitCols));
      IndexerTopKSplitHistKernelImpl<<<slices, kSplitThreads, 0, stream>>>(scores, n_cols, rows);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      IndexerTopKSplitCandKernelImpl<<<slices, kSplitThreads, 0, stream>>>(
          scores, n_cols, static_cast<int>(k), rows);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      IndexerTopKSplitRankKernelImpl<<<dim3(static_cast<unsigned>(T), kFilterCap / kSplitRankCands),
                                       kFilterThreads, 0, stream>>>(scores, n_cols,
                                                                    static_cast<int>(k), sel, rows);
      return cudaGetLastError();
    }
  }
  return cudaErrorInvalidValue;
}

bool IsPow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

using ScoresKernel = void (*)(const uint16_t*, const uint16_t*, const uint16_t*, const int64_t*,
                              const int64_t*, int, int, int, int64_t, float*, KvGeom,
                              const int32_t*, int);

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
                         cudaStream_t stream) {
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
                     static_cast<int>(n_table));
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

cudaError_t HadamardFp4SimInplace(uint16_t* x, int64_t rows, int64_t n, bool fp64,
                                  cudaStream_t stream) {
  if (!IsPow2(n) || n < 32 || n > kHadamardMaxDim) return cudaErrorInvalidValue;
  return LaunchHadamardFp4(x, rows, n, fp64, 1, 0, nullptr, nullptr, stream);
}

cudaError_t IndexerPrepQ(uint16_t* q, int64_t T, int64_t heads, int64_t head_dim, int64_t rope_dim,
                         const float* cos_t, const float* sin_t, bool hadamard_fp64,
                         cudaStream_t stream) {
  if (heads < 1 || !IsPow2(head_dim) || head_dim < 32 || head_dim > kHadamardMaxDim ||
      rope_dim < 2 || rope_dim % 2 != 0 || rope_dim > head_dim) {
    return cudaErrorInvalidValue;
  }
  return LaunchHadamardFp4(q, T * heads, head_dim, hadamard_fp64, heads, rope_dim, cos_t, sin_t,
                           stream);
}

cudaError_t IndexerWeightScale(const float* proj, int64_t n, float scale, uint16_t* w,
                               cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  IndexerWeightScaleKernelImpl<<<static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid),
                                 kThreads, 0, stream>>>(proj, n, scale, w);
  return cudaGetLastError();
}

cudaError_t IndexerScores(const uint16_t* q, const uint16_t* w, const uint16_t* keys,
                          const int64_t* key_row_offset, const int64_t* positions, int64_t T,
                          int64_t heads, int64_t head_dim, int64_t ratio, int64_t n_cols,
                          float* scores, cudaStream_t stream) {
  if (heads < 1 || heads > kIndexerMaxHeads || head_dim < 1 || head_dim > kIndexerMaxHeadDim ||
      ratio < 1 || ratio > INT_MAX || n_cols < 0 || n_cols > INT_MAX || T < 0 || T > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (T == 0 || n_cols == 0) return cudaSuccess;
  return LaunchScores<false>(q, w, keys, key_row_offset, positions, T, heads, head_dim, ratio,
                             n_cols, scores, KvGeom{}, nullptr, 0, stream);
}

cudaError_t KvIndexerScores(const uint16_t* q, const uint16_t* w, const KvGeom& g,
                            const int32_t* table, int64_t n_table, const int64_t* positions,
                            int64_t T, int64_t heads, int64_t ratio, int64_t n_cols, float* scores,
                            cudaStream_t stream) {
  const int64_t head_dim = g.key_dim;
  if (heads < 1 || heads > kIndexerMaxHeads || head_dim < 32 || head_dim % 32 != 0 ||
      head_dim > kIndexerMaxHeadDim || g.keys_per_block < 1 || ratio < 1 || ratio > INT_MAX ||
      n_cols < 0 || n_cols > INT_MAX || T < 0 || T > INT_MAX || n_table < 0 || n_table > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (T == 0 || n_cols == 0) return cudaSuccess;
  return LaunchScores<true>(q, w, nullptr, nullptr, positions, T, heads, head_dim, ratio, n_cols,
                            scores, g, table, n_table, stream);
}

int64_t IndexerTopKScratchBytes() { return int64_t{kSplitMaxRows} * sizeof(SplitRow); }

cudaError_t IndexerTopK(const float* scores, int64_t T, int64_t n_cols, int64_t k, int32_t* sel,
                        void* scratch, cudaStream_t stream) {
  const IndexerTopKKind kind =
      scratch != nullptr && n_cols > kSplitMinCols && T <= kSplitMaxRows ? IndexerTopKKind::kSplit
      : n_cols >= 1 && n_cols <= kRankMaxCols && T <= kRankMaxPairs / (n_cols * n_cols)
          ? IndexerTopKKind::kCounting
      : n_cols > kFilterMinCols ? IndexerTopKKind::kFiltered
                                : IndexerTopKKind::kRadix;
  return IndexerTopKPath(scores, T, n_cols, k, kind, sel, scratch, stream);
}

cudaError_t IndexerTopKPath(const float* scores, int64_t T, int64_t n_cols, int64_t k,
                            IndexerTopKKind kind, int32_t* sel, void* scratch,
                            cudaStream_t stream) {
  if (k < 1 || k > kIndexerMaxTopK || k > n_cols || n_cols >= (int64_t{1} << 32) || T < 0 ||
      T > INT_MAX || (kind == IndexerTopKKind::kCounting && n_cols > kRankMaxCols) ||
      (kind == IndexerTopKKind::kSplit &&
       (scratch == nullptr || T > kSplitMaxRows || n_cols > int64_t{kSplitCols} * 65535))) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  return LaunchTopK(scores, T, n_cols, k, kind, sel, scratch, stream);
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
const void* IndexerTopKKernel() { return reinterpret_cast<const void*>(&IndexerTopKKernelImpl<4>); }
const void* IndexerTopKFilteredKernel() {
  return reinterpret_cast<const void*>(&IndexerTopKFilterKernelImpl<kFilterRegs>);
}
const void* IndexerTopKFilteredStreamKernel() {
  return reinterpret_cast<const void*>(&IndexerTopKFilterKernelImpl<0>);
}
const void* IndexerTopKSplitRankKernel() {
  return reinterpret_cast<const void*>(&IndexerTopKSplitRankKernelImpl);
}
const void* IndexerTopKCountingKernel() {
  return reinterpret_cast<const void*>(&IndexerTopKRankKernelImpl);
}

}  // namespace ss::cuda
