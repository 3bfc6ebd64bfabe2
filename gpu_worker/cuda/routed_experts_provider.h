// Where a step's routed experts run (RoutedExpertsProvider): the MoE sublayer (moe_layer.h) hands
// a layer's normed MoE input and the router's choices to the provider on the routed experts' side
// stream, and the provider leaves the fp32 sum of the routed experts in the device buffer given,
// in that stream's order; the shared expert runs on the step's stream meanwhile, and the combine
// waits for the side stream. Everything a provider enqueues is captured into the step's graph
// like the rest of the step, so Enqueue must enqueue the same work for the same arguments.
//
// Implementations: HostRoutedExperts (host_routed_experts.h: the rows to the host, the
// expert-worker client or the host's reference weights on a host thread, the sum back).
//
// Threading: PrepareStep, Enqueue, StepStatus and Seconds from the step's thread, one step at a
// time; what Enqueue enqueues runs in stream order. Owned by the backend (CudaBackend::Impl).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gpu_worker/kernels/types.h"

namespace ss::gpu::cuda_backend_internal {

class RoutedExpertsProvider {
 public:
  virtual ~RoutedExpertsProvider() = default;

  // Before a step of `rows` rows through `n_layers` layers is enqueued (never under capture):
  // buffers sized, per-layer results reset.
  virtual absl::Status PrepareStep(int n_layers, int64_t rows) = 0;
  // Layer l (of the stage's layers, from 0) on `side`, after the router's launch there: the
  // rows' bf16 MoE input `xn` [rows, dim], the router's expert ids and weights [rows, K] in,
  // the fp32 sum [rows, dim] of this rank's share of the routed experts out to `sum`.
  virtual absl::Status Enqueue(int l, const cuda::bf16_t* xn, const int32_t* ids,
                               const float* weights, int64_t rows, float* sum,
                               cudaStream_t side) = 0;
  // After the step's final wait: the error of a failed layer (the first one's; later layers
  // only report that they were skipped), OK when all ran.
  virtual absl::Status StepStatus(int n_layers) const = 0;
  // After the step's final wait: the host seconds layer l's experts took (StageTimings::moe_cpu).
  virtual double Seconds(int l) const = 0;
  // The share of a step of `rows` rows' routed choices that this provider sends to the host (the
  // rest it computes on the GPU), as the streamed path's rule and its CPU rate take it: 1 for the
  // host path.
  virtual double HostShare(int64_t rows) const {
    (void)rows;
    return 1.0;
  }
  // The addresses Enqueue's launches take from the provider (its buffers), appended to the step's
  // graph key (graph_cache.h) in a fixed order.
  virtual void AppendGraphKey(std::vector<int64_t>* key) const = 0;
};

}  // namespace ss::gpu::cuda_backend_internal
