// Mixture of experts (spec §3.11): fp32 sqrt-softplus router (hash layers read the checkpoint's
// token -> expert table; learned layers pick the top-k of the biased scores), routed SwiGLU
// experts on MXFP4 weights with the clamp, the FP8 shared expert, fp32 combination.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/weights.h"
#include "common/model_config.h"

namespace ss::model {

struct RouterResult {
  std::vector<int32_t> indices;  // [T, k] in the gate's order (hash: table row; learned: top-k)
  std::vector<float> weights;    // [T, k] renormalised unbiased scores x route_scale
};

RouterResult Route(const MoeWeights& w, const ModelConfig& c, const float* x,
                   const int64_t* token_ids, int64_t T);

// SwiGLU with the demo's clamp (gate ≤ limit, up within ±limit; limit 0 = none), silu(g)·u,
// times the routing weight when `weighted`, in fp32; a[i] = bf16 of that (the input of w2).
void SwiGlu(const float* gate, const float* up, int64_t n, float limit, float weight, bool weighted,
            float* a);

// One routed expert on rows x [n, dim] with per-row routing weights: y = bf16 [n, dim].
// `limit` 0 disables the clamp.
void RoutedExpert(const ExpertWeights& e, const float* x, const float* row_weights, int64_t n,
                  float limit, float* y);
// The shared expert (FP8 weights, routing weight 1).
void SharedExpert(const MoeWeights& w, const float* x, int64_t n, float limit, float* y);

// Full MoE sublayer: y = bf16(Σ routed (ascending expert id) + shared). x: [T, dim].
// `router` (optional) receives the routing decisions.
void MoeForward(const MoeWeights& w, const ModelConfig& c, bool shared_expert_clamp, const float* x,
                const int64_t* token_ids, int64_t T, float* y, RouterResult* router);

}  // namespace ss::model
