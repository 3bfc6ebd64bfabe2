// The indexer's top-k (spec §3.8): the k largest scores of each row, as IndexerSelect orders
// them (descending, ties to the lower column); mirrors common/model/indexer.cc. The scores and
// the query preparation are in indexer.cu.
#include <algorithm>
#include <climits>
#include <cub/block/block_scan.cuh>

#include "gpu_worker/kernels/indexer_topk.h"
#include "gpu_worker/kernels/last_block.cuh"
#include "gpu_worker/kernels/limits.h"

namespace ss::cuda {
namespace {

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
      if (in && lane == __ffs(peers) - 1)
        atomicAdd(&hist[bin], static_cast<unsigned>(__popc(peers)));
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

// f(key, column) for each column of the thread's share of a row read from memory by a block of
// kBlockThreads threads: 16-byte loads, four of them in flight per thread.
template <int kBlockThreads = kFilterThreads, typename F>
__device__ __forceinline__ void ForEachRowKey(const float* __restrict__ row, int64_t n, F&& f) {
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t align = ((16u - (reinterpret_cast<uintptr_t>(row) & 15u)) & 15u) >> 2;
  const int64_t head = align < n ? align : n;
  if (tid < head) f(OrderKey(row[tid]), static_cast<int64_t>(tid));
  const float4* body = reinterpret_cast<const float4*>(row + head);
  const int64_t n4 = (n - head) >> 2;
  int64_t q = tid;
  for (; q + 3 * kBlockThreads < n4; q += 4 * kBlockThreads) {
    float4 v[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) v[r] = body[q + r * kBlockThreads];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t i = head + 4 * (q + r * kBlockThreads);
      f(OrderKey(v[r].x), i);
      f(OrderKey(v[r].y), i + 1);
      f(OrderKey(v[r].z), i + 2);
      f(OrderKey(v[r].w), i + 3);
    }
  }
  for (; q < n4; q += kBlockThreads) {
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

// Split top-k for a few long rows (decode): the filtered kernel's first histograms and its
// candidates spread over many blocks, the final order by counting. Three launches, each over the
// whole row at once (one SM per row pays the filtered kernel's ~50 barriers and its serial sort):
//  1. blocks of kSplitCols columns add their 11-bit histogram of the key's top bits into the
//     row's histogram (global atomics of the non-empty bins);
//  2. the same blocks each find the bin of the k-th largest from that histogram and append
//     their entries at or above it (or above the −inf bin: fewer than k finite scores) to the
//     row's candidate list as selection keys. Where that bin holds more than kFilterCap entries
//     with those above (scores close together: bf16 scores put 32 values in a bin), they append
//     the entries above the bin only and add the next 11 key bits of the bin's entries to the
//     row's second histogram; the row's last block (LastBlockFinishes) finds the k-th largest's
//     bin there and, if the two bins leave at most kFilterCap candidates, appends the first
//     bin's entries at or above the second (two passes over the row: count, then write);
//  3. blocks of kSplitRankCands candidates count, for each, the candidates above it: that count
//     is its output position (the keys are distinct). More than kFilterCap candidates even after
//     the second histogram (thousands of scores equal in 22 key bits) and block 0 of the row
//     runs the filtered kernel's code.
// The rows' histograms, candidate lists and counters are the caller's scratch of kSplitMaxRows
// rows (IndexerTopKScratchBytes, zeroed once when allocated), left zeroed for the next call (the
// histogram by launch 3, the second histogram and the block counter by launch 2's last block,
// the candidate counter by launch 1): calls sharing one scratch must not overlap (one stream,
// or ordered by events), as one backend's decode steps are.
constexpr int kSplitMaxRows = 8;
constexpr int kSplitThreads = 256;
constexpr int kSplitCols = 2048;  // 8 per thread
constexpr int kSplitRankCands = 64;
constexpr int64_t kSplitMinCols = 4096;

using SplitScan = cub::BlockScan<unsigned, kSplitThreads>;

struct SplitRow {
  unsigned hist[kFilterBins];   // launch 1 adds, 2 reads, 3 zeroes
  unsigned hist2[kFilterBins];  // launch 2 adds, its last block reads and zeroes
  unsigned n_cand;              // launch 1 zeroes, 2 counts, 3 reads
  unsigned n_sel;               // launch 2: k, or the finite scores when fewer
  unsigned overflow;            // launch 2: more than kFilterCap candidates
  uint32_t blocks_done;         // launch 2's LastBlockFinishes counter
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
  // A block's candidates are gathered here (a global atomic per warp and step would serialise
  // the block on their latency), then appended to the row's with one.
  __shared__ unsigned long long staged[kFilterCap];
  __shared__ unsigned n_staged, staged_base;
  __shared__ SplitScan::TempStorage scan;
  SplitRow& r = rows[blockIdx.x];
  const auto append = [&] {
    __syncthreads();
    if (threadIdx.x == 0) staged_base = atomicAdd(&r.n_cand, n_staged);
    __syncthreads();
    for (unsigned i = threadIdx.x; i < n_staged; i += kSplitThreads) {
      r.cand[staged_base + i] = staged[i];
    }
  };
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
  const bool wide = !masked && p.above + p.count > kFilterCap;  // the second histogram's case
  if (blockIdx.y == 0 && tid == 0) {
    r.n_sel = masked ? p.above : static_cast<unsigned>(k);
    if (!wide) r.overflow = 0;
  }
  if (wide) {
    for (int b = tid; b < kFilterBins; b += kSplitThreads) hist[b] = 0;
  }
  if (tid == 0) n_staged = 0;
  __syncthreads();
#pragma unroll
  for (int e = 0; e < kSplitCols / kSplitThreads; ++e) {
    const int64_t i = j0 + e * kSplitThreads + tid;
    const uint32_t u = OrderKey(v[e]), d = u >> 21;
    const bool in = i < n_cols && (masked || wide ? d > p.digit : d >= p.digit);
    const unsigned slot = AggregatedSlot(&n_staged, in);
    if (in) staged[slot] = SelKey(u, i);
    if (wide && i < n_cols && d == p.digit) atomicAdd(&hist[(u >> 10) & (kFilterBins - 1)], 1u);
  }
  append();
  if (!wide) return;
  for (int b = tid; b < kFilterBins; b += kSplitThreads) {
    if (hist[b] != 0) atomicAdd(&r.hist2[b], hist[b]);
  }
  LastBlockFinishes(&r.blocks_done, 0, gridDim.y, [&] {
    for (int b = tid; b < kFilterBins; b += kSplitThreads) {
      hist[b] = __ldcg(&r.hist2[b]);
      r.hist2[b] = 0;
    }
    __syncthreads();
    const unsigned need = static_cast<unsigned>(k) - p.above;
    const DigitPick p2 = PickDigit<kSplitThreads>(hist, kFilterBins, need, warp_sums, &pick);
    const bool fits = p.above + p2.above + p2.count <= kFilterCap;
    if (tid == 0) r.overflow = fits ? 0u : 1u;
    if (!fits) return;
    // Two passes over the row, no atomics between them: each thread counts its entries, a block
    // scan gives it its first slot in the row's list, and it writes them there in the same order.
    // (A slot per warp and step from a shared counter serialised the block on its latency.)
    const uint32_t prefix = (p.digit << 11) | p2.digit;
    const auto in = [&](uint32_t u) { return (u >> 21) == p.digit && (u >> 10) >= prefix; };
    unsigned mine = 0;
    ForEachRowKey<kSplitThreads>(row, n_cols, [&](uint32_t u, int64_t) { mine += in(u); });
    unsigned at = 0, total = 0;
    SplitScan(scan).ExclusiveSum(mine, at, total);
    if (tid == 0) staged_base = atomicAdd(&r.n_cand, total);
    __syncthreads();
    at += staged_base;
    ForEachRowKey<kSplitThreads>(row, n_cols, [&](uint32_t u, int64_t i) {
      if (in(u)) r.cand[at++] = SelKey(u, i);
    });
  });
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

}  // namespace

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
