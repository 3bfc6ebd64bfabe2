// The coordinator's view of one pipeline's KV-cache capacity: a cost model that turns a
// sequence length into a number of paged blocks, exactly as the GPU workers lay out DeepSeek-V4's
// decode-time state (spec §4), and a block allocator with one block table per sequence.
//
// The coordinator never touches KV memory. It owns the numbers: which blocks a sequence holds,
// how many are free. The GPU workers receive the block tables with every step plan and write the
// sequence's state into those blocks of their own pools. Block ids are the same on every stage of
// a pipeline; each stage's block holds that stage's layers only.
//
// Thread-compatibility: a KvAccounting belongs to the scheduler thread (see scheduler.h); calls on
// one object must not overlap. KvCostModel is an immutable value.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
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

// Outcome of growing a sequence's block table.
enum class KvGrow {
  kOk,           // the table covers the requested tokens
  kOutOfBlocks,  // not enough free blocks; nothing was allocated
};

using KvSequenceId = uint64_t;

// A fixed pool of blocks and one block table per sequence. Allocation never exceeds the pool;
// Release returns every block of a sequence. Freed blocks are reused last-in first-out.
class KvAccounting {
 public:
  // total_blocks must be positive and below 2^31 (block ids are int32 on the wire).
  static absl::StatusOr<KvAccounting> Create(const KvCostModel& cost, int64_t total_blocks);

  const KvCostModel& cost() const { return cost_; }
  int64_t total_blocks() const { return total_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return total_blocks_ - free_blocks(); }
  int64_t num_sequences() const { return static_cast<int64_t>(tables_.size()); }

  // Blocks `seq` holds (0 for a sequence without a table).
  int64_t BlocksHeld(KvSequenceId seq) const;
  // Tokens `seq`'s blocks cover now, and the most it could cover if it also took every free
  // block.
  int64_t TokensCovered(KvSequenceId seq) const { return cost_.TokensInBlocks(BlocksHeld(seq)); }
  int64_t TokensReachable(KvSequenceId seq) const {
    return cost_.TokensInBlocks(BlocksHeld(seq) + free_blocks());
  }
  // Grows `seq`'s table (creating it) so it covers `tokens` tokens. Never shrinks.
  KvGrow Grow(KvSequenceId seq, int64_t tokens);
  // Frees all of `seq`'s blocks; a no-op for a sequence without a table.
  void Release(KvSequenceId seq);
  // The sequence's block ids, fixed-state blocks first, then one per B tokens in position order.
  // Empty for a sequence without a table. Valid until the next Grow or Release.
  std::span<const int32_t> BlockTable(KvSequenceId seq) const;

 private:
  KvAccounting(const KvCostModel& cost, int64_t total_blocks);

  KvCostModel cost_;
  int64_t total_blocks_;
  std::vector<int32_t> free_;  // a stack: back() is handed out next
  absl::flat_hash_map<KvSequenceId, std::vector<int32_t>> tables_;
};

}  // namespace ss::sched
