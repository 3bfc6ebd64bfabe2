// Lightning indexer (spec §3.8); mirrors common/model/indexer.cc (IndexerSelect) and
// common/codecs.cc (HadamardInplace, Fp4SimInplace).
#include <climits>

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

__global__ void __launch_bounds__(kThreads)
    HadamardFp4KernelImpl(uint16_t* __restrict__ x, int64_t rows, int n, bool fp64, float scale) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  uint16_t* xr = x + row * n;
  const int per = n / 32;
  float v[kHadamardMaxPerLane];
#pragma unroll
  for (int k = 0; k < kHadamardMaxPerLane; ++k)
    v[k] = k < per ? Bf16ToF32(xr[lane + 32 * k]) : 0.0f;
  if (fp64) {
    WarpHadamardFp4<double>(v, per, scale);
  } else {
    WarpHadamardFp4<float>(v, per, scale);
  }
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
// shared memory as fp32 qs[d][h] (heads padded to 64 with zeros), so lane l reads heads l and
// l + 32 of one dim without bank conflicts (and the padded row fills without them). Each warp
// scores kKeys keys at a time (staged as bf16 in shared memory, read by broadcast): per key and
// head a sequential fp32 dot over d, bf16, relu, × w, bf16, then the TwoSum warp reduction over
// heads. A key's score does not depend on kKeys or kTile: few tokens (decode) take small tiles of
// 2 keys per warp, so that the keys spread over 4× as many blocks.
constexpr int kMaxHeads = static_cast<int>(kIndexerMaxHeads);
constexpr int kMaxHeadDim = static_cast<int>(kIndexerMaxHeadDim);
constexpr int kKeysPerWarp = 4;
constexpr int kTileKeys = 64;
constexpr int kSmallKeysPerWarp = 2;
constexpr int kSmallTileKeys = kWarps * kSmallKeysPerWarp;
// Blocks (T · tiles of kTileKeys) below which the small tiles are used.
constexpr int64_t kSmallTileMaxBlocks = 256;

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
  const int64_t b = g.first_entry_block + j / g.keys_per_block;
  if (b < 0 || b >= n_table) return nullptr;
  return reinterpret_cast<const uint8_t*>(g.pool) + static_cast<int64_t>(table[b]) * g.block_bytes +
         g.key_off + (j % g.keys_per_block) * KvKeyBytes(g.key_dim);
}

// A warp's kKeys keys [jg, jg + kKeys) staged as bf16 straight from their MXFP4 entries
// (KvGatherKeys' values: e2m1 · ue8m0 scale, exact in bf16; 0 at or past jv and outside the
// table). 32 / kKeys lanes per key; with whole aligned words (hd a multiple of 8 · 32 / kKeys,
// 4-byte aligned keys) each lane reads its 8-dim groups as one word of codes.
template <int kKeys>
__device__ __forceinline__ void StagePagedKeys(const KvGeom& g, const int32_t* __restrict__ table,
                                               int n_table, int64_t jg, int64_t jv, int hd,
                                               int lane, uint16_t (*ks)[kMaxHeadDim]) {
  constexpr int kLanesPerKey = 32 / kKeys;
  const int kk = lane / kLanesPerKey, sub = lane % kLanesPerKey;
  const int64_t j = jg + kk;
  const uint8_t* k = j < jv ? PagedKey(g, table, n_table, j) : nullptr;
  const bool words = hd % (8 * kLanesPerKey) == 0 && KvKeyBytes(hd) % 4 == 0 &&
                     g.key_off % 4 == 0 && g.block_bytes % 4 == 0 && g.pool % 4 == 0;
  if (words) {
    const int per = hd / kLanesPerKey;
    for (int d0 = sub * per; d0 < (sub + 1) * per; d0 += 8) {
      uint32_t codes = 0;
      float sc = 0.0f;
      if (k != nullptr) {
        codes = *reinterpret_cast<const uint32_t*>(k + d0 / 2);
        sc = Ue8m0ToF32(k[hd / 2 + d0 / 32]);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float v = E2m1Value((codes >> (4 * e)) & 15);
        ks[kk][d0 + e] = k != nullptr ? F32ToBf16(__fmul_rn(v, sc)) : uint16_t{0};
      }
    }
    return;
  }
  for (int d = sub; d < hd; d += kLanesPerKey) {
    uint16_t v = 0;
    if (k != nullptr) {
      const uint32_t byte = k[d / 2];
      v = F32ToBf16(
          __fmul_rn(E2m1Value((d & 1) ? byte >> 4 : byte & 15), Ue8m0ToF32(k[hd / 2 + d / 32])));
    }
    ks[kk][d] = v;
  }
}

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
  __shared__ float qs[kMaxHeadDim][kMaxHeads + 1];  // +1: conflict-free transposed fill
  __shared__ float ws[kMaxHeads];
  __shared__ uint16_t ks[kWarps][kKeys][kMaxHeadDim];
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
  for (int i = tid; i < kMaxHeadDim * kMaxHeads; i += kThreads) {
    const int h = i / kMaxHeadDim, d = i % kMaxHeadDim;
    qs[d][h] = (h < heads && d < hd) ? Bf16ToF32(q[(t * heads + h) * hd + d]) : 0.0f;
  }
  for (int h = tid; h < kMaxHeads; h += kThreads) {
    ws[h] = h < heads ? Bf16ToF32(w[t * heads + h]) : 0.0f;
  }
  __syncthreads();
  const uint16_t* kt =
      kPaged ? nullptr : keys + (key_row_offset != nullptr ? key_row_offset[t] : 0) * hd;
  for (int64_t jg = j0 + warp * kKeys; jg < j1; jg += kWarps * kKeys) {
    if constexpr (kPaged) {
      StagePagedKeys<kKeys>(g, table, n_table, jg, jv, hd, lane, ks[warp]);
    } else {
      for (int i = lane; i < kKeys * hd; i += 32) {
        const int kk = i / hd, d = i % hd;
        ks[warp][kk][d] = jg + kk < jv ? kt[(jg + kk) * hd + d] : uint16_t{0};
      }
    }
    __syncwarp();
    float acc[kKeys][2];
#pragma unroll
    for (int kk = 0; kk < kKeys; ++kk) acc[kk][0] = acc[kk][1] = 0.0f;
    for (int d = 0; d < hd; ++d) {
      const float q0 = qs[d][lane], q1 = qs[d][lane + 32];
#pragma unroll
      for (int kk = 0; kk < kKeys; ++kk) {
        const float kv = Bf16ToF32(ks[warp][kk][d]);
        acc[kk][0] = __fadd_rn(acc[kk][0], __fmul_rn(q0, kv));
        acc[kk][1] = __fadd_rn(acc[kk][1], __fmul_rn(q1, kv));
      }
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

bool IsPow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

using ScoresKernel = void (*)(const uint16_t*, const uint16_t*, const uint16_t*, const int64_t*,
                             const int64_t*, int, int, int, int64_t, float*, KvGeom,
                             const int32_t*, int);
struct ScoresGrid {
  ScoresKernel kernel;  // null: too many tiles for the grid
  dim3 grid;
};

// The small tiles while the large ones would leave most SMs idle.
template <bool kPaged>
ScoresGrid ScoresGridFor(int64_t T, int64_t n_cols) {
  const int64_t tiles = (n_cols + kTileKeys - 1) / kTileKeys;
  if (T * tiles <= kSmallTileMaxBlocks) {
    const int64_t small = (n_cols + kSmallTileKeys - 1) / kSmallTileKeys;
    return {&IndexerScoresKernelImpl<kPaged, kSmallKeysPerWarp, kSmallTileKeys>,
            dim3(static_cast<unsigned>(T), static_cast<unsigned>(small))};
  }
  if (tiles > 65535) return {nullptr, dim3()};
  return {&IndexerScoresKernelImpl<kPaged, kKeysPerWarp, kTileKeys>,
          dim3(static_cast<unsigned>(T), static_cast<unsigned>(tiles))};
}

}  // namespace

cudaError_t HadamardFp4SimInplace(uint16_t* x, int64_t rows, int64_t n, bool fp64,
                                  cudaStream_t stream) {
  if (!IsPow2(n) || n < 32 || n > kHadamardMaxDim) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const float scale = static_cast<float>(1.0 / sqrt(static_cast<double>(n)));
  const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  HadamardFp4KernelImpl<<<blocks, kThreads, 0, stream>>>(x, rows, static_cast<int>(n), fp64, scale);
  return cudaGetLastError();
}

cudaError_t IndexerPrepQ(uint16_t* q, int64_t T, int64_t heads, int64_t head_dim, int64_t rope_dim,
                         const float* cos_t, const float* sin_t, bool hadamard_fp64,
                         cudaStream_t stream) {
  if (heads < 1 || !IsPow2(head_dim) || head_dim < 32 || head_dim > kHadamardMaxDim ||
      rope_dim < 2 || rope_dim % 2 != 0 || rope_dim > head_dim) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  const cudaError_t e = ApplyRope(q, T, heads, head_dim, rope_dim, cos_t, sin_t, false, stream);
  if (e != cudaSuccess) return e;
  return HadamardFp4SimInplace(q, T * heads, head_dim, hadamard_fp64, stream);
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
  if (k < 1 || k > kIndexerMaxTopK || k > n_cols || n_cols >= (int64_t{1} << 32) || T < 0 ||
      T > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  const auto kernel = n_cols <= 4 * kTopKThreads    ? IndexerTopKKernelImpl<4>
                      : n_cols <= 32 * kTopKThreads ? IndexerTopKKernelImpl<32>
                                                    : IndexerTopKKernelImpl<0>;
  kernel<<<static_cast<unsigned>(T), kTopKThreads, 0, stream>>>(
      scores, n_cols, static_cast<int>(k), sel);
  return cudaGetLastError();
}

const void* HadamardFp4Kernel() { return reinterpret_cast<const void*>(&HadamardFp4KernelImpl); }
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

}  // namespace ss::cuda
