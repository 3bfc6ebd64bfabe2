// Mixture of experts (spec §3.11): fp32 sqrt-softplus router (hash layers read the checkpoint's
// token -> expert table; learned layers pick the top-k of the biased scores), routed SwiGLU
// experts on MXFP4 weights with the clamp, the FP8 shared expert, fp32 combination.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
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

// An expert id that stands for no expert: the choice is skipped (an expert computed elsewhere,
// e.g. resident on the GPU, or another TP rank's). RoutedSum, RoutedExperts and the expert
// workers' calls take it; the row's other choices are summed as if it were absent.
inline constexpr int32_t kSkippedExpert = -1;

// Bytes of one routed expert's MXFP4 weights, all of w1, w3 [inter, dim] and w2 [dim, inter]:
// e2m1 codes (half a byte) and one ue8m0 scale per 32 values, 3·dim·inter·17/32.
inline int64_t Mxfp4ExpertBytes(const ModelConfig& c) {
  return 3 * c.dim * c.moe_inter_dim / 32 * 17;
}

// The routed half of the MoE sublayer for the routing `r`: acc [T, dim] (fp32, overwritten) =
// Σ over each row's chosen experts, in ascending expert id, of that expert's bf16 output
// (kSkippedExpert choices, and any id matching no expert, add nothing).
void RoutedSum(const MoeWeights& w, const ModelConfig& c, const float* x, const RouterResult& r,
               int64_t T, float* acc);

// Where a MoE layer's routed experts are computed when not locally (an expert-worker client,
// gpu_worker/routed_experts_client.h). Compute writes out [T, dim] (fp32, overwritten) = exactly
// what RoutedSum writes for the same inputs, or its slices' partial sums added in slice order
// (which equals it up to fp32 summation order):
//   layer    block id (n_layers + k for MTP block k)
//   x        [T, dim] the MoE input, every value bf16-representable
//   ids      [T, top_k] expert ids in the router's order (kSkippedExpert: none); weights
//            [T, top_k] with route_scale
// An error (a dead worker, a deadline) fails the block; the caller's state is then not valid.
// Thread-safety: implementations must allow concurrent calls from several threads.
class RoutedExperts {
 public:
  virtual ~RoutedExperts() = default;
  virtual absl::Status Compute(int64_t layer, int64_t T, const float* x, const int32_t* ids,
                               const float* weights, int top_k, float* out) const = 0;
};

// The routed half of block `layer` by `experts` (null: RoutedSum, which cannot fail) into acc
// [T, dim]; an error from `experts` is returned as is.
absl::Status MoeRouted(const MoeWeights& w, const ModelConfig& c, int64_t layer, const float* x,
                       const RouterResult& r, int64_t T, const RoutedExperts* experts, float* acc);
// The sublayer's output from its halves: y[i] = bf16(acc[i] + shared[i]) for n values.
void MoeCombine(const float* acc, const float* shared, int64_t n, float* y);

// Wall seconds of one MoE sublayer's parts (accumulated: += ).
struct MoeTimings {
  double router_shared = 0.0;  // router, shared expert and the combination (the GPU side)
  double routed = 0.0;         // the routed experts (RoutedSum or RoutedExperts::Compute)
};

// Full MoE sublayer: y = bf16(Σ routed (ascending expert id) + shared). x: [T, dim].
// `router` (optional) receives the routing decisions.
void MoeForward(const MoeWeights& w, const ModelConfig& c, bool shared_expert_clamp, const float* x,
                const int64_t* token_ids, int64_t T, float* y, RouterResult* router);

// The same with the routed experts of block `layer` computed by `experts` (null: RoutedSum).
// With a provider that returns RoutedSum's values, y is bit-identical to MoeForward's. On error
// y is untouched.
absl::Status MoeForward(const MoeWeights& w, const ModelConfig& c, bool shared_expert_clamp,
                        int64_t layer, const float* x, const int64_t* token_ids, int64_t T,
                        const RoutedExperts* experts, float* y, RouterResult* router,
                        MoeTimings* timings);

}  // namespace ss::model
