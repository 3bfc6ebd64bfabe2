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
#include "gpu_worker/kernels/types.h"

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
// E ≤ kRouterMaxExperts, k ≤ min(E, kRouterMaxTopK).
struct RouteParams {
  const bf16_t* x = nullptr;           // [T, dim]
  const bf16_t* gate = nullptr;        // [E, dim]
  const float* bias = nullptr;         // fp32 [E] (learned layers)
  const int32_t* tid2eid = nullptr;    // hash layers: int32 [vocab, k]; null: a learned layer
  const int64_t* token_ids = nullptr;  // int64 [T] (read only for hash layers)
  int64_t T = 0;
  int64_t E = 0;
  int64_t dim = 0;
  int64_t k = 0;
  float route_scale = 0.0f;
  float* logits = nullptr;     // caller-owned workspace fp32 [T, E] (holds the logits afterwards)
  int32_t* indices = nullptr;  // int32 [T, k]
  float* weights = nullptr;    // fp32 [T, k]
};
cudaError_t Route(const RouteParams& p, cudaStream_t stream);

// SwiGLU with the demo's clamp (moe.cc SwiGlu), elementwise over [rows, n]:

const void* RouterLogitsKernel();
const void* RouterLogitsRowKernel();  // Route's logits up to 8 tokens
const void* RouterSelectKernel();

}  // namespace ss::cuda
