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
#include "common/expert_store_format.h"
#include "common/model_config.h"

namespace ss::gpu {

// Where one expert's slice lies inside its block of the store, and the slice's geometry
// (common/expert_store_format.h).
using StoreExpertLayout = ExpertStoreGeometry;

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
