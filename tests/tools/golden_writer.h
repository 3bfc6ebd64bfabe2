// Test-only writer of golden sets in the format of tests/data/tiny-a (README.md there): cases.json,
// golden.safetensors and golden_blocks.safetensors, for ANY checkpoint the reference model loads.
//
// Every tensor comes from the reference model itself (common/model), so the set is numerically
// self-consistent: `splitserve-golden` on (checkpoint, written set) must pass every check, most of
// them bit-exactly. It is not a second opinion on the arithmetic; it exercises what a set of other
// shapes exercises: every shape-dependent path of the runner and the model (other dim, heads,
// hc_mult, window, experts, indexer widths, layer maps, with or without MTP) and, with a sharded
// checkpoint, the sharded loader. The official sets come from the demo instead (tiny-a README).
//
// What is written (names, dtypes and layouts exactly as tiny-a's tensor list):
//   * prefill.L{n}.{prompt_ids,logits} for GoldenPlan::prefill_lens: prefixes of one master
//     sequence.
//   * long.*: prefill of long_prompt tokens, then one-token greedy decode steps up to position
//     long_total-1: prompt_ids, input_ids [long_total], logits / gen_ids / top2_margin
//     [long_total-long_prompt+1], indexer.{sel,scores,boundary_gap} for the CSA layers (row r =
//     query position long_prompt-1+r) and hc_after_block [n_layers, long_total, hc, dim] in the
//     blocks file (prefill positions from the prefill, the rest from the decode steps).
//   * batch2.*: two different prompts prefilled in one call, then batched greedy decode steps.
//   * inter.* (inter_len tokens) and blocks160.* (blocks_len tokens; the runner knows the set by
//     the prefix "blocks160" whatever its length): per-block streams, sublayer outputs, router,
//     compressed / indexer KV, indexer sets and scores; inter also the final streams and the
//     layer-0 HC splits.
//   * mtp.* (when the checkpoint has an MTP block) on the inter prompt, with tiny-a's convention.
//   * rope.freqs_cis.{m0,compressed} [rope_positions, rope_head_dim/2, (cos, sin)].
//   * variant.{shared_clamp_off,kv_fp8_round_off,initial_revision}.L{n}.logits for variant_lens.
//
// Full-model streams come from running RunBlock layer by layer, which is what Model::Forward does,
// so the per-block data are the in-model tensors. Token ids are drawn from std::mt19937_64 seeded
// from `seed` (master sequence: seed, long prompt: seed+1, batch prompts: seed+2); the bytes of a
// set depend only on the checkpoint, the seed and the model's code. Single caller; the model's
// forward calls parallelise internally.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/model.h"
#include "common/model_config.h"

namespace ss::golden {

// Sequence lengths of a golden set, chosen from the config so that every case crosses the
// boundaries that matter for it (window wrap, CSA selection with more blocks than index_topk,
// a completed ratio-128 block when the config has ratio-128 layers).
struct GoldenPlan {
  std::vector<int64_t> prefill_lens;  // 1..5, window+1 and 2 x window+3 (128 and 130 as well
                                      // with ratio-128 layers)
  int64_t long_prompt = 0;            // window + 5
  int64_t long_total = 0;             // positions 0..long_total-1; >= 131 with ratio-128 layers
  int64_t inter_len = 0;              // > 2 x window and > 4 x index_topk
  int64_t blocks_len = 0;             // 133 with ratio-128 layers (one HCA block completes)
  int64_t batch_prompt = 0;
  int64_t batch_rows = 0;             // prefill row + batch_rows-1 decode steps
  std::vector<int64_t> variant_lens;  // a subset of prefill_lens
  int64_t rope_positions = 0;         // min(max_position_embeddings, 4096), 512 when absent
};
GoldenPlan PlanGoldenSet(const ModelConfig& c);

// Writes the golden set of `m`'s checkpoint into `out_dir` (created if needed; the three files
// are overwritten). `m` must have been loaded with the default (current-revision) options; the
// revision variants are computed by loading the same checkpoint again with other switches, from
// the directory holding `m`'s weight files. Errors: InvalidArgument for non-default options,
// Internal when a tensor stored as BF16 is not exactly representable in bf16 (the runner would
// then compare against a rounded copy), and the loader's and the writer's errors.
absl::Status WriteGoldenSet(const model::Model& m, const std::string& out_dir, uint64_t seed);

}  // namespace ss::golden
