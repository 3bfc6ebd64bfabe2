// Attention of one block (spec §3.4–§3.10): low-rank query with per-head RMS normalisation,
// a single shared latent KV (K = V) FP8-simulated on its nope dims, sliding window, compressed
// entries (HCA: all completed blocks; CSA: the indexer's top-k), sparse attention with a sink,
// and the grouped low-rank output projection.
//
// The candidate list of a query follows the demo's index layout exactly (window entries in
// position order, padded with -1 to min(S, window) in a prefill from position 0 and to `window`
// otherwise, then compressed entries), because the online softmax runs over 64-entry chunks of
// that list and its rounding depends on the chunking.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/indexer.h"
#include "common/model/state.h"
#include "common/model/weights.h"
#include "common/model_config.h"

namespace ss::model {

struct AttentionParams {
  const ModelConfig* config = nullptr;
  const std::vector<float>* rope_freqs = nullptr;  // the layer's table (ratio-dependent)
  bool kv_fp8_sim_rounds = true;
};

// What a block test may want to look at; every member is optional.
struct AttentionTrace {
  IndexerResult* indexer = nullptr;
};

// Attention over the tokens at positions start..start+S-1 of one sequence. x: [S, dim] normed
// inputs, out: [S, dim] bf16. Appends the chunk's raw KV to the window ring and its completed
// blocks to the compressed caches of `st`. = AttentionProject + AttentionCore + AttentionOutput.
void AttentionForward(const AttentionWeights& w, const AttentionParams& p, LayerState& st,
                      const float* x, int64_t S, int64_t start, float* out, AttentionTrace* trace);

// The three phases of AttentionForward, so a batch of several sequences runs its per-row work
// (every projection) once for all rows; each row's result depends only on that row and its
// position, so a row is bit-identical alone or in any batch.
struct AttentionRows {
  std::vector<float> qr;  // [T, q_lora_rank] normed low-rank query (the indexer's input)
  std::vector<float> q;   // [T, n_heads, head_dim] normed, rotated queries
  std::vector<float> kv;  // [T, head_dim] normed, rotated, FP8-simulated raw KV
  // The stateful parts' per-row projections (empty when the layer has no such part):
  std::vector<float> comp_kv, comp_score;    // [T, coff·head_dim] main compressor
  std::vector<float> icomp_kv, icomp_score;  // [T, coff·index_head_dim] indexer's compressor
  std::vector<float> idx_q, idx_w;           // [T, index heads·index_head_dim], [T, index heads]
};
// Query and KV paths of T rows; positions[t] is row t's position.
void AttentionProject(const AttentionWeights& w, const AttentionParams& p, const float* x,
                      const int64_t* positions, int64_t T, AttentionRows* rows);
// One sequence's chunk: rows [row0, row0 + S) of `rows` at positions start..start+S-1, x its
// [S, dim] inputs. Feeds the compressors, selects (indexer), attends; o_out [S, n_heads,
// head_dim] (still rotated). Updates `st` like AttentionForward.
void AttentionCore(const AttentionWeights& w, const AttentionParams& p, LayerState& st,
                   const float* x, const AttentionRows& rows, int64_t row0, int64_t S,
                   int64_t start, float* o_out, AttentionTrace* trace);
// De-rotation, grouped wo_a and wo_b of T rows of o (overwritten by the de-rotation); out
// [T, dim] bf16.
void AttentionOutput(const AttentionWeights& w, const AttentionParams& p, float* o,
                     const int64_t* positions, int64_t T, float* out);

// The demo's per-head q normalisation (spec §3.4), done as its bf16 tensor ops do it: bf16
// squares, a bf16 mean, bf16 (mean + eps), a bf16 rsqrt, a bf16 product. In place over n values.
void HeadNormBf16(float* q, int64_t n, float eps);

// Sparse attention of one head over a candidate list (nullptr = masked entry), spec §3.9, as
// the reference kernel runs it: fp32 scores times `scale`, online softmax over 64-entry chunks
// of the list, probabilities rounded to bf16 before P·V, the sink only in the denominator.
// q, entries: d bf16 values; out: d bf16 values.
void SparseAttendHead(const float* q, const std::vector<const float*>& cand, int64_t d, float scale,
                      float sink, float* out);

// Fresh per-layer state for a block with compression ratio `ratio`.
LayerState NewLayerState(const ModelConfig& c, int64_t ratio);

}  // namespace ss::model
