// Where the routed experts of a stage's layers come from when the GPU computes them (the streamed
// path, streamed_routed_experts.h, and the resident experts, resident_routed_experts.h): per
// layer, the host addresses and the device layout of every expert this rank computes
// (LayerStreamPlan, expert_copy_plan.h), or why the GPU cannot compute the layer.
//
// A layer served by expert workers takes its experts from their stores on this host (every slice
// this rank computes, `stores`); another layer from the model's host weights (whole experts in
// the checkpoint layout; with TP > 1 the rank computes experts [rank·E/tp, (rank+1)·E/tp), as
// HostRoutedExperts does).
//
// Threads: values; the model and the stores must outlive the plans (they hold their addresses).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "gpu_worker/expert_copy_plan.h"
#include "gpu_worker/expert_store_map.h"
#include "gpu_worker/kernels/mxfp4_moe.h"

namespace ss::gpu::cuda_backend_internal {

struct ExpertSourcesOptions {
  int first_layer = 0, end_layer = 0;  // the stage's layers (model ids)
  int tp = 1, rank = 0;
  const ExpertStoreSet* stores = nullptr;  // null: every layer from the model's host weights
  // Layers served by expert workers: their sources must be stores (`stores` null: none usable).
  // Other layers use the model's host weights.
  std::vector<int64_t> remote_layers;
};

struct LayerSources {
  bool usable = false;  // the kernels can compute the layer's experts from these sources
  std::string why_not;  // when not usable
  LayerStreamPlan plan;
};

// One entry per layer of [first_layer, end_layer).
std::vector<LayerSources> PlanLayerSources(const model::Model& model,
                                           const ExpertSourcesOptions& options);

// The kernels' view of an expert laid out as `plan` puts it on the device.
cuda::Mxfp4ExpertLayout DeviceExpertLayout(const LayerStreamPlan& plan);

// One layer's grouped-MoE workspace (mxfp4_moe.h) for T rows of K choices over E experts of
// `inter` rows here: the routing, the quantised input xq [T, dim], the activations h [T·K, inter]
// and the per-route outputs y [T·K, dim], then `extra` int32 values for the caller, carved from
// one arena of MoeWorkspaceBytes (256-byte aligned parts).
struct MoeWorkspace {
  cuda::MoeRouting routing;
  cuda::bf16_t* xq = nullptr;
  cuda::bf16_t* h = nullptr;
  float* y = nullptr;
  int32_t* extra = nullptr;
};
int64_t MoeWorkspaceBytes(int64_t T, int K, int E, int64_t dim, int64_t inter, int64_t extra);
MoeWorkspace CarveMoeWorkspace(void* arena, int64_t T, int K, int E, int64_t dim, int64_t inter,
                               int64_t extra);

}  // namespace ss::gpu::cuda_backend_internal
