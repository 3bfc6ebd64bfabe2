// The MoE router (spec §3.11, model::Route): gate logits, scores, and each token's experts and
// weights. Contract: README.md.
//
// Numerics: the logits' dot products, exact double sums in the reference, are fp32 warp sums
// here; exp and log1p of the scores are evaluated in double on the fp32 argument and rounded once
// to fp32 (as close as a GPU gets to glibc's float functions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/limits.h"

namespace ss::cuda {

// The router (model::Route): logits = fp32(x)·fp32(gate)ᵀ (fp32 sums, lane l of a warp adding
// i ≡ l (mod 32) in order, then a butterfly; up to 8 tokens one block per (token, expert) forms
// the products at once and one warp adds them, the same bits), s = sqrt(softplus(logits)) with
// softplus(z) = z for z > 20 else log1p(exp(z)), then per token (one warp):
//  * hash layers (tid2eid != nullptr): indices = tid2eid[token_ids[t]] (int32 [vocab, k]); the
//    ids must lie in [0, E) (checked at load time);
//  * learned layers (tid2eid == nullptr): the top-k of s + bias (fp32 [E]) in descending order,
//    equal values ordered by the lower expert index (the reference's stable sort);
//  * weights[t][i] = s[idx_i] / (Σ_i s[idx_i], summed in i order) · route_scale.
// x: bf16 [T, dim]; gate: bf16 [E, dim]; token_ids: int64 [T] (read only for hash layers);
// logits: caller-owned fp32 workspace [T, E] (holds the logits afterwards); indices: int32 [T, k];
// weights: fp32 [T, k]. E ≤ kRouterMaxExperts, k ≤ min(E, kRouterMaxTopK).
cudaError_t Route(const uint16_t* x, const uint16_t* gate, const float* bias,
                  const int32_t* tid2eid, const int64_t* token_ids, int64_t T, int64_t E,
                  int64_t dim, int64_t k, float route_scale, float* logits, int32_t* indices,
                  float* weights, cudaStream_t stream);

// SwiGLU with the demo's clamp (moe.cc SwiGlu), elementwise over [rows, n]:

const void* RouterLogitsKernel();
const void* RouterLogitsRowKernel();  // Route's logits up to 8 tokens
const void* RouterSelectKernel();

}  // namespace ss::cuda
