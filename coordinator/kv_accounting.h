// The coordinator's view of one pipeline's KV-cache capacity: a block allocator with one block
// table per sequence, sized by the KV cost model (common/kv_cost_model.h: sequence length ->
// paged blocks, exactly as the GPU workers lay out DeepSeek-V4's decode-time state, spec §4),
// and the automatic prefix cache that lives in the same pool.
//
// The coordinator never touches KV memory. It owns the numbers: which blocks a sequence holds,
// how many are free. The GPU workers receive the block tables with every step plan and write the
// sequence's state into those blocks of their own pools. Block ids are the same on every stage of
// a pipeline; each stage's block holds that stage's layers only.
//
// Prefix cache (vLLM's automatic prefix caching, ARCHITECTURE.md "Prefix cache")
//   A token block is *cached* once its B tokens are final (Register): it is then identified by
//   its parent's cache node and its tokens, so the cached blocks form a tree whose root-to-node
//   paths are token prefixes of whole blocks. Lookups hash a block's tokens to find a candidate
//   child and then compare the parent and the tokens themselves, so a hash collision can never
//   match another prompt's block; node ids are never reused, so an evicted block's children are
//   unreachable. A cached block is shared by reference: every table that contains it holds one
//   reference, and nobody writes it (a sequence only writes positions from its resume point on,
//   which lie in its own blocks). To resume at N = k·B a sequence also needs a resume snapshot at N
//   (gpu_worker/backend.h "Resume snapshots": the window rings and the ratio-4 compressors'
//   carried slots, snapshot_blocks blocks), saved by the workers after a chunk that ended at N
//   and attached to the node of block k-1. So a hit is the deepest node on the prompt's path that
//   has a snapshot.
//   Cached blocks and snapshots that no table references are *evictable*: they stay in the pool
//   and count as free; when a block is needed and the free list is empty, the least recently used
//   evictable unit (a block, or a snapshot's blocks together) is evicted. A sequence's release
//   puts its blocks in the LRU order tail first, so a conversation's earlier blocks outlive its
//   later ones. One formula for capacity: total_blocks = free + evictable + referenced.
//
// Thread-compatibility: a KvAccounting belongs to the scheduler thread (see scheduler.h); calls on
// one object must not overlap. KvCostModel is an immutable value.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
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

// The longest cached prefix of a prompt that a new sequence can resume from.
struct PrefixHit {
  int64_t tokens = 0;           // a multiple of block_tokens; 0: none
  std::vector<int32_t> blocks;  // the shared token blocks, tokens / B of them
  uint64_t node = 0;            // the cache node of the last one (it holds the snapshot)
};

// A snapshot being saved: its blocks are reserved until Commit or Abort.
struct SnapshotTicket {
  uint64_t id = 0;  // unique, never 0 (the workers' name for the snapshot)
  std::vector<int32_t> blocks;
};

// A fixed pool of blocks, one block table per sequence and the prefix cache (see above).
class KvAccounting {
 public:
  // total_blocks must be positive and below 2^31 (block ids are int32 on the wire).
  static absl::StatusOr<KvAccounting> Create(const KvCostModel& cost, int64_t total_blocks,
                                             bool prefix_caching = false);

  const KvCostModel& cost() const { return cost_; }
  bool prefix_caching() const { return prefix_caching_; }
  int64_t total_blocks() const { return total_blocks_; }
  // Blocks a new allocation can take: the free list plus the evictable cached blocks.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()) + evictable_; }
  int64_t used_blocks() const { return total_blocks_ - free_blocks(); }
  // Blocks holding cached content (token blocks and snapshots), referenced or not.
  int64_t cached_blocks() const { return cached_blocks_; }
  int64_t evictable_blocks() const { return evictable_; }
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
  // Drops all of `seq`'s references: its own blocks go back to the free list (cached ones to the
  // evictable set when no other table holds them). A no-op for a sequence without a table.
  void Release(KvSequenceId seq);
  // The sequence's block ids, fixed-state blocks first, then one per B tokens in position order.
  // Empty for a sequence without a table. Valid until the next Grow or Release.
  std::span<const int32_t> BlockTable(KvSequenceId seq) const;

  // The deepest cached prefix of `tokens` of at most `max_tokens` tokens that ends in a snapshot
  // (an empty hit with prefix caching off).
  PrefixHit Lookup(std::span<const int32_t> tokens, int64_t max_tokens) const;
  // The most tokens (from position 0) a new sequence admitted with `hit` could cover while
  // `reserve` blocks stay free.
  int64_t TokensReachableWith(const PrefixHit& hit, int64_t reserve) const;
  // Creates `seq`'s table from `hit` (an empty hit: a plain new table): its own fixed blocks, the
  // hit's blocks (one more reference each), its own blocks up to `tokens` (> hit.tokens), and
  // sets `*restore` to the snapshot (no blocks for no hit). The hit's blocks and snapshot
  // count as used from now on; they are never evicted to make room for this table.
  // kOutOfBlocks changes nothing.
  KvGrow Admit(KvSequenceId seq, const PrefixHit& hit, int64_t tokens, SnapshotTicket* restore);
  // Caches `seq`'s token blocks that `tokens` (the sequence's ids from position 0) fills and
  // that are not cached yet. A block whose content is cached already (another sequence computed
  // it too) stays private and its cached twin continues the path. No-op with caching off.
  void Register(KvSequenceId seq, std::span<const int32_t> tokens);
  // Reserves blocks for a snapshot of `seq` at `position` (a positive multiple of B) if the pool
  // has snapshot_blocks + `reserve` free blocks and no snapshot exists there yet: false
  // otherwise. Never evicts `seq`'s own path.
  bool BeginSnapshot(KvSequenceId seq, int64_t position, int64_t reserve, SnapshotTicket* ticket);
  // The workers saved it: attaches it to the node of `seq`'s block position / B - 1 when that is
  // cached and holds no snapshot yet (then it is evictable), else frees its blocks.
  void CommitSnapshot(KvSequenceId seq, int64_t position, const SnapshotTicket& ticket);
  // Frees a ticket's blocks (the workers may have saved it: it is reported as evicted).
  void AbortSnapshot(const SnapshotTicket& ticket);
  // Ids of snapshots evicted or aborted since the last call (the workers may forget them).
  std::vector<uint64_t> TakeEvictedSnapshots();

 private:
  struct Table {
    std::vector<int32_t> blocks;
    // nodes[i]: the cache node on the path of the sequence's token block i (its own block or a
    // cached twin), for the blocks registered so far.
    std::vector<uint64_t> nodes;
  };
  struct Snapshot {
    uint64_t id = 0;
    std::vector<int32_t> blocks;
  };
  // A cached token block, keyed in cached_ by its block id.
  struct Cached {
    uint64_t node = 0;
    uint64_t parent = 0;  // 0: the root
    uint64_t hash = 0;    // ChildKey(parent, tokens), its key in children_
    std::vector<int32_t> tokens;
    int32_t refs = 0;
  };
  // A cache node (one per cached block, ids from 1).
  struct Node {
    int32_t block = -1;
    bool has_snapshot = false;
    Snapshot snapshot;
    int32_t snapshot_pins = 0;  // while > 0 the snapshot is not evictable
    std::list<std::pair<bool, uint64_t>>::iterator snapshot_lru;
  };
  // LRU entries: (is_snapshot, block id or node id); front = evicted first.
  using Lru = std::list<std::pair<bool, uint64_t>>;

  KvAccounting(const KvCostModel& cost, int64_t total_blocks, bool prefix_caching);

  int32_t TakeBlock();  // requires free_blocks() > 0
  void EvictOne();
  void DropSnapshot(uint64_t node);  // frees a committed, unpinned snapshot's blocks
  void Unref(int32_t block);
  void PinSnapshot(uint64_t node);
  void UnpinSnapshot(uint64_t node);
  const Cached* FindChild(uint64_t parent, std::span<const int32_t> tokens) const;
  static uint64_t ChildKey(uint64_t parent, std::span<const int32_t> tokens);

  KvCostModel cost_;
  int64_t total_blocks_;
  bool prefix_caching_;
  std::vector<int32_t> free_;  // a stack: back() is handed out next
  absl::flat_hash_map<KvSequenceId, Table> tables_;

  absl::flat_hash_map<int32_t, Cached> cached_;  // by block id
  absl::flat_hash_map<uint64_t, Node> nodes_;
  // ChildKey(parent node, tokens) -> block id of the cached child (FindChild checks both)
  std::unordered_map<uint64_t, int32_t> children_;
  absl::flat_hash_map<int32_t, Lru::iterator> block_lru_;  // evictable blocks
  Lru lru_;
  int64_t evictable_ = 0;      // blocks in lru_ (snapshots count their blocks)
  int64_t cached_blocks_ = 0;  // blocks of cached_ plus the committed snapshots'
  uint64_t next_node_ = 1;
  uint64_t next_snapshot_ = 1;
  std::vector<uint64_t> evicted_snapshots_;
};

}  // namespace ss::sched
