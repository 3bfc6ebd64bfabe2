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
//   fork to a stream of its own: at decode (T·K <= kMxfp4MoeDecodeMaxRoutes) Mxfp4MoeDecode over
//     the slots, else FakeQuantE4m3, MoeBuildRouting over the slots and Mxfp4MoeGroup over slots
//     [0, r) -> per-route outputs
//   the host path with the host's ids -> sum (its D2H, host call and H2D, meanwhile)
//   join: MoeCombineRoutes(accumulate) adds the resident routes to sum in ascending id
// So sum is the host experts' sum plus the resident ones' in ascending id: the reference's
// routed sum up to the fp32 summation order. A step of more than `max_rows` rows (a prefill
// chunk: its workspace would be large, and nearly every expert is chosen anyway) and a layer
// without resident experts go to the host path whole. Under TP a rank keeps only its resident
// experts' slices (expert_sources.h: its parts of each expert from the stores; from host weights
// only the experts of its range, the others dropped from its set).
//
// The weights are copied at Create, before the KV pool is fitted. With a rebalance interval
// (options.rebalance) an ExpertRebalancer (expert_rebalancer.h) moves the set while serving: Stage
// copies the promoted experts' weights host -> staging buffer on a low-priority stream of their
// own (the steps go on meanwhile); the next PrepareStep after the copies finished, between steps,
// copies each one device-to-device into its evicted expert's slot and updates the layer's slot
// table, on the resident stream, and waits for that (tens of microseconds a swap). A layer keeps
// its number of residents; its slots are then no longer in ascending id order, which changes only
// the fp32 order in which MoeCombineRoutes adds the resident routes. Everything Enqueue enqueues
// is stream work with an event fork and join, so steps are captured into graphs like the host
// path's (the slot table and the weights keep their addresses).
//
// Threading: as RoutedExpertsProvider; the ResidentExpertMover methods from any thread (the
// rebalancer's). Owned by the backend; the model, the stores and the heat must outlive it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "gpu_worker/cuda/device_buffers.h"
#include "gpu_worker/cuda/expert_sources.h"
#include "gpu_worker/cuda/routed_experts_provider.h"
#include "gpu_worker/expert_heat.h"
#include "gpu_worker/expert_rebalancer.h"
#include "gpu_worker/resident_budget.h"

namespace ss::gpu::cuda_backend_internal {

struct ResidentExpertsOptions {
  ExpertSourcesOptions sources;  // the stage's layers, the rank, the stores (expert_sources.h)
  // Per stage layer, the expert ids to keep resident (any order; duplicates and ids outside
  // [0, E) are refused).
  std::vector<std::vector<int32_t>> resident;
  int64_t max_rows = 256;  // larger steps take the host path whole
  // Optional: the expert path's statistics. The resident path counts the choices it serves by
  // expert on the device (SplitResidentRoutes) and adds them to `heat` (path kGpu) whenever
  // heat->Refresh() is called; with rebalance.interval > 0 those counts also drive the rebalance
  // while serving, whose moves are added to its rebalance counters. `max_swaps` experts per round
  // (a staging buffer of that many experts on the device).
  std::shared_ptr<ExpertHeat> heat;
  RebalanceOptions rebalance;
  int max_swaps = kRebalanceSwaps;
};

class ResidentRoutedExperts final : public RoutedExpertsProvider, public ResidentExpertMover {
 public:
  // Copies the resident experts' weights to the device. `host` takes every choice that is not
  // resident. InvalidArgument for a bad set; FailedPrecondition for a layer with resident
  // experts whose sources the kernels cannot take (naming the layer and why).
  static absl::StatusOr<std::unique_ptr<ResidentRoutedExperts>> Create(
      const model::Model& model, const ResidentExpertsOptions& options,
      std::unique_ptr<RoutedExpertsProvider> host);
  ~ResidentRoutedExperts() override;

  // Resident experts of this rank in all, and their device bytes (with the rebalance's staging
  // buffer).
  int64_t experts() const { return experts_; }
  int64_t bytes() const { return static_cast<int64_t>(weights_.cap + staging_.cap); }
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
  // For a step it serves (rows <= max_rows): 1 - its resident experts' share of the stage's,
  // the share an even router leaves to the host (a skewed one, placed by frequency, leaves less);
  // else 1.
  double HostShare(int64_t rows) const override;
  void AppendGraphKey(std::vector<int64_t>* key) const override;

  // ResidentExpertMover (the rebalance).
  ResidentSet Current() const override;
  std::pair<int32_t, int32_t> Range(int layer) const override;
  int max_swaps() const override { return max_swaps_; }
  absl::StatusOr<bool> Stage(const std::vector<ExpertSwap>& swaps) override;

 private:
  struct Layer {
    int count = 0;         // resident experts on this rank
    int64_t offset = 0;    // of slot 0 in weights_
    LayerStreamPlan plan;  // sources and layout
  };
  ResidentRoutedExperts(const model::Model& model, std::unique_ptr<RoutedExpertsProvider> host);
  absl::Status Load(const ResidentExpertsOptions& o);
  absl::Status ReserveWork(int64_t rows);
  absl::Status SetUpCounts(const ResidentExpertsOptions& o);
  absl::Status SetUpRebalance(const ResidentExpertsOptions& o);
  absl::Status CheckSwaps(const std::vector<ExpertSwap>& swaps) const;  // under move_mu_
  // Between steps: the staged swaps whose copies finished take their slots.
  absl::Status ApplyStaged();
  // heat_'s source: adds the device's per-expert counts since the last call.
  void PullCounts();

  const model::Model& model_;
  std::unique_ptr<RoutedExpertsProvider> host_;
  int64_t max_rows_ = 0, experts_ = 0;
  int first_layer_ = 0, device_ = 0;
  // The workspace's dimensions: the most resident experts of a layer, the widest expert here.
  int max_count_ = 0;
  int64_t max_inter_ = 1, max_expert_bytes_ = 0;
  std::vector<Layer> layers_;
  DevBuf weights_;  // every layer's resident experts
  DevBuf slot_of_;  // [layers, E] int32
  DevBuf hits_;     // [layers, 2] unsigned long long: SplitResidentRoutes' counts
  DevBuf work_;     // slots, host ids, routing, xq, h, y for rows_ rows
  int64_t rows_ = 0;
  bool step_resident_ = false;    // this step's rows <= max_rows_
  DevBuf expert_counts_;          // [layers, E] unsigned long long: resident choices
  PinnedBuf pulled_host_;         // PullCounts' copy of them
  std::vector<uint64_t> pulled_;  // what heat_ has of them
  cudaStream_t pull_ = nullptr;   // PullCounts' copies
  std::mutex pull_mu_;
  cudaStream_t gpu_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;

  // The rebalance. move_mu_ guards the slot tables, sets_ and pending_.
  struct Pending {
    int layer = 0;  // stage layer index
    int32_t evict = 0, promote = 0;
  };
  mutable std::mutex move_mu_;
  std::vector<std::vector<int32_t>> sets_;  // per stage layer, the expert in each slot
  PinnedBuf slot_host_;                     // the host's copy of slot_of_
  std::vector<Pending> pending_;            // staged, copies on copy_ until staged_
  std::shared_ptr<ExpertHeat> heat_;
  int max_swaps_ = 0;
  DevBuf staging_;  // max_swaps_ experts of max_expert_bytes_
  cudaStream_t copy_ = nullptr;
  cudaEvent_t staged_ = nullptr;
  std::unique_ptr<ExpertRebalancer> rebalancer_;  // stopped first at destruction
};

}  // namespace ss::gpu::cuda_backend_internal
