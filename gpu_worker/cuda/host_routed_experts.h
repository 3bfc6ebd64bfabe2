// The routed experts on the host (HostRoutedExperts, a RoutedExpertsProvider): per MoE layer, on
// the side stream, a HostCallPublish (kernels/host_call.h) that writes the normed MoE input rows
// (bf16), the router's ids and weights into pinned buffers and rings the layer's flag; the
// HostCallServer's thread (host_call_server.h) gives them to the layer's model::RoutedExperts
// (`experts(layer)`: the expert-worker client) or, where that is absent, sums them with
// model::RoutedSum on the host's reference weights, and answers; a HostCallAwait waits for that
// answer and reads the fp32 sum back (a large sum: a copy after it). All of it is stream work, so
// a captured graph replays it too. With TP > 1 and no `experts`, the rank computes experts
// [rank·E/TP, (rank+1)·E/TP) of every token (the router's other choices masked).
//
// A failed layer fails the step with its error; the step's later host calls are skipped
// (Cancelled) and its kernels run to the end. A host call unanswered for 600 s fails the step
// (DeadlineExceeded) instead of hanging the GPU.
//
// Ownership: the model and `experts` must outlive the object; the per-layer call records and the
// flags and buffers the kernels take stay at fixed addresses for the object's life.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/model/model.h"
#include "gpu_worker/cuda/device_buffers.h"
#include "gpu_worker/cuda/host_call_server.h"
#include "gpu_worker/cuda/routed_experts_provider.h"

namespace ss::gpu::cuda_backend_internal {

// One MoE layer's host call, served on the host call server's thread: the layer and the step's
// rows in (set before every step's launch), its outcome and host seconds out (read after the
// step's final wait).
struct HostExpertsCall {
  int64_t layer = 0, rows = 0;
  absl::Status status;
  double seconds = 0.0;
};

class HostRoutedExperts final : public RoutedExpertsProvider {
 public:
  // Layers are numbered from first_layer (the stage's first) in the model.
  HostRoutedExperts(const model::Model& model,
                    const std::function<const model::RoutedExperts*(int64_t layer)>& experts,
                    int first_layer, int tp, int rank);

  absl::Status PrepareStep(int n_layers, int64_t rows) override;
  absl::Status Enqueue(int l, const cuda::bf16_t* xn, const int32_t* ids, const float* weights,
                       int64_t rows, float* sum, cudaStream_t side) override;
  absl::Status StepStatus(int n_layers) const override;
  double Seconds(int l) const override { return calls_[l]->seconds; }
  void AppendGraphKey(std::vector<int64_t>* key) const override;

 private:
  // The host half of one layer for `rows` rows: the pinned MoE input, ids and weights to the
  // pinned fp32 sum. Runs on the server's thread (no CUDA calls).
  absl::Status Compute(int64_t layer, int64_t rows);
  void Serve(int l);  // the server's work for stage layer l: calls_[l]

  static constexpr int kMaxHostCalls = 1024;  // stage layers

  const model::Model& model_;
  const std::function<const model::RoutedExperts*(int64_t layer)>& experts_;
  const int first_layer_, tp_, rank_;
  std::vector<std::unique_ptr<HostExpertsCall>> calls_;  // one per layer, grow-only
  std::atomic<bool> failed_{false};                      // a layer of this step failed
  std::vector<float> host_x_;  // the MoE input rows as fp32, for the provider
  // [T, dim] bf16 rows, [T, k] ids and weights, [T, dim] fp32 sum.
  PinnedBuf moe_x_, moe_ids_, moe_w_, moe_sum_;
  DevBuf arrivals_;                         // HostCallPublish's block counter
  std::unique_ptr<HostCallServer> server_;  // created at the first step; stopped first
};

}  // namespace ss::gpu::cuda_backend_internal
