// The sizes of KvSparseAttention's caller-owned scratch (paged_kv.h), without CUDA: the memory
// plan and the cuda backend's workspace count them on hosts that build no CUDA code.
#pragma once

#include <cstdint>

namespace ss::cuda {

// Tokens a split-path slice takes: a prefill chunk launches two kernels per slice, and the slice's
// workspace (KvSplitBytes) is ~2x its tokens' decoded rows at 64 heads.
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
