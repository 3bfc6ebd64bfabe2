// The reference DeepSeek-V4 forward pass (spec §3), the definition every other backend is
// compared to. It reproduces the official demo at its current revision, with switches for the
// two revision differences (spec §0.2).
//
// Generalises the demo (spec §3.14): any number of independent sequences per call, each a chunk
// of consecutive tokens starting at that sequence's next position, so prefill from 0, chunked
// prefill, one-token and multi-token decode are one operation. Sequences never interact: a
// sequence gives bit-identical results alone or in a batch.
//
// Thread-safety: a Model is immutable after Load and may run several forward calls at once as
// long as they use different SequenceStates. Large calls parallelise inside the ops with OpenMP;
// small calls of several chunks (decode steps) run contiguous groups of chunks on the model's
// thread pool instead (RunBlock), each group's rows with the same arithmetic as alone.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dummy_weights.h"
#include "common/model/indexer.h"
#include "common/model/moe.h"
#include "common/model/state.h"
#include "common/model/weights.h"
#include "common/thread_pool.h"
#include "common/weight_source.h"

namespace ss::model {

struct ModelOptions {
  bool shared_expert_clamp = true;  // current revision clamps the shared expert's SwiGLU
  bool kv_fp8_sim_rounds = true;    // current revision rounds the KV FP8 simulation to e4m3
  // Threads (the caller included) for a small call's row groups; 0: the CPUs this process may
  // run on (sched_getaffinity), capped at kMaxRowGroupThreads; 1: no pool.
  int row_group_threads = 0;
};
inline constexpr int kMaxRowGroupThreads = 16;

// One sequence's share of a forward call: `n` tokens at positions start..start+n-1.
struct ChunkRef {
  SequenceState* state = nullptr;
  const int64_t* tokens = nullptr;
  int64_t n = 0;
  int64_t start = 0;
};

// Intermediates of one block call, for block-level tests; rows follow the chunk order.
struct BlockTrace {
  std::vector<float> attn_out;         // [T, dim] attention sublayer output (after wo_b)
  std::vector<float> moe_out;          // [T, dim] MoE sublayer output
  RouterResult router;                 // [T, k]
  std::vector<IndexerResult> indexer;  // one per chunk (CSA layers)
  std::vector<std::vector<float>> hc_attn_split, hc_ffn_split;  // per row: pre|post|comb
};

// Wall seconds of one RunBlock call's parts (accumulated: += ).
struct BlockTimings {
  double attention = 0.0;  // hyper-connection pre-mix, norm, attention, post-mix
  double moe = 0.0;        // the GPU side of the MoE sublayer: pre/post-mix, router, shared expert
  double moe_cpu = 0.0;    // the routed experts (the RoutedExperts call, or the local sum)
};

class Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     ModelOptions options = {});
  // The model of `source` (its config with the overrides applied, LoadModelConfig(source);
  // safetensors mapped, or dummy weights generated in memory by MakeDummyCheckpoint on a pool of
  // this process's allowed CPUs). With dummy weights only the tensors `materialize` accepts are
  // generated; the others read as zeros and take no memory (null: all). Ignored for safetensors,
  // whose pages are only read where used. Both bind through BindModelWeights.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const WeightSource& source,
                                                     ModelOptions options = {},
                                                     const TensorFilter& materialize = nullptr);

  const ModelConfig& config() const { return w_->config; }
  const ModelWeights& weights() const { return *w_; }
  const ModelOptions& options() const { return options_; }

  // A fresh state (empty caches, compressor slots kv = 0 / score = -inf) for a new sequence.
  SequenceState NewSequence() const;

  // Block 0's input: embed[id] copied to every stream, out [n, hc, dim].
  void EmbedStreams(const int64_t* ids, int64_t n, float* out) const;

  // Runs one block (0..n_layers-1, or n_layers + k for MTP block k's decoder block) on the
  // streams h_in [T, hc, dim] of the chunks (rows in chunk order) into h_out. Updates the
  // chunks' state of that layer only; does not advance next_pos.
  void RunBlock(int64_t layer, std::span<const ChunkRef> chunks, const float* h_in, float* h_out,
                BlockTrace* trace) const;

  // The same with the block's routed experts computed by `experts` (null: locally, exactly as
  // above) and the parts' wall time added to `timings` (optional). The result is bit-identical to
  // the overload above when `experts` returns RoutedSum's values (moe.h). An error from
  // `experts` is returned as is; the chunks' states of this layer have then taken the chunk's
  // attention update but not its MoE output, so they must not be used again.
  absl::Status RunBlock(int64_t layer, std::span<const ChunkRef> chunks, const float* h_in,
                        float* h_out, const RoutedExperts* experts, BlockTimings* timings) const;

  // logits [vocab] fp32 from one token's final streams [hc, dim] (head collapse, norm, head).
  void Logits(const float* streams, float* logits) const;
  // Logits of several tokens at once (one [vocab] per entry of `streams`): the same values as
  // Logits, one pass over the head's weights for the batch.
  std::vector<std::vector<float>> LogitsRows(std::span<const float* const> streams) const;

  // Full forward over the chunks: each chunk starts at its state's next_pos, which then
  // advances by n. Returns the last position's logits of every chunk. `final_streams`
  // (optional) receives the streams after the last block, [T, hc, dim].
  absl::StatusOr<std::vector<std::vector<float>>> Forward(
      std::span<const ChunkRef> chunks, std::vector<float>* final_streams = nullptr) const;

  // MTP block k (spec §3.13) over the chunks: row r takes the main model's final streams
  // h_main[r] at position start+r and the NEXT token id chunk.tokens[r]; it uses the state's
  // layer n_layers + k and advances nothing. Returns the last row's logits per chunk.
  absl::StatusOr<std::vector<std::vector<float>>> MtpForward(int64_t k,
                                                             std::span<const ChunkRef> chunks,
                                                             const float* h_main) const;

  // Checks that every chunk is well-formed (ids in range, n > 0, state shaped for this model).
  absl::Status ValidateChunks(std::span<const ChunkRef> chunks) const;

 private:
  Model() = default;
  static absl::StatusOr<std::unique_ptr<Model>> FromWeights(std::unique_ptr<ModelWeights> w,
                                                            ModelOptions options);
  const BlockWeights& Block(int64_t layer) const;
  int64_t Ratio(int64_t layer) const;
  absl::Status RunBlockImpl(int64_t layer, std::span<const ChunkRef> chunks, const float* h_in,
                            float* h_out, BlockTrace* trace, const RoutedExperts* experts,
                            BlockTimings* timings) const;
  // Row groups: how many a call of `rows` rows may use (1: none), and fn(g) for g in [0, groups)
  // on the pool (in order where groups is 1, or from inside one of the pool's own tasks).
  int RowGroupLimit(int64_t rows) const;
  void EachRowGroup(int64_t groups, absl::FunctionRef<void(int64_t)> fn) const;

  std::unique_ptr<ModelWeights> w_;
  ModelOptions options_;
  std::unique_ptr<ThreadPool> pool_;  // row groups (null: one group)
  std::vector<float> rope_plain_, rope_compressed_;
};

}  // namespace ss::model
