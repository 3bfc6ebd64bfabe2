// Routed experts resident on the GPU (ResidentRoutedExperts, a RoutedExpertsProvider):
// per layer, the chosen experts that are resident in this GPU's memory run on the GPU with the
// grouped MXFP4 kernels (gpu_worker/kernels/mxfp4_moe.h), the other choices go to the host path
// (HostRoutedExperts: the expert workers, which skip the resident ones as model::kSkippedExpert
// and read none of their weights), and the GPU's part is added to the host's sum.
//
// Layer l with r resident experts (ascending ids, at slots 0..r−1 of the layer's device buffer,
// each laid out as DeviceExpertLayout of its sources, expert_sources.h), in the side stream's
// order:
//   SplitResidentRoutes(ids) -> each choice's slot (−1: not resident) and the host's ids
//   fork to a stream of its own: FakeQuantE4m3, MoeBuildRouting over the slots,
//     Mxfp4MoeGroup over slots [0, r) -> per-route outputs
//   the host path with the host's ids -> sum (its D2H, host call and H2D, meanwhile)
//   join: MoeCombineRoutes(accumulate) adds the resident routes to sum in ascending id
// So sum is the host experts' sum plus the resident ones' in ascending id: the reference's
// routed sum up to the fp32 summation order. A step of more than `max_rows` rows (a prefill
// chunk: its workspace would be large, and nearly every expert is chosen anyway) and a layer
// without resident experts go to the host path whole. Under TP a rank keeps only its resident
// experts' slices (expert_sources.h: its parts of each expert from the stores; from host weights
// only the experts of its range, the others dropped from its set).
//
// The weights are copied at Create, before the KV pool is fitted; the set is fixed for the
// object's life. Everything Enqueue enqueues is stream work with an event fork and join, so steps
// are captured into graphs like the host path's.
//
// Threading: as RoutedExpertsProvider. Owned by the backend; the model and the stores must
// outlive it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "gpu_worker/cuda/device_buffers.h"
#include "gpu_worker/cuda/expert_sources.h"
#include "gpu_worker/cuda/routed_experts_provider.h"

namespace ss::gpu::cuda_backend_internal {

struct ResidentExpertsOptions {
  ExpertSourcesOptions sources;  // the stage's layers, the rank, the stores (expert_sources.h)
  // Per stage layer, the expert ids to keep resident (any order; duplicates and ids outside
  // [0, E) are refused).
  std::vector<std::vector<int32_t>> resident;
  int64_t max_rows = 256;  // larger steps take the host path whole
  // Optional: called (from a host function on the side stream, one layer at a time) with the
  // choices of `layer` that the resident experts served, so that routing counts (expert_heat.h)
  // see them as the host path's client sees the others.
  std::function<void(int64_t layer, const int32_t* ids, int64_t n)> count_resident;
};

class ResidentRoutedExperts final : public RoutedExpertsProvider {
 public:
  // Copies the resident experts' weights to the device. `host` takes every choice that is not
  // resident. InvalidArgument for a bad set; FailedPrecondition for a layer with resident
  // experts whose sources the kernels cannot take (naming the layer and why).
  static absl::StatusOr<std::unique_ptr<ResidentRoutedExperts>> Create(
      const model::Model& model, const ResidentExpertsOptions& options,
      std::unique_ptr<RoutedExpertsProvider> host);
  ~ResidentRoutedExperts() override;

  // Resident experts of this rank in all, and their device bytes.
  int64_t experts() const { return experts_; }
  int64_t bytes() const { return static_cast<int64_t>(weights_.cap); }
  // Per stage layer, the choices the resident path has seen and those it served on the GPU
  // (its steps only; read after a step's final wait: a synchronous copy). Logged at the end.
  struct LayerHits {
    uint64_t choices = 0, resident = 0;
  };
  absl::StatusOr<std::vector<LayerHits>> Hits() const;

  absl::Status PrepareStep(int n_layers, int64_t rows) override;
  absl::Status Enqueue(int l, const cuda::bf16_t* xn, const int32_t* ids, const float* weights,
                       int64_t rows, float* sum, cudaStream_t side) override;
  absl::Status StepStatus(int n_layers) const override { return host_->StepStatus(n_layers); }
  double Seconds(int l) const override { return host_->Seconds(l); }
  void AppendGraphKey(std::vector<int64_t>* key) const override;

 private:
  struct Layer {
    int count = 0;         // resident experts on this rank
    int64_t offset = 0;    // of slot 0 in weights_
    LayerStreamPlan plan;  // sources and layout
  };
  ResidentRoutedExperts(const model::Model& model, std::unique_ptr<RoutedExpertsProvider> host);
  absl::Status Load(const ResidentExpertsOptions& o);
  absl::Status ReserveWork(int64_t rows);
  // count_resident's host function: the resident choices of the layer's copied ids.
  struct CountCall {
    ResidentRoutedExperts* self = nullptr;
    int64_t layer = 0, n = 0;
  };
  static void CUDART_CB CountResident(void* call);
  // The workspace's dimensions: the most resident experts of a layer, the widest expert here.
  int max_count() const;
  int64_t max_inter() const;

  const model::Model& model_;
  std::unique_ptr<RoutedExpertsProvider> host_;
  int64_t max_rows_ = 0, experts_ = 0;
  std::vector<Layer> layers_;
  DevBuf weights_;  // every layer's resident experts
  DevBuf slot_of_;  // [layers, E] int32
  DevBuf hits_;     // [layers, 2] unsigned long long: SplitResidentRoutes' counts
  DevBuf work_;     // slots, host ids, routing, xq, h, y for rows_ rows
  int64_t rows_ = 0;
  bool step_resident_ = false;  // this step's rows <= max_rows_
  std::function<void(int64_t, const int32_t*, int64_t)> count_resident_;
  std::vector<std::unique_ptr<CountCall>> count_calls_;  // per layer; fixed addresses (graphs)
  PinnedBuf count_ids_, count_host_;  // a layer's ids and host ids, [max_rows, K]
  std::vector<int32_t> counted_;      // the host function's scratch
  cudaStream_t gpu_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
};

}  // namespace ss::gpu::cuda_backend_internal
