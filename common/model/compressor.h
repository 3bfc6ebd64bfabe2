// KV compressor (spec §3.7): gated per-channel softmax pooling of `ratio` tokens (ratio 4:
// overlapping, mixing the previous block's A half with the current block's B half), then
// RMSNorm, RoPE at the block's first position and the FP8 (main) or Hadamard + FP4 (indexer)
// simulation. Runs token by token on the streaming state, so prefill, chunked prefill and decode
// share one code path.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/state.h"
#include "common/model/weights.h"

namespace ss::model {

enum class CompressorKind { kMain, kIndexer };

struct CompressorParams {
  CompressorKind kind = CompressorKind::kMain;
  int64_t rope_head_dim = 0;
  float norm_eps = 1e-6f;
  bool kv_fp8_sim_rounds = true;  // current revision: real e4m3 rounding in FP8sim
  const std::vector<float>* rope_freqs = nullptr;
};

// Feeds the tokens at positions start..start+n-1 (x: [n, dim] bf16 attention inputs) and appends
// each completed block's entry (head_dim values) to `entries`. `kv_proj` / `score_proj`
// (optional, both or neither): the rows' projections x·wkvᵀ and x·wgateᵀ [n, coff·d] computed
// beforehand (CompressorProject, e.g. for many sequences at once); x is then not read.
void CompressorFeed(const CompressorWeights& w, const CompressorParams& p, CompressorState& st,
                    const float* x, int64_t n, int64_t dim, int64_t start,
                    std::vector<float>& entries, const float* kv_proj = nullptr,
                    const float* score_proj = nullptr);
// The per-row projections CompressorFeed starts with: kv, score [n, coff·d].
void CompressorProject(const CompressorWeights& w, const float* x, int64_t n, float* kv,
                       float* score);

}  // namespace ss::model
