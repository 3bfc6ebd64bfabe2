// The cuda backend's paged KV cache (ARCHITECTURE.md "Memory"): one device pool
// of fixed-size blocks, allocated at start, holding every stage layer's KV in fp8_ds_mla records
// (kernels/paged_kv.h) and the indexer keys in MXFP4, addressed through each sequence's block
// table.
//
// Block layout (B = block_tokens, a multiple of every compress ratio of the stage; E = the record,
// nope + 2·rope + ⌈nope/64⌉₈ bytes, 584 for Flash; K = the MXFP4 key, hd/2 + hd/32 bytes, 68 for
// Flash). A token block of a sequence holds, for each stage layer in order, the layer's
// compressed entries of those B tokens:
//   ratio m > 0:  B/m records (entry j of the layer in token block j / (B/m), slot j mod (B/m))
//   ratio 4 with an indexer: then B/4 MXFP4 keys
// A block may instead be a window block: floor(block_bytes / E) window records (the stage
// layers' W-entry rings, layer l's ring slot k at window ordinal l·W + k). A stage without a
// compressed layer (SWA only) gets blocks of all its rings. block_bytes, the records per window
// block and window_blocks are common/kv_cost_model.h's block_bytes, windows_per_block and
// fixed_blocks for the stage (include_mtp false, kMxfp4 keys, kFp8DsMla or kBf16 entries):
// KvLayout::Create takes them from the cost model, so the coordinator's tables and the memory
// plan count the same blocks.
//
// A sequence's table: [window_blocks window blocks | token block 0, 1, ...]; a chunk ending at
// position e needs window_blocks + ⌈e/B⌉ entries. The coordinator's tables (StageChunk::
// block_table) start with its fixed blocks (the maximum of the stages' window_blocks over the
// pipeline, StageChunk::table_fixed_blocks), at least window_blocks of them: the stage uses the
// first window_blocks and takes token block j from block_table[table_fixed_blocks + j]
// (KvLayout::StageTable), so every stage and the coordinator's prefix cache agree on which block
// holds which tokens. A shorter table is an InvalidArgument, never an out-of-bounds write.
//
// Compressor states (fp32 kv | score per compressor, the cost model's state_bytes per sequence)
// are not in the pool: each sequence has ONE device allocation of all its layers' states, carved
// per layer and compressor in layer order (main compressor, then the indexer's), each piece
// starting on a 256-byte boundary. A released sequence's allocation goes to the pool's free list
// and is reused by the next new sequence (reset there, as every sequence's first chunk resets its
// states), so ending a sequence frees no device memory and synchronises nothing; ReleaseAll and
// the destructor free them all.
//
// Resume snapshots (backend.h "Resume snapshots"; prefix caching). A sequence's state at a
// position N (a positive multiple of B) beyond its token blocks is its window blocks and the
// ratio-4 compressors' "previous group" slots. In a state allocation a compressor's kv and score
// are each [slots, width] fp32, slot-major (kernels/compressor.h), and at a position that is a
// multiple of 4 slots 0..3 hold the group N-4 .. N-1 (the last emitted one), so the carried part
// of one compressor is the first 4·width floats of its kv and of its score. A snapshot takes
// KvCostModel::snapshot_blocks pool blocks: the first window_blocks are copies of the sequence's
// window blocks, block for block; the next ⌈carry_bytes / block_bytes⌉ hold the carried slots as
// one byte stream, for every ratio-4 layer in order: main kv slots 0..3, main score slots 0..3,
// indexer kv slots 0..3, indexer score slots 0..3 (KvLayout::carry, in that order), split at the
// block boundaries. Everything else in the state allocation is rewritten before it is read when a
// sequence continues at N (the current group's slots 4..7 and the ratio-128 slots: B is a
// multiple of 128 where a layer compresses by 128), so a restore copies the carried slots back
// and leaves the rest as it is. Saving and restoring are device-to-device copies on the
// backend's stream, in its order with the steps, with no host wait.
//
// Standalone use (golden, tests, benchmarks: no coordinator, empty block tables): the pool hands
// out blocks itself (a free list). A pool serves either kind of table at a time, never both
// (their block ids would collide): the first chunk after the pool was empty decides.
//
// Pool size: ⌈kv_tokens / B⌉ token blocks (the coordinator's ids are below kv_tokens / B) plus
// `extra_sequences` × (window_blocks + 1) blocks for the built-in allocator's windows. TP: every
// rank holds the whole (replicated) KV of its stage.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "gpu_worker/kernels/paged_kv.h"

namespace ss::gpu {

struct KvLayout {
  struct Layer {
    int64_t ratio = 0;
    bool has_indexer = false;
    int64_t main_off = 0, key_off = 0;  // byte offsets in a token block
    // The compressors' states in a sequence's state allocation: kv | score of comp_n (index_n)
    // floats each, at float offset comp_state_off (index_state_off); -1 where there is none.
    int64_t comp_state_off = -1, index_state_off = -1, comp_n = 0, index_n = 0;
  };
  int64_t block_tokens = 0, nope = 0, rope = 0, record_bytes = 0, key_dim = 0, key_bytes = 0;
  int64_t window = 0, block_bytes = 0, win_per_block = 0, window_blocks = 0;
  int64_t state_floats = 0;   // one sequence's state allocation (each piece 256-byte aligned)
  std::vector<Layer> layers;  // index = layer − first_layer
  // A resume snapshot's carried slots: pieces of the state allocation (float offset, bytes) in
  // the snapshot's byte-stream order; their bytes sum to carry_bytes. snapshot_blocks =
  // window_blocks + ⌈carry_bytes / block_bytes⌉ (the cost model's figures, checked at Create).
  struct CarryPiece {
    int64_t state_off = 0, bytes = 0;
  };
  std::vector<CarryPiece> carry;
  int64_t carry_bytes = 0, snapshot_blocks = 0;

  // fp8_records false: entries stored as bf16 (2·head_dim bytes, nope = 0 in paged_kv.h's
  // terms), for numerics whose nope dims are not FP8-rounded (kv_fp8_sim_rounds off).
  static absl::StatusOr<KvLayout> Create(const ModelConfig& c, int first_layer, int end_layer,
                                         int64_t block_tokens, bool fp8_records = true);
  int64_t BlocksFor(int64_t tokens) const {
    return window_blocks + (tokens + block_tokens - 1) / block_tokens;
  }
  cuda::KvGeom Geom(int l, const uint8_t* pool) const;
  // The stage's view of a step plan's table whose first `table_fixed` blocks are fixed blocks
  // (the pipeline's, 0: window_blocks): its first window_blocks, then its token blocks. Empty,
  // with `*error` set, when table_fixed is below window_blocks or the table is shorter.
  std::vector<int32_t> StageTable(std::span<const int32_t> table, int64_t table_fixed,
                                  std::string* error) const;
  // The blocks KvPool::Init allocates for kv_tokens: the coordinator's kv_tokens / block_tokens
  // (rounded up) plus extra_sequences' window blocks (and one more each) for the built-in
  // allocator.
  int64_t PoolBlocks(int64_t kv_tokens, int64_t extra_sequences) const {
    return (kv_tokens + block_tokens - 1) / block_tokens + extra_sequences * (window_blocks + 1);
  }
};

// The KV pool against the device's memory, once the weights are resident: free_bytes (what
// cudaMemGetInfo reports free) must hold reserve_bytes (activations, scratch, staging, the
// CUDA graphs), `sequences` sequences' compressor states (state_floats each, allocated per
// sequence outside the pool) and the pool. All figures in bytes.
struct KvFit {
  int64_t free_bytes = 0, reserve_bytes = 0, sequences = 0, state_bytes = 0;
  int64_t pool_bytes = 0, pool_blocks = 0, kv_tokens = 0;
  // "free 20.31 GiB holds reserve 1.50 GiB + compressor state 0.73 GiB (64 sequences x 11.6 MiB) +
  // KV pool 18.07 GiB (43112 blocks of 128 tokens: 5516288 tokens)"
  std::string Describe() const;
};

// kv_tokens 0: the most tokens (a multiple of block_tokens) whose pool fits; else the pool of
// kv_tokens, which must fit. FailedPrecondition with every figure where it does not (or, for 0,
// where not even one block beyond the extra sequences' fits); InvalidArgument for a negative
// figure or sequences < 1.
absl::StatusOr<KvFit> FitKvPool(const KvLayout& layout, int64_t kv_tokens, int64_t extra_sequences,
                                int64_t free_bytes, int64_t reserve_bytes, int64_t sequences);

// One sequence's state outside the records: its table and compressor states.
struct KvSeq {
  int64_t next_pos = 0;
  // The position it resumed at from a snapshot (0: it started at 0): its token blocks below are
  // shared, the prefix cache's, and not counted as its KV use.
  int64_t resumed = 0;
  bool external = false;
  std::vector<int32_t> table;  // the table in use (the chunk's, or the pool's own blocks)
  struct Layer {
    float* comp_state = nullptr;   // kv | score, each comp_n floats; null for ratio 0
    float* index_state = nullptr;  // kv | score, each index_n floats; null without an indexer
    int64_t comp_n = 0, index_n = 0;
  };
  std::vector<Layer> layers;  // pointers into `states`
  float* states = nullptr;    // the allocation of all the layers' states (KvPool's)
};

class KvPool {
 public:
  KvPool() = default;
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool();

  absl::Status Init(const KvLayout& layout, int64_t kv_tokens, int64_t extra_sequences);
  const KvLayout& layout() const { return layout_; }
  const uint8_t* base() const { return pool_; }
  int64_t blocks() const { return n_blocks_; }
  int64_t bytes() const { return n_blocks_ * layout_.block_bytes; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }

  // Validates a batch's tables against the pool (no change): InvalidArgument for a table that
  // is too short or names a block outside the pool, or a batch mixing the coordinator's tables
  // with the built-in allocator's; ResourceExhausted when the built-in allocator lacks blocks.
  // `ends[i]` is chunk i's end position.
  absl::Status Check(std::span<const uint64_t> seq_ids, std::span<const int64_t> ends,
                     std::span<const std::span<const int32_t>> tables) const;

  // A resume snapshot's blocks against the pool (no change): InvalidArgument for fewer than
  // snapshot_blocks blocks or one outside the pool. `what` names the caller's subject.
  absl::Status CheckSnapshot(std::span<const int32_t> blocks, const std::string& what) const;

  // Makes `seq` ready for a chunk ending at `end` (Check passed): its table (the given one, or
  // grown from the free list), its compressor states (a new sequence takes an allocation from
  // the state free list, or allocates one; reset for start == 0). `restore` non-empty (a new
  // sequence resuming at `start`, CheckSnapshot passed, the coordinator's table): the snapshot's
  // window blocks are copied into the table's window blocks and its carried slots into the
  // states (not reset), enqueued on `stream`.
  absl::Status Prepare(uint64_t seq_id, int64_t start, int64_t end, std::span<const int32_t> table,
                       std::span<const int32_t> restore, cudaStream_t stream);

  // Copies `seq`'s window blocks and carried slots into the snapshot `blocks` (CheckSnapshot
  // passed; the caller checked the position), enqueued on `stream` after the steps that wrote
  // them.
  absl::Status SaveSnapshot(const KvSeq& seq, std::span<const int32_t> blocks, cudaStream_t stream);

  KvSeq* Find(uint64_t seq_id);
  const KvSeq* Find(uint64_t seq_id) const;
  const std::map<uint64_t, KvSeq>& seqs() const { return seqs_; }
  // The sequence's blocks and its state allocation go back to the free lists (no device call).
  // Work that still reads them must be ordered before their next use: the backend's one stream.
  void Release(uint64_t seq_id);
  // Releases every sequence and frees the state allocations (cudaFree: the device must be idle).
  void ReleaseAll();

  // State allocations made so far (live sequences' and the free list's).
  int64_t state_allocations() const { return state_allocations_; }

 private:
  void Free(KvSeq& s);
  // The carried slots between a state allocation and a snapshot's blocks (the byte stream of the
  // header comment), one copy per piece and block boundary.
  absl::Status CopyCarry(float* states, std::span<const int32_t> blocks, bool to_snapshot,
                         cudaStream_t stream);

  KvLayout layout_;
  uint8_t* pool_ = nullptr;
  int64_t n_blocks_ = 0;
  std::vector<int32_t> free_;
  std::map<uint64_t, KvSeq> seqs_;
  std::vector<float*> free_states_;  // released sequences' state allocations
  int64_t state_allocations_ = 0;
};

}  // namespace ss::gpu
