// The expert store: this worker's slice of the routed experts of its layers, copied out of the
// checkpoint into node-local memory (ARCHITECTURE.md "The MoE call", "Memory").
//
// What is held. Worker i of n holds, for every routed expert of every requested layer, rows
// [i·I/n, (i+1)·I/n) of w1 and w3 (with their ue8m0 scale rows) and the same columns of w2 (with
// the matching scale columns), I = moe_intermediate_size. I/n must be a multiple of 128 (the
// activation-quantisation block of w2's input must not straddle two workers). The bytes are the
// checkpoint's own MXFP4 nibbles and 1-byte scales, unconverted, stored COMPACT per expert:
//   w1 [I/n, dim/2]  w1_scale [I/n, dim/32]  w3 (same)  w3_scale (same)
//   w2 [dim, I/n/2]  w2_scale [dim, I/n/32]      (each piece 64-byte aligned)
// so the views have w2_stride = I/n/2 and w2_scale_stride = I/n/32, and the memory held is the
// slice's bytes plus < 6·64 bytes of padding per expert.
//
// Layers. Ids 0..n_layers-1 are the model's blocks (`layers.<l>.ffn.experts.<e>.*`), ids
// n_layers + k the MTP blocks (`mtp.<k>.ffn.experts.<e>.*`); every block is MoE. A list with an
// id outside [0, n_layers + n_mtp_layers) or a repeated id is refused.
//
// Loading. The checkpoint's shards are mmap'ed (ss::Checkpoint); every tensor is checked for
// dtype and shape first (errors name the tensor and file). The copy runs as one task per
// (layer, expert) on the given pool, whose threads are pinned to the node, so each page is
// first touched there; the destination is one NodeMemory bound to the node when asked. Source
// pages are dropped from this process's mapping as soon as they are copied and the checkpoint
// is closed at the end, so after Load the resident memory is about the slice's bytes. Progress,
// the load rate (GB/s of slice bytes), which memory holds the store, how much of it huge pages
// back and the kernel setting that decides it (HugePagePolicy, with the command that allows
// them where it does not) are logged with spdlog.
//
// Dummy weights (source.load_format dummy: only config.json is read). No checkpoint is built:
// each (layer, expert) task generates that expert's six whole tensors (FillDummyTensor, so the
// bytes MakeDummyCheckpoint would give them) into its thread's scratch and copies them with the
// same slicing/tiling code as above, so memory stays at the slice's bytes plus one expert per
// thread, and the store equals a real load of the same dummy checkpoint written to safetensors.
//
// Threads: Load runs on the calling thread and the pool (it calls pool->ParallelFor, so not from
// inside a task of that pool). A loaded store is immutable; all accessors may be called from any
// thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "common/thread_pool.h"
#include "common/weight_source.h"
#include "cpu_expert_worker/kernels/expert_kernels.h"
#include "cpu_expert_worker/numa.h"

namespace ss::expert {

struct ExpertStoreOptions {
  // The model directory (config.json + model*.safetensors, single or sharded), the load format
  // (dummy: every expert generated in place, nothing read) and the config overrides.
  WeightSource source;
  std::vector<int> layers;  // layer ids (see above), any order, no repeats, not empty
  int slice_index = 0;      // i in [0, n)
  int slice_count = 1;      // n >= 1
  // The node to bind the copy to (OS index), with the topology that knows it; node -1 or a null
  // topology: no binding, placement by first touch alone.
  const NumaTopology* topology = nullptr;
  int numa_node = -1;
  // 0: w1, w3 and w2 row-major as in the checkpoint. 8 or 16: tiled (ExpertSliceView::
  // tile_rows), the order the kernel with tiles of that height reads them (ExpertKernel::
  // tile_rows), one sequential stream a call. Needs I/n and dim to be multiples of it.
  int64_t tile_rows = 0;
  // Empty: the store lives in this process's anonymous memory. A segment name (with or without
  // the leading '/'): in that POSIX shared-memory segment, laid out as common/
  // expert_store_format.h (header, layer table, then the same blocks), so a GPU worker on the
  // host can map it read-only (gpu_worker/expert_store_map.h). Created exclusively (a dead
  // owner's leftover is reclaimed, a live owner's refused: AlreadyExists naming the PID), filled
  // like anonymous memory, marked complete after the last byte is copied, and unlinked when the
  // store is destroyed.
  std::string shm_name;
};

class ExpertStore {
 public:
  // Validates the options against the checkpoint's config, then copies. `pool` may be null (the
  // calling thread copies alone). Errors: InvalidArgument for a bad layer list or slice (naming
  // the values), the loader's errors for missing or malformed tensors, ResourceExhausted when
  // the memory cannot be mapped.
  static absl::StatusOr<std::unique_ptr<ExpertStore>> Load(const ExpertStoreOptions& options,
                                                           ThreadPool* pool);

  const ModelConfig& config() const { return config_; }
  int64_t dim() const { return config_.dim; }
  int64_t inter() const { return config_.moe_inter_dim; }  // I, the whole expert's
  int64_t inter_slice() const { return inter_slice_; }     // I/n, what this worker holds
  int64_t num_experts() const { return config_.n_routed_experts; }
  int slice_index() const { return slice_index_; }
  int64_t tile_rows() const { return tile_rows_; }  // ExpertStoreOptions::tile_rows
  int slice_count() const { return slice_count_; }
  const std::vector<int>& layers() const { return layers_; }  // in the order given
  int64_t max_layer_id() const { return config_.n_layers + config_.n_mtp_layers - 1; }

  // The slices of `layer`'s routed experts, [num_experts()] indexed by expert id, or nullptr when
  // this store does not hold the layer.
  const ExpertSliceView* layer_views(int layer) const;

  // Bytes of one expert's slice (w1, w3, w2 nibbles and scales, no padding) and of all held.
  int64_t expert_slice_bytes() const { return expert_slice_bytes_; }
  int64_t slice_bytes() const {
    return expert_slice_bytes_ * num_experts() * static_cast<int64_t>(layers_.size());
  }
  int64_t allocated_bytes() const { return static_cast<int64_t>(memory_.size()); }
  bool memory_bound() const { return memory_.bound(); }  // bound to the requested node
  // Bytes of the store that transparent huge pages back now (NodeMemory::HugePageBytes: reads
  // /proc/self/smaps, so not for a hot path); -1 when unreadable.
  int64_t huge_page_bytes() const { return memory_.HugePageBytes(); }
  // The shared-memory segment holding the store (leading '/'), or "" for anonymous memory.
  const std::string& shm_name() const { return memory_.shm_name(); }
  double load_seconds() const { return load_seconds_; }

 private:
  ExpertStore() = default;

  ModelConfig config_;
  int slice_index_ = 0, slice_count_ = 1;
  int64_t tile_rows_ = 0;
  int64_t inter_slice_ = 0, expert_slice_bytes_ = 0;
  std::vector<int> layers_;
  std::vector<int> layer_pos_;  // [n_layers + n_mtp_layers] -> index into views_, or -1
  std::vector<std::vector<ExpertSliceView>> views_;
  NodeMemory memory_;
  double load_seconds_ = 0.0;
};

}  // namespace ss::expert
