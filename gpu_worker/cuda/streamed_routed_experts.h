// The routed experts streamed to the GPU (StreamedRoutedExperts, a RoutedExpertsProvider;
// ARCHITECTURE.md "Where the routed experts run"): for a large prefill step, each layer's experts
// that this rank computes are copied host -> device into a ring of staging slots while earlier
// groups compute, and run as a grouped MXFP4 GEMM (gpu_worker/kernels/mxfp4_moe.h).
//
// The pipeline. A copy stream of its own moves one GROUP of experts (a slot's worth, in the
// layer's expert order) per slot: it waits for the slot's `free` event, copies the group
// (expert_copy_plan.h), records `filled`. The layer's side stream builds the routing and the
// quantised input, then per group waits for `filled`, runs Mxfp4MoeGroup on the slot and records
// `free`; the combine ends the layer. The slots (PlanRing: ~256 MiB each, at least 4, as many as
// the ring holds) are used round-robin across layers and steps. The step's groups form one
// sequence (every streamed layer's, in layer order), and copy i is enqueued as soon as its slot's
// previous user, group i − slots, has its compute enqueued: the first slots' copies at
// PrepareStep, the next layer's first groups' right after this layer's last compute, so they run
// while the next layer's attention does (the host enqueues the attention's kernels after them,
// and is often only a launch queue's depth ahead of the GPU). The copy engine waits only for a
// free slot, which a layer's attention never releases: a ring of more slots copies further
// through it. No host synchronisation inside the layer loop; the copies do not depend on the
// routing (at prefill sizes nearly every expert is routed to).
//
// Sources: a layer's experts come from the expert stores of this rank's slices (ExpertStoreSet,
// mapped read-only, registered with cudaHostRegister so the copies are DMA at full PCIe speed),
// or, for a layer without expert workers, from the model's host weights (unregistered: correct,
// slow; golden tests). With TP > 1 and host weights the rank computes experts
// [rank·E/tp, (rank+1)·E/tp), as HostRoutedExperts does. A layer whose slices are not all in
// stores on this host is not streamable: streams(l) is false, and the backend runs it on the CPU
// path in every step (logged once at creation).
//
// Steps through this provider are never captured into graphs (events across the copy stream).
//
// Threading: as RoutedExpertsProvider. Owned by the backend (CudaBackend::Impl); the stores
// (`stores`) and the model must outlive it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/cuda/device_buffers.h"
#include "gpu_worker/cuda/expert_sources.h"
#include "gpu_worker/cuda/routed_experts_provider.h"
#include "gpu_worker/expert_copy_plan.h"
#include "gpu_worker/expert_store_map.h"
#include "gpu_worker/streamed_prefill.h"

namespace ss::gpu::cuda_backend_internal {

struct StreamedExpertsOptions {
  ExpertSourcesOptions sources;  // the stage's layers, the rank, the stores (expert_sources.h)
  int64_t ring_bytes = 0;        // the staging ring (all slots)
  int64_t slot_bytes = kGpuPrefillSlotBytes;  // a slot's target size (PlanRing)
  int64_t max_rows = 0;  // the workspace is allocated for steps of this many rows at Create
};

class StreamedRoutedExperts final : public RoutedExpertsProvider {
 public:
  // Plans every layer's sources, allocates the ring, registers the stores' memory and measures
  // the pinned host -> device bandwidth. FailedPrecondition when the ring cannot hold
  // kGpuPrefillMinRingSlots slots of one expert, or a layer's geometry is not one the kernels take.
  static absl::StatusOr<std::unique_ptr<StreamedRoutedExperts>> Create(
      const model::Model& model, const StreamedExpertsOptions& options);
  ~StreamedRoutedExperts() override;

  // Whether the stage's layer l (from 0) can stream; why not (for the log) otherwise.
  bool streams(int l) const { return plans_[l].streamable; }
  const std::string& why_not(int l) const { return plans_[l].why_not; }
  // The bytes one (largest) layer's copies move: the policy's layer_bytes.
  int64_t layer_bytes() const { return layer_bytes_; }
  // Pinned host -> device bandwidth measured at creation, bytes per second.
  double h2d_bytes_per_second() const { return h2d_; }
  // One line for the start-up log: layers streamable, bytes per layer, ring, bandwidth.
  std::string Describe() const;

  // Plans the step's group sequence (its n_layers layers that stream) and enqueues the first
  // slots' copies.
  absl::Status PrepareStep(int n_layers, int64_t rows) override;
  // Layer l must be the next streamed layer of the step's sequence (InternalError otherwise).
  absl::Status Enqueue(int l, const cuda::bf16_t* xn, const int32_t* ids, const float* weights,
                       int64_t rows, float* sum, cudaStream_t side) override;
  absl::Status StepStatus(int n_layers) const override { return absl::OkStatus(); }
  double Seconds(int l) const override { return 0.0; }
  void AppendGraphKey(std::vector<int64_t>* key) const override {}

  // After the step's final wait: the bytes copied, the copy engine's busy seconds and the span
  // from the first copy's start to the last layer's end (StageTimings' streamed fields).
  absl::Status FillTimings(StageTimings* t) const;
  // Waits for the copy stream (a failed step's clean-up).
  void Synchronize();

 private:
  struct LayerPlan {
    bool streamable = false;
    std::string why_not;
    LayerStreamPlan plan;
    std::vector<std::pair<int, int>> groups;
    std::vector<std::vector<HostCopy>> copies;  // per group
  };
  StreamedRoutedExperts(const model::Model& model, const StreamedExpertsOptions& options);
  absl::Status PlanLayers();
  absl::Status Allocate();
  absl::Status MeasureBandwidth();
  // The step workspace and the per-group timing events for steps of `rows` rows (grow-only).
  absl::Status ReserveWork(int n_layers, int64_t rows);
  // Enqueues the step's next copies whose slots' previous users have their compute enqueued.
  absl::Status EnqueueCopies();
  int Slot(int64_t i) const { return static_cast<int>((slot0_ + i) % slots_); }

  const model::Model& model_;
  const StreamedExpertsOptions options_;
  std::vector<LayerPlan> plans_;
  int64_t layer_bytes_ = 0, slot_bytes_ = 0, experts_per_slot_ = 0;
  int slots_ = 0;
  double h2d_ = 0.0;
  std::vector<const void*> registered_;  // host ranges registered here, unregistered at the end
  cudaStream_t copy_ = nullptr;
  DevBuf ring_;
  std::vector<cudaEvent_t> free_, filled_;  // per slot
  int64_t slot0_ = 0;  // the slot of the step's first copy (round-robin across steps)
  // The step's groups in order, (layer, group of that layer); copies and computes enqueued.
  std::vector<std::pair<int, int>> seq_;
  int64_t copied_ = 0, computed_ = 0;
  // Per step: timing events around each group's copies and the layer ends.
  std::vector<cudaEvent_t> copy_start_, copy_end_;
  cudaEvent_t step_end_ = nullptr;
  int64_t step_bytes_ = 0;
  int64_t rows_ = 0;
  DevBuf work_;  // routing, xq, h, y for `rows_` rows
};

}  // namespace ss::gpu::cuda_backend_internal
