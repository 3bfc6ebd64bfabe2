// The coordinator's view of one pipeline's KV-cache capacity: a block allocator with one block
// table per sequence, sized by the KV cost model (common/kv_cost_model.h: sequence length ->
// paged blocks, exactly as the GPU workers lay out DeepSeek-V4's decode-time state, spec §4).
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
#include "common/kv_cost_model.h"

namespace ss::sched {

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
