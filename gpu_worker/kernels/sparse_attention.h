// Sparse attention with a sink (spec §3.9) over an explicit candidate list per query, as the
// reference kernel runs it: fp32 scores of bf16 q·k times the softmax scale, online softmax over
// 64-entry chunks of the list, probabilities rounded to bf16 before P·V (fp32 accumulation), the
// sink exp(s_h − m) only in the denominator, masked entries (index −1) skipped, bf16 output.
//
// K = V = one latent entry of `head_dim` bf16 values shared by every head (MQA), so the entries
// live in one pool and each query lists the pool rows it may see: window entries first, then
// compressed entries, in the reference's order (common/model/attention.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::cuda {

// q: bf16 [T, n_heads, head_dim]; pool: bf16 [n_entries, head_dim]; cand: int32 [T, n_cand]
// (−1 = masked; the first entry of every list must be valid, as the window always holds the
// query's own position); sink: fp32 [n_heads]; out: bf16 [T, n_heads, head_dim].
// head_dim must be a multiple of 128 and at most 1024 (cudaErrorInvalidValue otherwise).
cudaError_t SparseAttention(const uint16_t* q, const uint16_t* pool, const int32_t* cand,
                            const float* sink, int64_t T, int64_t n_heads, int64_t head_dim,
                            int64_t n_cand, float scale, uint16_t* out, cudaStream_t stream);

const void* SparseAttentionKernel();

}  // namespace ss::cuda
