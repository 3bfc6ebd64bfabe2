// Lightning indexer (spec §3.8); mirrors common/model/indexer.cc (IndexerSelect) and
// common/codecs.cc (HadamardInplace, Fp4SimInplace).
#include <climits>
#include <type_traits>

#include "gpu_worker/kernels/block_kernels.h"
#include "gpu_worker/kernels/compressor_common.cuh"
#include "gpu_worker/kernels/compressor_kernels.h"
#include "gpu_worker/kernels/paged_kv.h"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
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
// grid (T, ceil(n_cols / kTile)), kThreads threads. The token's q is staged transposed in
// shared memory as fp32 pairs qs[d][l] = (q_l[d], q_{l+32}[d]) (heads padded to 64 with zeros),
// so lane l reads its two heads of one dim in one conflict-free 8-byte load. Each warp scores
// kKeys keys at a time (staged in shared memory, read 4 dims at a time by broadcast): per key
// and head a sequential fp32 dot over d, bf16, relu, × w, bf16, then the TwoSum warp reduction
// over heads. A key's score does not depend on kKeys or kTile: few tokens (decode) take small
// tiles of 2 or 1 keys per warp, so that the keys spread evenly over all SMs.
constexpr int kMaxHeads = static_cast<int>(kIndexerMaxHeads);
constexpr int kMaxHeadDim = static_cast<int>(kIndexerMaxHeadDim);
constexpr int kKeysPerWarp = 4;
constexpr int kTileKeys = 64;
constexpr int kSmallKeysPerWarp = 2;
constexpr int kSmallTileKeys = kWarps * kSmallKeysPerWarp;
constexpr int kTinyTileKeys = kWarps;  // 1 key per warp
// Blocks (T · tiles) below which the next smaller tile is used.
constexpr int64_t kSmallTileMaxBlocks = 256;

// Staged keys: fp32 for the small tiles, bf16 for the 64-key tiles (an fp32 copy would not fit
// beside q in 48 KB). Both hold the same values.
template <int kKeys>
using StagedKey = std::conditional_t<(kKeys <= kSmallKeysPerWarp), float, uint16_t>;
__device__ __forceinline__ void PutKey(float* p, uint16_t bits) { *p = Bf16ToF32(bits); }
__device__ __forceinline__ void PutKey(uint16_t* p, uint16_t bits) { *p = bits; }
__device__ __forceinline__ float GetKey(const float* p) { return *p; }
__device__ __forceinline__ float GetKey(const uint16_t* p) { return Bf16ToF32(*p); }
// Dims d … d + 3 (d a multiple of 4).
__device__ __forceinline__ float4 GetKeys4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 GetKeys4(const uint16_t* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                     __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

// e2m1 code (bit 3: sign; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6) as a float, built from its bits
// (no table in local memory): the same values, −0 included, as paged_kv.cu's E2m1Value.
__device__ __forceinline__ float E2m1Value(uint32_t c) {
  const uint32_t m = c & 7;
  const uint32_t mag = m < 2 ? m * (126u << 23) : ((126u + (m >> 1)) << 23) | ((m & 1) << 22);
  return __uint_as_float(mag | ((c & 8) << 28));
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

// A warp's kKeys paged keys [jg, jg + kKeys) (KvGatherKeys' values: e2m1 · ue8m0 scale, exact in
// bf16; 0 at or past jv and outside the table), 32 / kKeys lanes per key. With 4-byte aligned
// keys (`words`), a lane holds words sub, sub + 32 / kKeys, … of its key (8 codes each) and their
// scales, fetched into registers ahead of Store (a tile's loads overlap the q fill or the previous
// tile's dot); otherwise Store reads the key bytes itself.
template <int kKeys>
struct PagedKeyTile {
  static constexpr int kLanesPerKey = 32 / kKeys;
  static constexpr int kMaxWords = (kMaxHeadDim / 8 + kLanesPerKey - 1) / kLanesPerKey;
  uint32_t codes[kMaxWords];
  uint32_t scales[kMaxWords];
  bool present;

  __device__ __forceinline__ void Fetch(const KvGeom& g, const int32_t* table, int n_table,
                                        int64_t jg, int64_t jv, int hd, int lane) {
    const int64_t j = jg + lane / kLanesPerKey;
    const uint8_t* k = j < jv ? PagedKey(g, table, n_table, j) : nullptr;
    present = k != nullptr;
#pragma unroll
    for (int m = 0; m < kMaxWords; ++m) {
      const int wi = lane % kLanesPerKey + kLanesPerKey * m;
      codes[m] = 0;
      scales[m] = 0;
      if (present && wi < hd / 8) {
        codes[m] = *reinterpret_cast<const uint32_t*>(k + 4 * wi);
        scales[m] = k[hd / 2 + wi / 4];
      }
    }
  }

  template <typename K>
  __device__ __forceinline__ void Store(const KvGeom& g, const int32_t* table, int n_table,
                                        int64_t jg, int64_t jv, int hd, int lane, bool words,
                                        K (*ks)[kMaxHeadDim]) const {
    const int kk = lane / kLanesPerKey, sub = lane % kLanesPerKey;
    if (words) {
#pragma unroll
      for (int m = 0; m < kMaxWords; ++m) {
        const int wi = sub + kLanesPerKey * m;
        if (wi < hd / 8) {
          const float sc = Ue8m0ToF32(static_cast<uint8_t>(scales[m]));
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float v = E2m1Value((codes[m] >> (4 * e)) & 15);
            PutKey(&ks[kk][8 * wi + e], present ? F32ToBf16(__fmul_rn(v, sc)) : uint16_t{0});
          }
        }
      }
      return;
    }
    const int64_t j = jg + kk;
    const uint8_t* k = j < jv ? PagedKey(g, table, n_table, j) : nullptr;
    for (int d = sub; d < hd; d += kLanesPerKey) {
      uint16_t v = 0;
      if (k != nullptr) {
        const uint32_t byte = k[d / 2];
        v = F32ToBf16(
            __fmul_rn(E2m1Value((d & 1) ? byte >> 4 : byte & 15), Ue8m0ToF32(k[hd / 2 + d / 32])));
      }
      PutKey(&ks[kk][d], v);
    }
  }
};

// kPaged: keys from the paged pool (g, table) instead of bf16 rows. kKeys keys per warp at a
// time, kTile keys per block.
template <bool kPaged, int kKeys, int kTile>
__global__ void __launch_bounds__(kThreads)
    IndexerScoresKernelImpl(const uint16_t* __restrict__ q, const uint16_t* __restrict__ w,
                            const uint16_t* __restrict__ keys,
                            const int64_t* __restrict__ key_row_offset,
                            const int64_t* __restrict__ positions, int heads, int hd, int ratio,
                            int64_t n_cols, float* __restrict__ scores, KvGeom g,
                            const int32_t* __restrict__ table, int n_table) {
  using K = StagedKey<kKeys>;
  __shared__ float2 qs[kMaxHeadDim][33];  // 33: the transposed fill has 2-way bank conflicts
  __shared__ float ws[kMaxHeads];
  __shared__ __align__(16) K ks[kWarps][kKeys][kMaxHeadDim];
  const int64_t t = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t j1 = j0 + kTile < n_cols ? j0 + kTile : n_cols;
  const int64_t eligible = (positions[t] + 1) / ratio;
  float* out = scores + t * n_cols;
  if (j0 >= eligible) {
    for (int64_t j = j0 + tid; j < j1; j += kThreads) out[j] = -INFINITY;
    return;
  }
  const int64_t jv = j1 < eligible ? j1 : eligible;  // columns [j0, jv) are scored
  int64_t jg = j0 + warp * kKeys;
  PagedKeyTile<kKeys> tile;
  const bool words =
      KvKeyBytes(hd) % 4 == 0 && g.key_off % 4 == 0 && g.block_bytes % 4 == 0 && g.pool % 4 == 0;
  if (kPaged && words && jg < j1) tile.Fetch(g, table, n_table, jg, jv, hd, lane);
  const uint16_t* qt = q + t * heads * hd;
  if (hd % 8 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0) {
    // 8 dims per 16-byte load, every load of the thread in flight at once; lanes over heads, so
    // the transposed stores have 2-way bank conflicts.
    constexpr int kLoads = kMaxHeads * kMaxHeadDim / 8 / kThreads;
    uint4 u[kLoads];
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
      const int i = tid + r * kThreads, h = i % kMaxHeads, d0 = 8 * (i / kMaxHeads);
      u[r] = h < heads && d0 < hd ? *reinterpret_cast<const uint4*>(qt + h * hd + d0)
                                  : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
      const int i = tid + r * kThreads, h = i % kMaxHeads, d0 = 8 * (i / kMaxHeads);
      const uint32_t pair[4] = {u[r].x, u[r].y, u[r].z, u[r].w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        reinterpret_cast<float*>(&qs[d0 + e][h & 31])[h >> 5] =
            __uint_as_float(e % 2 ? pair[e / 2] & 0xffff0000u : pair[e / 2] << 16);
      }
    }
  } else {
    for (int i = tid; i < kMaxHeadDim * kMaxHeads; i += kThreads) {
      const int h = i / kMaxHeadDim, d = i % kMaxHeadDim;
      reinterpret_cast<float*>(&qs[d][h & 31])[h >> 5] =
          (h < heads && d < hd) ? Bf16ToF32(qt[h * hd + d]) : 0.0f;
    }
  }
  for (int h = tid; h < kMaxHeads; h += kThreads) {
    ws[h] = h < heads ? Bf16ToF32(w[t * heads + h]) : 0.0f;
  }
  __syncthreads();
  const uint16_t* kt =
      kPaged ? nullptr : keys + (key_row_offset != nullptr ? key_row_offset[t] : 0) * hd;
  for (; jg < j1; jg += kWarps * kKeys) {
    if constexpr (kPaged) {
      tile.Store(g, table, n_table, jg, jv, hd, lane, words, ks[warp]);
      if (words && jg + kWarps * kKeys < j1) {
        tile.Fetch(g, table, n_table, jg + kWarps * kKeys, jv, hd, lane);
      }
    } else {
      for (int i = lane; i < kKeys * hd; i += 32) {
        const int kk = i / hd, d = i % hd;
        PutKey(&ks[warp][kk][d], jg + kk < jv ? kt[(jg + kk) * hd + d] : uint16_t{0});
      }
    }
    __syncwarp();
    float acc[kKeys][2];
#pragma unroll
    for (int kk = 0; kk < kKeys; ++kk) acc[kk][0] = acc[kk][1] = 0.0f;
    const auto step = [&](const float2 qd, const float* kd) {
#pragma unroll
      for (int kk = 0; kk < kKeys; ++kk) {
        acc[kk][0] = __fadd_rn(acc[kk][0], __fmul_rn(qd.x, kd[kk]));
        acc[kk][1] = __fadd_rn(acc[kk][1], __fmul_rn(qd.y, kd[kk]));
      }
    };
    const int hd4 = hd & ~3;
    for (int d = 0; d < hd4; d += 4) {
      float kv[4][kKeys];
#pragma unroll
      for (int kk = 0; kk < kKeys; ++kk) {
        const float4 k4 = GetKeys4(&ks[warp][kk][d]);
        kv[0][kk] = k4.x;
        kv[1][kk] = k4.y;
        kv[2][kk] = k4.z;
        kv[3][kk] = k4.w;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) step(qs[d + e][lane], kv[e]);
    }
    for (int d = hd4; d < hd; ++d) {
      float kv[kKeys];
#pragma unroll
      for (int kk = 0; kk < kKeys; ++kk) kv[kk] = GetKey(&ks[warp][kk][d]);
      step(qs[d][lane], kv);
    }
#pragma unroll
    for (int kk = 0; kk < kKeys; ++kk) {
      float r[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float dot = RoundBf16Dev(acc[kk][hh]);
        const float relu = dot < 0.0f ? 0.0f : dot;  // std::max(dot, 0.0f)
        r[hh] = RoundBf16Dev(__fmul_rn(relu, ws[lane + 32 * hh]));
      }
      float s, e;
      TwoSum(r[0], r[1], s, e);
      for (int o = 16; o > 0; o >>= 1) {
        const float so = __shfl_xor_sync(0xffffffffu, s, o);
        const float eo = __shfl_xor_sync(0xffffffffu, e, o);
        float s2, err;
        TwoSum(s, so, s2, err);
        e = __fadd_rn(__fadd_rn(e, eo), err);
        s = s2;
      }
      const int64_t j = jg + kk;
      if (lane == 0 && j < j1) out[j] = j < jv ? RoundBf16Dev(__fadd_rn(s, e)) : -INFINITY;
    }
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
        cand[slot] = (static_cast<unsigned long long>(u) << 32) |
                     static_cast<unsigned long long>(0xffffffffu - static_cast<uint32_t>(i));
      }
    }
    tie_base += total;
    __syncthreads();  // warp_ties is rewritten by the next chunk
  }

  int P = 1;
  while (P < k) P <<= 1;
  for (int i = k + tid; i < P; i += kTopKThreads) cand[i] = 0ull;
  __syncthreads();
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      if (stride < 32) {
        // The remaining strides of this size within each warp, in registers.
        for (int base = 0; base < P; base += kTopKThreads) {
          const int i = base + tid;
          if (base + (tid & ~31) >= P) break;
          unsigned long long a = i < P ? cand[i] : 0ull;
          const bool descending = (i & size) == 0;
          for (int st = stride; st > 0; st >>= 1) {
            const unsigned long long b = __shfl_xor_sync(0xffffffffu, a, st);
            const bool lower = (lane & st) == 0;
            const unsigned long long hi = a > b ? a : b, lo = a > b ? b : a;
            a = lower == descending ? hi : lo;
          }
          if (i < P) cand[i] = a;
        }
        __syncthreads();
        break;
      }
      for (int i = tid; i < P; i += kTopKThreads) {
        const int jx = i ^ stride;
        if (jx > i) {
          const unsigned long long a = cand[i], b = cand[jx];
          const bool descending = (i & size) == 0;
          if (descending ? a < b : a > b) {
            cand[i] = b;
            cand[jx] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  const uint32_t masked = OrderKey(-INFINITY);
  int32_t* out = sel + static_cast<int64_t>(blockIdx.x) * k;
  for (int i = tid; i < k; i += kTopKThreads) {
    const unsigned long long key = cand[i];
    const uint32_t u = static_cast<uint32_t>(key >> 32);
    out[i] = u == masked
                 ? -1
                 : static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key & 0xffffffffull));
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

cudaError_t LaunchTopK(const float* scores, int64_t T, int64_t n_cols, int64_t k, bool counting,
                       int32_t* sel, cudaStream_t stream) {
  if (counting) {
    const int64_t n4 = (n_cols + 3) / 4;
    IndexerTopKRankKernelImpl<<<dim3(static_cast<unsigned>(T),
                                     static_cast<unsigned>((n_cols + 31) / 32)),
                                kRankThreads, static_cast<size_t>(16 * n4), stream>>>(
        scores, static_cast<int>(n_cols), static_cast<int>(k), sel);
    return cudaGetLastError();
  }
  const auto kernel = n_cols <= 4 * kTopKThreads    ? IndexerTopKKernelImpl<4>
                      : n_cols <= 32 * kTopKThreads ? IndexerTopKKernelImpl<32>
                                                    : IndexerTopKKernelImpl<0>;
  kernel<<<static_cast<unsigned>(T), kTopKThreads, 0, stream>>>(scores, n_cols, static_cast<int>(k),
                                                                sel);
  return cudaGetLastError();
}

bool IsPow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

using ScoresKernel = void (*)(const uint16_t*, const uint16_t*, const uint16_t*, const int64_t*,
                             const int64_t*, int, int, int, int64_t, float*, KvGeom,
                             const int32_t*, int);
struct ScoresGrid {
  ScoresKernel kernel;  // null: too many tiles for the grid
  dim3 grid;
};

// The smaller tiles while the larger ones would leave most SMs idle.
template <bool kPaged>
ScoresGrid ScoresGridFor(int64_t T, int64_t n_cols) {
  const auto tiles = [n_cols](int64_t keys) { return (n_cols + keys - 1) / keys; };
  const auto grid = [&](int64_t keys) {
    return dim3(static_cast<unsigned>(T), static_cast<unsigned>(tiles(keys)));
  };
  if (T * tiles(kTileKeys) > kSmallTileMaxBlocks) {
    if (tiles(kTileKeys) > 65535) return {nullptr, dim3()};
    return {&IndexerScoresKernelImpl<kPaged, kKeysPerWarp, kTileKeys>, grid(kTileKeys)};
  }
  if (T * tiles(kSmallTileKeys) > kSmallTileMaxBlocks) {
    return {&IndexerScoresKernelImpl<kPaged, kSmallKeysPerWarp, kSmallTileKeys>,
            grid(kSmallTileKeys)};
  }
  return {&IndexerScoresKernelImpl<kPaged, 1, kTinyTileKeys>, grid(kTinyTileKeys)};
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
      ratio < 1 || ratio > INT_MAX || n_cols < 0 || T < 0 || T > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (T == 0 || n_cols == 0) return cudaSuccess;
  const ScoresGrid sg = ScoresGridFor<false>(T, n_cols);
  if (sg.kernel == nullptr) return cudaErrorInvalidValue;
  sg.kernel<<<sg.grid, kThreads, 0, stream>>>(
      q, w, keys, key_row_offset, positions, static_cast<int>(heads), static_cast<int>(head_dim),
      static_cast<int>(ratio), n_cols, scores, KvGeom{}, nullptr, 0);
  return cudaGetLastError();
}

cudaError_t KvIndexerScores(const uint16_t* q, const uint16_t* w, const KvGeom& g,
                            const int32_t* table, int64_t n_table, const int64_t* positions,
                            int64_t T, int64_t heads, int64_t ratio, int64_t n_cols, float* scores,
                            cudaStream_t stream) {
  const int64_t head_dim = g.key_dim;
  if (heads < 1 || heads > kIndexerMaxHeads || head_dim < 32 || head_dim % 32 != 0 ||
      head_dim > kIndexerMaxHeadDim || g.keys_per_block < 1 || ratio < 1 || ratio > INT_MAX ||
      n_cols < 0 || T < 0 || T > INT_MAX || n_table < 0 || n_table > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (T == 0 || n_cols == 0) return cudaSuccess;
  const ScoresGrid sg = ScoresGridFor<true>(T, n_cols);
  if (sg.kernel == nullptr) return cudaErrorInvalidValue;
  sg.kernel<<<sg.grid, kThreads, 0, stream>>>(
      q, w, nullptr, nullptr, positions, static_cast<int>(heads), static_cast<int>(head_dim),
      static_cast<int>(ratio), n_cols, scores, g, table, static_cast<int>(n_table));
  return cudaGetLastError();
}

cudaError_t IndexerTopK(const float* scores, int64_t T, int64_t n_cols, int64_t k, int32_t* sel,
                        cudaStream_t stream) {
  const bool counting =
      n_cols >= 1 && n_cols <= kRankMaxCols && T <= kRankMaxPairs / (n_cols * n_cols);
  return IndexerTopKPath(scores, T, n_cols, k, counting, sel, stream);
}

cudaError_t IndexerTopKPath(const float* scores, int64_t T, int64_t n_cols, int64_t k,
                            bool counting, int32_t* sel, cudaStream_t stream) {
  if (k < 1 || k > kIndexerMaxTopK || k > n_cols || n_cols >= (int64_t{1} << 32) || T < 0 ||
      T > INT_MAX || (counting && n_cols > kRankMaxCols)) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  return LaunchTopK(scores, T, n_cols, k, counting, sel, stream);
}

const void* HadamardFp4Kernel() {
  return reinterpret_cast<const void*>(&HadamardFp4KernelImpl<double, 4>);
}
const void* IndexerWeightScaleKernel() {
  return reinterpret_cast<const void*>(&IndexerWeightScaleKernelImpl);
}
const void* KvIndexerScoresKernel() {
  return reinterpret_cast<const void*>(&IndexerScoresKernelImpl<true, kKeysPerWarp, kTileKeys>);
}
const void* IndexerScoresKernel() {
  return reinterpret_cast<const void*>(&IndexerScoresKernelImpl<false, kKeysPerWarp, kTileKeys>);
}
const void* IndexerTopKKernel() { return reinterpret_cast<const void*>(&IndexerTopKKernelImpl<4>); }
const void* IndexerTopKCountingKernel() {
  return reinterpret_cast<const void*>(&IndexerTopKRankKernelImpl);
}

}  // namespace ss::cuda
