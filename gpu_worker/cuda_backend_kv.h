// The cuda backend's paged KV cache (issue 5 item 3; ARCHITECTURE.md "Memory"): one device pool
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
// so block_bytes is common/kv_cost_model.h's block_bytes for the stage (kMxfp4 keys). A block
// may instead be a window block: floor(block_bytes / E) window records (the stage layers'
// W-entry rings, layer l's ring slot k at window ordinal l·W + k). A stage without a compressed
// layer (SWA only) gets blocks of all its rings.
//
// A sequence's table: [window_blocks window blocks | token block 0, 1, ...]; a chunk ending at
// position e needs window_blocks + ⌈e/B⌉ entries. The coordinator's tables (StageChunk::
// block_table) start with its fixed blocks (kv_cost_model.h: windows and compressor state,
// counted over the whole pipeline), at least window_blocks of them, so the worker's layout fits
// the tables it is given; a shorter table is an InvalidArgument, never an out-of-bounds write.
// The compressor partial states (fp32, per sequence and layer) are not in the pool: they are
// per-sequence device allocations (as the raw-KV staging of a step is scratch).
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
  };
  int64_t block_tokens = 0, nope = 0, rope = 0, record_bytes = 0, key_dim = 0, key_bytes = 0;
  int64_t window = 0, block_bytes = 0, win_per_block = 0, window_blocks = 0;
  std::vector<Layer> layers;  // index = layer − first_layer

  // fp8_records false: entries stored as bf16 (2·head_dim bytes, nope = 0 in paged_kv.h's
  // terms), for numerics whose nope dims are not FP8-rounded (kv_fp8_sim_rounds off).
  static absl::StatusOr<KvLayout> Create(const ModelConfig& c, int first_layer, int end_layer,
                                         int64_t block_tokens, bool fp8_records = true);
  int64_t BlocksFor(int64_t tokens) const {
    return window_blocks + (tokens + block_tokens - 1) / block_tokens;
  }
  cuda::KvGeom Geom(int l, const uint8_t* pool) const;
};

// One sequence's state outside the records: its table and compressor states.
struct KvSeq {
  int64_t next_pos = 0;
  bool external = false;
  std::vector<int32_t> table;  // the table in use (the chunk's, or the pool's own blocks)
  struct Layer {
    float* comp_state = nullptr;   // kv | score, each comp_n floats
    float* index_state = nullptr;  // kv | score
    int64_t comp_n = 0, index_n = 0;
  };
  std::vector<Layer> layers;
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
  // grown from the free list), its compressor states (created, and reset for start == 0).
  absl::Status Prepare(uint64_t seq_id, int64_t start, int64_t end, std::span<const int32_t> table,
                       cudaStream_t stream);

  KvSeq* Find(uint64_t seq_id);
  const KvSeq* Find(uint64_t seq_id) const;
  const std::map<uint64_t, KvSeq>& seqs() const { return seqs_; }
  void Release(uint64_t seq_id);  // the stream must be idle
  void ReleaseAll();

 private:
  void Free(KvSeq& s);

  KvLayout layout_;
  uint8_t* pool_ = nullptr;
  int64_t n_blocks_ = 0;
  std::vector<int32_t> free_;
  std::map<uint64_t, KvSeq> seqs_;
};

}  // namespace ss::gpu
