// Manifold-constrained hyper-connections (spec §3.3), all fp32 math, per token.
//
// A token's residual state is `hc` streams of `dim` bf16 values, stored stream-major
// ([hc][dim]). HcPre collapses them into one sublayer input and yields the post/comb mixing
// weights; HcPost expands a sublayer output back into streams; HcHead is the final collapse.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/weights.h"

namespace ss::model {

struct HcSplit {
  std::vector<float> pre;   // [hc]
  std::vector<float> post;  // [hc]
  std::vector<float> comb;  // [hc*hc], comb[j*hc + k]: new stream k takes comb[j][k] of old j
};

// Mixing logits (24 for hc = 4): (X·fnᵀ)·rsqrt(mean(X²)+eps) over the flattened streams.
std::vector<float> HcMixes(const float* streams, int64_t hc, int64_t dim, const HcWeights& w,
                           float norm_eps);

// HcMixes of T tokens at once (streams [T, hc, dim], mixes [T, mix]): the same values, the
// weight decode shared by the batch.
void HcMixesRows(const float* streams, int64_t T, int64_t hc, int64_t dim, const HcWeights& w,
                 float norm_eps, float* mixes);

// Split and Sinkhorn projection of the mixing logits (spec §3.3.2).
HcSplit HcSplitSinkhorn(const std::vector<float>& mixes, const HcWeights& w, int64_t hc,
                        int64_t iters, float eps);

// y = bf16(Σ_s pre[s]·X_s), returning the split for the matching HcPost.
HcSplit HcPre(const float* streams, int64_t hc, int64_t dim, const HcWeights& w, int64_t iters,
              float hc_eps, float norm_eps, float* y);
// HcPre given the token's mixing logits (HcMixes / HcMixesRows).
HcSplit HcPreFromMixes(const float* streams, const std::vector<float>& mixes, int64_t hc,
                       int64_t dim, const HcWeights& w, int64_t iters, float hc_eps, float* y);

// out[k] = bf16(post[k]·x + Σ_j comb[j][k]·R[j]).
void HcPost(const float* x, const float* residual, const HcSplit& s, int64_t hc, int64_t dim,
            float* out);

// Head collapse: z = bf16(Σ_s (sigmoid(mix_s·scale + base_s) + eps)·X_s).
void HcHead(const float* streams, int64_t hc, int64_t dim, const HcWeights& w, float hc_eps,
            float norm_eps, float* z);

}  // namespace ss::model
