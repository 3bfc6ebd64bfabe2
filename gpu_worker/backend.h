// The GPU worker's backend interface: one pipeline stage's share of a micro-batch, behind which
// the `cpu` backend (the reference model, cpu_backend.h) and the `cuda` backend (kernels/) sit.
//
// A backend owns the stage's weights and its sequences' KV state. The stage runner
// (stage_runner.h) drives it, one micro-batch at a time, from ONE thread:
//
//   Check(batch)                          validates without changing anything
//   Run(batch, streams_in, &out, &t)      embeds (stage 0) or takes streams_in, runs the stage's
//                                         layers, and leaves the next stage's input streams
//                                         (non-last) or the sampling rows' logits (last) in out
//   Release(seq_id)                       frees a sequence
//   SaveSnapshot(seq_id, position, blocks) copies a sequence's resume state (prefix caching)
//
// Run is all-or-nothing for the sequences' positions: on success every chunk's sequence
// advances to start + tokens; on failure the sequences of the batch are dropped (their state
// may hold a partial update), so a later chunk for them must start again at 0 — the
// coordinator fails a micro-batch's requests when a step fails, so none follows.
//
// A chunk with start == 0 begins (or restarts) its sequence; any other start must equal the
// sequence's next position, or, for a chunk with `restore_snapshot`, the sequence is new and
// resumes at `start` from that snapshot. KV capacity is counted in tokens (the sum of the live
// sequences' positions less what they resumed from a snapshot, which shared cached blocks hold);
// a batch that would exceed it is refused by Check.
//
// Resume snapshots (prefix caching, ARCHITECTURE.md "Prefix cache"). To continue a sequence at a
// block boundary N (a multiple of the KV block size B, itself a multiple of every compress ratio)
// the compressed entries and indexer keys below N are in the sequence's token blocks, which the
// coordinator shares between sequences with the same first N tokens, and two more things are
// needed that no token block holds: the window rings (the raw KV of positions N-W .. N-1) and the
// ratio-4 compressors' "previous group" slots (positions N-4 .. N-1, spec §3.7: the main
// compressor's and the indexer's, kv and score). Ratio-128 compressors carry nothing across a
// multiple of 128: every slot is written again before the next emission. Recomputing the window
// would need the layers' inputs at those positions, i.e. everything before them, so the state is
// snapshotted instead: SaveSnapshot copies it into KvCostModel::snapshot_blocks pool blocks
// (laid out as the stage's window blocks, then the carried slots: for every ratio-4 layer of the
// stage in order, main kv slots 0..3, main score slots 0..3, indexer kv 0..3, indexer score 0..3,
// fp32, as one byte stream over the remaining blocks) and a chunk with restore_snapshot copies it
// back into the new sequence's own window blocks and compressor state before running. The result
// is the state a sequence computed from position 0 has at N, bit for bit.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/model_config.h"

namespace ss::gpu {

// One sequence's share of a micro-batch (proto SeqChunk without the sampling parameters).
struct StageChunk {
  uint64_t seq_id = 0;
  int64_t start = 0;
  std::span<const int32_t> tokens;
  bool samples = false;
  std::span<const int32_t> block_table;  // unused by the cpu backend
  // Non-empty: the sequence is new and resumes at `start` from the snapshot in these blocks (see
  // the header comment); block_table's token blocks below `start` are shared and read only.
  std::span<const int32_t> restore_snapshot;
  uint64_t restore_snapshot_id = 0;  // its name (SaveSnapshot's snapshot_id)
  // The fixed blocks at the head of block_table (the pipeline's: at least this stage's window
  // blocks); token block j is block_table[table_fixed_blocks + j]. 0: exactly this stage's.
  int64_t table_fixed_blocks = 0;
  // With `samples`: the chunk's token is the plain argmax of its logits (sampler.h
  // IsPlainGreedy, no allowed mask, no banned ids), so the last stage may return that token
  // (StageOutput::tokens) instead of the logits. Backends may ignore it.
  bool greedy = false;
};

// How a step's layers ran on the device (StageTimings::graph).
enum class StepGraph {
  kNone,      // not under CUDA graphs (the cpu backend, graphs off, a streamed step)
  kLaunched,  // launched one by one: a step shape seen for the first time
  kCaptured,  // captured (its second sight), then launched as a graph
  kReplayed,  // the captured graph launched again
};

// Wall seconds of a stage run, per layer of the stage (index = layer - first_layer).
struct StageTimings {
  // Set by the caller: false leaves the per-layer vectors empty, and the backend records no
  // per-layer timing marks (the cuda backend's marks are event nodes inside the step's graph).
  bool layers = true;
  std::vector<double> attention, moe_gpu, moe_cpu, allreduce;
  // Where the step's routed experts ran (gpu_worker/streamed_prefill.h): streamed to the GPU
  // (then the bytes copied host -> device, the copy engine's busy seconds -- the sum of the
  // copies' durations -- and the seconds from the first copy's start to the last expert
  // group's end) or on the CPU expert workers. gpu_prefill_threshold: the rows from which a
  // step streams, as the policy stands after this step (INT64_MAX: never; 0: no streamed path).
  bool experts_streamed = false;
  int64_t streamed_bytes = 0;
  double streamed_copy_seconds = 0.0;
  double streamed_span_seconds = 0.0;
  int64_t gpu_prefill_threshold = 0;
  StepGraph graph = StepGraph::kNone;
};

struct StageOutput {
  int64_t rows = 0;            // tokens of the batch
  int64_t width = 0;           // hc_mult * dim
  std::vector<float> streams;  // non-last stage: [rows, width] fp32, the next stage's input
  // RunDevice, non-last stage: the next stage's input as bf16 [rows, width] in the backend's
  // device memory, valid until its next Run (`streams` is then left empty).
  const void* device_streams = nullptr;
  std::vector<std::vector<float>> logits;  // last stage: [vocab] per chunk with `samples`
  // Last stage, optional (empty, or one per chunk with `samples`): the token of a `greedy`
  // chunk whose logits are all finite and not all -inf, the lowest id of the largest logit --
  // its logits row may then be empty --, else -1 (its logits are given).
  std::vector<int32_t> tokens;
};

struct BackendInfo {
  std::string device;        // "cpu", or the GPU's name
  int64_t weight_bytes = 0;  // the stage's weights resident on the device
  int64_t kv_tokens = 0;     // KV capacity in tokens
  int64_t kv_bytes = 0;      // bytes of the KV pool (an estimate for the cpu backend)
};

struct KvUsage {
  int64_t used_tokens = 0;
  int64_t capacity_tokens = 0;
  int64_t sequences = 0;
};

class StageBackend {
 public:
  virtual ~StageBackend() = default;

  virtual const ModelConfig& config() const = 0;
  virtual BackendInfo info() const = 0;
  virtual KvUsage kv_usage() const = 0;

  // InvalidArgument naming the sequence for: an empty chunk, a token id outside the vocabulary,
  // a start that is neither 0 nor the sequence's next position (an unknown or failed sequence
  // has none), a sequence twice in one batch, a position past the model's context;
  // ResourceExhausted when the batch would exceed the KV capacity.
  virtual absl::Status Check(std::span<const StageChunk> batch) const = 0;

  // Runs the stage (see the header comment). `streams_in` is [T, hc*dim] fp32 for a stage > 0
  // (rows in chunk order) and ignored on stage 0. `timings` is optional.
  virtual absl::Status Run(std::span<const StageChunk> batch, const float* streams_in,
                           StageOutput* out, StageTimings* timings) = 0;

  // Run for the `nccl` stage transport (stage_link.h), where the streams stay in device memory:
  // `streams_in` (stage > 0) is bf16 [T, hc*dim] in this backend's device memory, and a non-last
  // stage leaves its output at out->device_streams. Backends without device streams (the cpu
  // backend) answer Unimplemented.
  virtual absl::Status RunDevice(std::span<const StageChunk> batch, const void* streams_in,
                                 StageOutput* out, StageTimings* timings) {
    (void)batch, (void)streams_in, (void)out, (void)timings;
    return absl::UnimplementedError(
        "this backend keeps no streams on a device: the nccl stage transport needs the cuda "
        "backend");
  }

  // Copies `seq_id`'s resume state into `blocks` (see the header comment), after a successful Run
  // that left the sequence at `position`. InvalidArgument for an unknown sequence, a position
  // that is not its next one or not a positive multiple of the block size, or too few blocks.
  // `snapshot_id` names it for a later restore (StageChunk::restore_snapshot_id) or drop.
  virtual absl::Status SaveSnapshot(uint64_t seq_id, int64_t position, uint64_t snapshot_id,
                                    std::span<const int32_t> blocks) {
    (void)seq_id, (void)position, (void)snapshot_id, (void)blocks;
    return absl::UnimplementedError("this backend keeps no resume snapshots (prefix caching)");
  }
  // Snapshot `snapshot_id` will not be restored again. Backends that keep snapshots in their pool
  // have nothing to do.
  virtual void DropSnapshot(uint64_t snapshot_id) { (void)snapshot_id; }

  // Frees a sequence's state (unknown ids are ignored).
  virtual void Release(uint64_t seq_id) = 0;
  // Frees every sequence (a new step stream starts with none: cluster.proto).
  virtual void ReleaseAll() = 0;
};

// The stage a backend is created for: stage < num_stages, layers [first_layer, end_layer) inside
// the model, stage 0 starting at layer 0, the last stage ending at the last layer, a positive KV
// capacity. InvalidArgument naming the value.
absl::Status CheckStageLayout(const ModelConfig& config, int stage, int num_stages,
                              int64_t first_layer, int64_t end_layer, int64_t kv_tokens);

// The checks every backend's Check() makes, in the same words: `next_pos(seq_id)` is the
// sequence's next position, or -1 for a sequence the backend holds no state for; `used_tokens`
// the KV tokens the live sequences hold, `capacity_tokens` the backend's KV capacity. A chunk
// with restore_snapshot must be for a sequence the backend does not hold, at start > 0.
absl::Status CheckBatch(const ModelConfig& config, std::span<const StageChunk> batch,
                        int64_t used_tokens, int64_t capacity_tokens,
                        absl::FunctionRef<int64_t(uint64_t)> next_pos);

}  // namespace ss::gpu
