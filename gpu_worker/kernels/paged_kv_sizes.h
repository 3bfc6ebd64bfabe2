// The sizes of KvSparseAttention's caller-owned scratch (paged_kv.h), without CUDA: the memory
// plan and the cuda backend's workspace count them on hosts that build no CUDA code.
#pragma once

#include <cstdint>

namespace ss::cuda {

// Tokens a split-path slice takes: its workspace (KvSplitBytes) is ~2x a token's decoded rows per
// token at 64 heads, and 64-token slices launch 8x fewer kernels than 8-token ones at prefill
// (bench/RESULTS.md, session 30: an 8K chunk's attention 1.75 -> 1.44 s on the H200).
inline constexpr int64_t kKvSplitMaxTokens = 64;
inline constexpr int64_t kKvSplitChunk = 64;  // kSparseChunk, the candidates of a split block
// Per (token, head, chunk): the p·V partial (head_dim fp32), the chunk's max and its p sum.
inline constexpr int64_t KvSplitBytes(int64_t T, int64_t n_heads, int64_t n_cand,
                                      int64_t head_dim) {
  return T * n_heads * ((n_cand + kKvSplitChunk - 1) / kKvSplitChunk) * (head_dim + 2) * 4;
}
inline constexpr int64_t KvSparseAttentionRowsBytes(int64_t T, int64_t n_cand, int64_t head_dim,
                                                    int64_t n_heads) {
  return T * n_cand * head_dim * 2 +
         KvSplitBytes(T < kKvSplitMaxTokens ? T : kKvSplitMaxTokens, n_heads, n_cand, head_dim);
}

}  // namespace ss::cuda
