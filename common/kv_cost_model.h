// The KV cost model of DeepSeek-V4's decode-time state (spec §4): bytes and paged blocks per
// sequence for the layers one pool covers. Shared by the coordinator's accounting
// (coordinator/kv_accounting.h) and the GPU workers' pool sizing (gpu_worker/memory_plan.h), so
// both count blocks the same way. KvCostModel is an immutable value.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace ss::sched {

// Format of the indexer's key cache entries (spec §4.2 "Indexer key cache").
enum class IndexerKeyFormat {
  kFp8,    // index_head_dim e4m3 bytes + one fp32 scale: 132 B for Flash (vLLM)
  kMxfp4,  // index_head_dim / 2 nibble bytes + one ue8m0 byte per 32 dims: 68 B for Flash
};

struct KvCostOptions {
  // Tokens per block, B. Must be a positive multiple of every compress ratio of the covered
  // layers, so that every block holds whole compressed entries (128 for Flash, or a multiple).
  int64_t block_tokens = 128;
  // The backbone layers [first_layer, end_layer) whose KV the pool holds; end_layer < 0 means
  // n_layers. A pipeline stage passes its own layer range.
  int64_t first_layer = 0;
  int64_t end_layer = -1;
  // Whether the pool also holds the MTP blocks' state (spec §4.1: every layer incl. MTP has a
  // window). Only the last stage of a pipeline that runs MTP holds them.
  bool include_mtp = true;
  IndexerKeyFormat indexer_keys = IndexerKeyFormat::kFp8;
};

// Bytes and blocks of KV state per sequence, for the layers one pool covers.
//
// With B = block_tokens, for each covered layer of compress ratio m (spec §4.1-4.3):
//   fixed, per sequence (does not grow with length):
//     window ring:         window_size x E_main                       every layer, incl. MTP
//     compressor state:    2 (kv + score) x (coff*m) x (coff*d) x 4   fp32, coff = 2 iff m = 4,
//                          for the main compressor (d = head_dim) in m > 0 layers and for the
//                          indexer's compressor (d = index_head_dim) in m = 4 layers
//   growing, per block of B tokens:
//     m = 4 (CSA):   (B / 4) x (E_main + E_index)      compressed KV + indexer key per 4 tokens
//     m = 128 (HCA): (B / 128) x E_main                compressed KV per 128 tokens
//   E_main  = nope + 2 x rope + roundup8(nope / 64)  (fp8_ds_mla: e4m3 nope, bf16 rope, ue8m0
//             scale per 64 nope dims, padded; 448 + 128 + 7 + 1 = 584 B for Flash)
//   E_index = index_head_dim + 4 (kFp8) or index_head_dim / 2 + index_head_dim / 32 (kMxfp4)
//
// A sequence that has processed n tokens holds floor(n / m) compressed entries per layer, which
// ceil(n / B) blocks cover exactly (B is a multiple of m), so
//   BlocksForTokens(n) = fixed_blocks + ceil(n / B),  fixed_blocks = ceil(fixed_bytes /
//   block_bytes)
// The fixed state is stored in the first fixed_blocks blocks of the sequence's table, as a byte
// stream that the worker lays out; only the last of them has unused bytes.
//
// Flash (43 layers: 2 SWA + 21 CSA + 20 HCA, + 1 SWA MTP), B = 128, kFp8:
//   block_bytes = 128 x 3,850.25 = 492,832 B (21 x 32 x 716 + 20 x 1 x 584)
//   fixed_bytes = 44 x 128 x 584 (windows, 3.29 MB) + 21 x (65,536 + 16,384) + 20 x 524,288
//                 (compressor state, 12.2 MB) = 15,495,168 B -> fixed_blocks = 32
// i.e. each sequence costs as much as ~4,000 tokens of context before its first token.
//
// A pipeline of stages s with pools of P_s bytes: build one model per stage (its layer range);
// the pipeline holds min_s floor(P_s / block_bytes_s) blocks and a sequence needs
// max_s fixed_blocks_s fixed blocks, which Pipeline() combines.
struct KvCostModel {
  int64_t block_tokens = 0;  // B
  int64_t block_bytes = 0;   // growing state of B tokens, all covered layers
  int64_t fixed_bytes = 0;   // windows + compressor state of one sequence
  int64_t fixed_blocks = 0;  // ceil(fixed_bytes / block_bytes)

  // Validates the options against the config: InvalidArgument names the offending value.
  static absl::StatusOr<KvCostModel> FromModelConfig(const ModelConfig& config,
                                                     const KvCostOptions& options = {});
  // The cost model of a pipeline from its stages' models (same block_tokens): fixed_blocks is
  // the maximum; block_bytes and fixed_bytes are those of the stage that needs the most fixed
  // blocks (informational).
  static absl::StatusOr<KvCostModel> Pipeline(std::span<const KvCostModel> stages);

  // Blocks a sequence needs to hold `tokens` processed tokens (fixed part included; 0 for 0).
  int64_t BlocksForTokens(int64_t tokens) const {
    return tokens <= 0 ? 0 : fixed_blocks + (tokens + block_tokens - 1) / block_tokens;
  }
  // The most tokens `blocks` blocks can hold (0 when they do not cover the fixed part).
  int64_t TokensInBlocks(int64_t blocks) const {
    return blocks <= fixed_blocks ? 0 : (blocks - fixed_blocks) * block_tokens;
  }
  // Blocks that fit in a pool of `pool_bytes` bytes.
  int64_t BlocksInPool(int64_t pool_bytes) const { return pool_bytes / block_bytes; }

  std::string DebugString() const;
};

}  // namespace ss::sched
