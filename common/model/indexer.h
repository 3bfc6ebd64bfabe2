// Lightning indexer of CSA layers (spec §3.8): scores every completed compressed block for each
// query and selects the top-k, causally (blocks completing after the query are never chosen).
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/weights.h"
#include "common/model_config.h"

namespace ss::model {

struct IndexerResult {
  int64_t k = 0;              // entries per query (min(index_topk, n_blocks))
  std::vector<int32_t> sel;   // [S, k] block ids in top-k order, -1 = none
  int64_t n_blocks = 0;       // blocks scored per query (end_pos / ratio)
  std::vector<float> scores;  // [S, n_blocks] bf16 scores, -inf where not yet complete
};

// x: [S, dim] attention inputs, qr: [S, q_lora_rank] low-rank queries of the tokens at
// positions start..start+S-1; keys: the layer's indexer keys (at least end_pos/ratio blocks).
// `q_proj` / `w_proj` (optional, both or neither): IndexerProject's rows computed beforehand
// (e.g. for many sequences at once); x and qr are then not read.
IndexerResult IndexerSelect(const IndexerWeights& w, const ModelConfig& c,
                            const std::vector<float>& rope_freqs, const float* x, const float* qr,
                            int64_t S, int64_t start, const std::vector<float>& keys,
                            const float* q_proj = nullptr, const float* w_proj = nullptr);
// The per-row projections IndexerSelect starts with: q = qr·wq_bᵀ [S, n_heads·head_dim] (FP8
// linear), w = bf16(x·weights_projᵀ) [S, n_heads].
void IndexerProject(const IndexerWeights& w, const float* x, const float* qr, int64_t S, float* q,
                    float* wts);

}  // namespace ss::model
