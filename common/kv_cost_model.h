// The KV cost model of DeepSeek-V4's decode-time state (spec §4): the paged blocks a sequence
// holds in a pool covering some layers, and its compressor state outside the pool. Shared by the
// coordinator's accounting (coordinator/kv_accounting.h), the GPU workers' pool sizing
// (gpu_worker/memory_plan.h) and the cuda backend's pool layout (gpu_worker/cuda/cuda_backend_kv.h,
// KvLayout::Create takes its block size and window packing from here), so all three count blocks
// with one formula. KvCostModel is an immutable value.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_defaults.h"
#include "common/int_math.h"
#include "common/model_config.h"

namespace ss::sched {

// Format of the indexer's key cache entries (spec §4.2 "Indexer key cache").
enum class IndexerKeyFormat {
  kMxfp4,  // index_head_dim / 2 nibble bytes + one ue8m0 byte per 32 dims: 68 B for Flash (the
           // cuda backend's pool)
  kFp8,    // index_head_dim e4m3 bytes + one fp32 scale: 132 B for Flash (vLLM)
};

// Format of the main KV entries: window ring slots and compressed entries.
enum class MainEntryFormat {
  kFp8DsMla,  // fp8_ds_mla: e4m3 nope, bf16 rope, ue8m0 scale per 64 nope dims, padded to 8:
              // nope + 2 x rope + roundup8(nope / 64) = 448 + 128 + 8 = 584 B for Flash
  kBf16,      // head_dim bf16 values: 1,024 B for Flash (the cuda backend's records when the
              // numerics do not FP8-round the nope dims, KvLayout::Create's fp8_records = false)
};

struct KvCostOptions {
  // Tokens per block, B. Must be a positive multiple of every compress ratio of the covered
  // layers, so that every block holds whole compressed entries (128 for Flash, or a multiple).
  int64_t block_tokens = kDefaultKvBlockTokens;
  // The backbone layers [first_layer, end_layer) whose KV the pool holds; end_layer < 0 means
  // n_layers. A pipeline stage passes its own layer range.
  int64_t first_layer = 0;
  int64_t end_layer = -1;
  // Whether the pool also holds the MTP blocks' state (spec §4.1: every layer incl. MTP has a
  // window). Only the last stage of a pipeline that runs MTP holds them.
  bool include_mtp = true;
  IndexerKeyFormat indexer_keys = IndexerKeyFormat::kMxfp4;
  MainEntryFormat main_entries = MainEntryFormat::kFp8DsMla;
};

// Blocks of KV state per sequence in the pool of the covered layers, and the compressor state
// each sequence keeps beside it.
//
// With B = block_tokens, E = the main entry (E_main below), L = the covered layers (incl. MTP
// when include_mtp), for each covered layer of compress ratio m (spec §4.1-4.3):
//   a token block holds the growing state of B tokens:
//     m = 4 (CSA):   (B / 4) x (E + E_index)     compressed KV + indexer key per 4 tokens
//     m = 128 (HCA): (B / 128) x E               compressed KV per 128 tokens
//   block_bytes = roundup8(sum of those); for layers with no compressed layer (SWA only, which
//   do not grow) it is roundup8(L x window_size x E), so one block holds all their rings.
//   The fixed part, stored in the sequence's first fixed_blocks blocks ("window blocks"): the
//   window rings, window_size x E per layer, packed whole entries per block:
//     windows_per_block = max(1, floor(block_bytes / E))   (block_bytes = E when it is 0)
//     fixed_blocks      = ceil(L x window_size / windows_per_block)
//   Outside the pool, per sequence (state_bytes, not counted in blocks): the compressors'
//   partial state, fp32 kv + score, 2 x (coff*m) x (coff*d) x 4 bytes per compressor (coff = 2
//   iff m = 4): the main compressor (d = head_dim) of every m > 0 layer and the indexer's
//   compressor (d = index_head_dim) of every m = 4 layer.
//   E_main  = nope + 2 x rope + roundup8(nope / 64) (kFp8DsMla) or 2 x head_dim (kBf16)
//   E_index = index_head_dim / 2 + index_head_dim / 32 (kMxfp4) or index_head_dim + 4 (kFp8)
//
//   A resume snapshot (prefix caching; gpu_worker/backend.h "Resume snapshots"): the window
//   rings laid out as the fixed blocks, then the ratio-4 compressors' carried slots, 4 token slots
//   of kv + score, fp32, for the main compressor (coff*d = 2 x head_dim) and the indexer's
//   (2 x index_head_dim) of every covered m = 4 layer:
//     carry_bytes     = sum over m = 4 layers of 4 x 2 x 4 x (2 x head_dim + 2 x index_head_dim)
//     snapshot_blocks = fixed_blocks + ceil(carry_bytes / block_bytes)
//
// A sequence that has processed n tokens holds floor(n / m) compressed entries per layer, which
// ceil(n / B) blocks cover exactly (B is a multiple of m), so
//   BlocksForTokens(n) = fixed_blocks + ceil(n / B)
// which is the cuda backend's KvLayout::BlocksFor(n).
//
// Flash (43 layers: 2 SWA + 21 CSA + 20 HCA, + 1 SWA MTP), B = 128, kMxfp4, kFp8DsMla:
//   block_bytes       = 21 x 32 x (584 + 68) + 20 x 584 = 449,824 B (3,514.25 B per token)
//   windows_per_block = floor(449,824 / 584) = 770
//   fixed_blocks      = ceil(44 x 128 / 770) = 8 (43 x 128 without MTP: also 8), i.e. each
//                       sequence's windows cost as much as 1,024 tokens of context
//   state_bytes       = 21 x (65,536 + 16,384) + 20 x 524,288 = 12,206,080 B (11.6 MiB) per
//                       sequence, outside the pool
//   carry_bytes       = 21 x 40,960 = 860,160 B; snapshot_blocks = 8 + 2 = 10 (3.4 MiB)
// Two stages, layers [0, 21) and [21, 43) (no MTP): block_bytes 213,896 and 235,928 B, 366 and
// 403 ring entries per window block, fixed_blocks ceil(2,688 / 366) = 8 and ceil(2,816 / 403) = 7
// (the pipeline: 8), state 5,537,792 and 6,668,288 B.
//
// A pipeline of stages s with pools of P_s bytes: build one model per stage (its layer range);
// the pipeline holds min_s floor(P_s / block_bytes_s) blocks and a sequence needs
// max_s fixed_blocks_s fixed blocks, which Pipeline() combines.
struct KvCostModel {
  int64_t block_tokens = 0;       // B
  int64_t block_bytes = 0;        // one block of the pool
  int64_t fixed_bytes = 0;        // the window rings of one sequence: L x window_size x E
  int64_t fixed_blocks = 0;       // the blocks holding them (window blocks)
  int64_t entry_bytes = 0;        // E_main
  int64_t index_entry_bytes = 0;  // E_index
  int64_t windows_per_block = 0;  // ring entries of one window block
  int64_t state_bytes = 0;        // compressor state of one sequence, outside the pool
  int64_t carry_bytes = 0;        // the ratio-4 compressors' slots a snapshot carries
  int64_t snapshot_blocks = 0;    // the blocks of one resume snapshot

  // Validates the options against the config: InvalidArgument names the offending value.
  static absl::StatusOr<KvCostModel> FromModelConfig(const ModelConfig& config,
                                                     const KvCostOptions& options = {});
  // The cost model of a pipeline from its stages' models (same block_tokens): fixed_blocks and
  // state_bytes are the maxima over the stages (a sequence holds both in every stage; the state
  // figure is informational, per stage), and so are snapshot_blocks and carry_bytes; the other
  // fields are those of the stage that needs the most fixed blocks (informational).
  static absl::StatusOr<KvCostModel> Pipeline(std::span<const KvCostModel> stages);

  // Blocks a sequence needs to hold `tokens` processed tokens (fixed part included; 0 for 0).
  int64_t BlocksForTokens(int64_t tokens) const {
    return tokens <= 0 ? 0 : fixed_blocks + CeilDiv(tokens, block_tokens);
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
