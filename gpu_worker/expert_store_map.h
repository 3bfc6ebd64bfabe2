// The GPU worker's read-only view of an expert worker's store (ARCHITECTURE.md "Where the routed
// experts run": one copy of the experts in host RAM). An expert worker that serves shared-memory
// calls under the segment NAME keeps its store (cpu_expert_worker/expert_store.h) in a second
// POSIX shared-memory segment, ExpertStoreSegmentName(NAME), whose format is
// common/expert_store_format.h; a GPU worker on the same host maps it read-only, registers it
// with CUDA and copies experts from it to the device by DMA (the streamed path).
//
// Open validates everything the copies rely on before anything is read: magic, format version,
// the header's own size, a complete store (the writer sets the magic last), an owner that is
// alive, the geometry against the model (dim, I, E, slice), every layer's and expert's bytes
// inside the mapping. Errors: NotFound when there is no such segment (the worker keeps its store
// private, or is gone), FailedPrecondition (with the path and the reason) for anything else.
//
// Threads: a map is immutable after Open; every accessor may be called from any thread. The
// mapping stays valid while the object lives, even after the expert worker exits (the pages
// stay until the last mapping goes); a restarted expert worker makes a new segment, which a
// worker sees only by opening it again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace ss::gpu {

// Where one expert's slice lies inside its block of the store, and the slice's geometry: the
// layout of cpu_expert_worker/kernels/expert_kernels.h ExpertSliceView, as byte offsets.
struct StoreExpertLayout {
  int64_t dim = 0;
  int64_t inter = 0;        // I, the whole expert's
  int64_t inter_slice = 0;  // I/n, what the store holds of each expert
  int slice_index = 0, slice_count = 1;
  int64_t tile_rows = 0;     // 0, 8 or 16 (ExpertSliceView::tile_rows)
  int64_t num_experts = 0;   // E
  int64_t expert_stride = 0;  // bytes between consecutive experts' blocks (layer-major, expert
                              // blocks of one layer consecutive)
  int64_t w1 = 0, w1_scale = 0, w3 = 0, w3_scale = 0, w2 = 0, w2_scale = 0;  // offsets in a block
  int64_t w2_stride = 0;        // bytes between w2 rows (tile_rows 0), inter_slice/2
  int64_t w2_scale_stride = 0;  // inter_slice/32
};

// Where one layer's routed experts are served for this TP rank (the GPU worker's --experts /
// the coordinator's Role, gpu_worker/routed_experts_client.h): its slices in slice order, each
// the shared-memory segment name of its expert worker, or "" for a slice served over gRPC.
// Empty `shm_names` with slice_count > 0: none of the layer's slices is this rank's.
struct ExpertLayerStores {
  std::vector<std::string> shm_names;
  int slice_count = 0;
};

// "<shm_name>-store".
std::string ExpertStoreSegmentName(std::string_view shm_name);

class ExpertStoreMap {
 public:
  static absl::StatusOr<std::unique_ptr<ExpertStoreMap>> Open(const std::string& segment_name,
                                                              const ModelConfig& model);
  ~ExpertStoreMap();
  ExpertStoreMap(const ExpertStoreMap&) = delete;
  ExpertStoreMap& operator=(const ExpertStoreMap&) = delete;

  const std::string& name() const { return name_; }
  const StoreExpertLayout& layout() const { return layout_; }
  // The block of expert e of `layer` (a model layer id as the store numbers them), or nullptr
  // when the store does not hold that layer.
  const uint8_t* expert(int layer, int64_t e) const;
  // The whole mapping (page-aligned), for cudaHostRegister.
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  ExpertStoreMap() = default;
  std::string name_;
  StoreExpertLayout layout_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::vector<int64_t> layer_offset_;  // [layer id] -> offset of its expert 0, or -1
};

// The stores of one rank's layers, each distinct segment opened once (ExpertStoreMap::Open on
// ExpertStoreSegmentName of each shm name). A layer is STREAMABLE when every slice of it that
// is this rank's has a store that holds the layer (or the rank has none of its slices: its
// share is zero). For a layer that is not, reason(layer) says why (a gRPC slice, a missing
// store: the NotFound's message, a store without the layer) and slices(layer) is empty.
// Errors other than NotFound (a corrupt or mismatching store) fail Open.
class ExpertStoreSet {
 public:
  static absl::StatusOr<std::unique_ptr<ExpertStoreSet>> Open(
      const std::map<int64_t, ExpertLayerStores>& layers, const ModelConfig& model);

  bool streamable(int64_t layer) const;
  // This rank's slices of `layer` in slice order (streamable layers; may be empty).
  const std::vector<const ExpertStoreMap*>& slices(int64_t layer) const;
  const std::string& reason(int64_t layer) const;  // "" when streamable
  // Every distinct map, for registration with CUDA.
  std::vector<const ExpertStoreMap*> maps() const;

 private:
  ExpertStoreSet() = default;
  std::vector<std::unique_ptr<ExpertStoreMap>> maps_;
  std::map<int64_t, std::vector<const ExpertStoreMap*>> slices_;
  std::map<int64_t, std::string> reasons_;
};

}  // namespace ss::gpu
