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
// pipeline), at least window_blocks of them, so the worker's layout fits the tables it is given;
// a shorter table is an InvalidArgument, never an out-of-bounds write.
//
// Compressor states (fp32 kv | score per compressor, the cost model's state_bytes per sequence)
// are not in the pool: each sequence has ONE device allocation of all its layers' states, carved
// per layer and compressor in layer order (main compressor, then the indexer's), each piece
// starting on a 256-byte boundary. A released sequence's allocation goes to the pool's free list
// and is reused by the next new sequence (reset there, as every sequence's first chunk resets its
// states), so ending a sequence frees no device memory and synchronises nothing; ReleaseAll and
// the destructor free them all.
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

  // fp8_records false: entries stored as bf16 (2·head_dim bytes, nope = 0 in paged_kv.h's
  // terms), for numerics whose nope dims are not FP8-rounded (kv_fp8_sim_rounds off).
  static absl::StatusOr<KvLayout> Create(const ModelConfig& c, int first_layer, int end_layer,
                                         int64_t block_tokens, bool fp8_records = true);
  int64_t BlocksFor(int64_t tokens) const {
    return window_blocks + (tokens + block_tokens - 1) / block_tokens;
  }
  cuda::KvGeom Geom(int l, const uint8_t* pool) const;
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

  // Makes `seq` ready for a chunk ending at `end` (Check passed): its table (the given one, or
  // grown from the free list), its compressor states (a new sequence takes an allocation from
  // the state free list, or allocates one; reset for start == 0).
  absl::Status Prepare(uint64_t seq_id, int64_t start, int64_t end, std::span<const int32_t> table,
                       cudaStream_t stream);

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

  KvLayout layout_;
  uint8_t* pool_ = nullptr;
  int64_t n_blocks_ = 0;
  std::vector<int32_t> free_;
  std::map<uint64_t, KvSeq> seqs_;
  std::vector<float*> free_states_;  // released sequences' state allocations
  int64_t state_allocations_ = 0;
};

}  // namespace ss::gpu
