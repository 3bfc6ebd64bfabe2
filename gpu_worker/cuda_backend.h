// The `cuda` backend, TP = 1: one pipeline stage's blocks on one GPU, on the device-tested kernels
// of gpu_worker/kernels/, behind the StageBackend interface (backend.h).
//
// Weights. The stage's tensors are copied from the checkpoint's mmap (the Model's views) to the
// device in the checkpoint's own formats: FP8 e4m3 bytes with their ue8m0 block scales, bf16
// matrices (compressors, indexer weights_proj, router gate, LM head), fp32 small parameters.
// The embedding stays in host memory: stage 0 gathers its rows on the host (one row per token,
// ~8 KB each in Flash; the 1 GB table need not take GPU memory). Routed experts are not uploaded.
//
// One block, as model::Model::RunBlock computes it (the operation order and roundings of the
// reference; each kernel's measured agreement is in its header):
//   HcPre + RmsNorm → query path (wq_a, q_norm, wq_b, per-head norm, RoPE), raw KV (wkv, kv_norm,
//   RoPE, FP8 sim) → compressors (CompressorStep, per chunk) → indexer (wq_b, IndexerPrepQ,
//   weights, scores, top-k; CSA layers) → SparseAttention over window + compressed entries →
//   inverse RoPE, grouped wo_a, wo_b → HcPost → HcPre + RmsNorm → Route (GPU) → shared expert
//   (GPU) while the routed experts run on the host → combine → HcPost.
// Residual streams are bf16 on the device ([T, hc, dim]); the interface's fp32 streams hold the
// same (bf16-representable) values, so a PP split changes no bit.
//
// Host parts (correctness first; each costs a synchronisation per layer):
//  * routed experts: the MoE input rows, the router's ids and weights are copied to the host and
//    given to the RoutedExperts provider of the layer (the expert-worker client), or, where the
//    provider is absent, summed by model::RoutedSum on the host's reference weights; the shared
//    expert runs on the GPU meanwhile, and the bf16(routed + shared) combine runs on the host;
//  * CSA layers: the indexer's selections come back to the host to build the candidate lists;
//    every layer's candidate lists (the reference's layout, attention.h) are built on the host;
//  * the embedding gather (stage 0) and the fp32 ↔ bf16 conversion of the interface's streams.
//
// KV state (per sequence, per stage layer, plain cudaMalloc allocations, not pages: block tables
// are ignored for now). One bf16 pool per (sequence, layer):
//   rows [0, W)            the raw-KV window ring (slot = position mod W),
//   rows [W, W + S_cap)    staging: the current chunk's raw KV (a chunk longer than W needs all
//                          of it while the ring keeps only the last W),
//   rows [W + S_cap, ...)  the compressed main-KV entries (ratio > 0),
// so one SparseAttention call per chunk reads every candidate from one pool; indexer keys bf16
// [blocks, index_head_dim] (CSA); compressor streaming states fp32 (both kinds). The staging and
// compressed regions grow by doubling (a reallocation and a copy of the ring and entries) when a
// chunk needs more. Capacity is accounted like the cpu backend: `kv_tokens` positions summed over
// the live sequences; info().kv_bytes estimates the bf16 compressed KV and keys at that capacity.
//
// Threads: the StageBackend methods from one thread at a time (the stage runner's). Everything
// runs on one CUDA stream owned by the backend, on `device`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"

namespace ss::gpu {

struct CudaBackendOptions {
  int stage = 0;
  int num_stages = 1;
  int first_layer = 0;  // [first_layer, end_layer)
  int end_layer = 0;
  int64_t kv_tokens = 0;  // > 0
  int device = 0;         // CUDA device ordinal
  // The routed experts of a layer: experts(layer) when the function is set and returns non-null
  // (it must outlive the backend), otherwise model::RoutedSum on the host (the local reference).
  std::function<const model::RoutedExperts*(int64_t layer)> experts;
  // The compressors' double arithmetic (CompressorShape::fp64); false for GPUs with slow FP64.
  bool compressor_fp64 = true;
};

class CudaBackend final : public StageBackend {
 public:
  // Validates the stage against the model, selects the device and uploads the stage's weights.
  // `model` supplies the config, the weight views (mmap) and the host-side reference parts.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      std::shared_ptr<const model::Model> model, const CudaBackendOptions& options);
  ~CudaBackend() override;

  const ModelConfig& config() const override { return model_->config(); }
  BackendInfo info() const override;
  KvUsage kv_usage() const override;
  absl::Status Check(std::span<const StageChunk> batch) const override;
  absl::Status Run(std::span<const StageChunk> batch, const float* streams_in, StageOutput* out,
                   StageTimings* timings) override;
  void Release(uint64_t seq_id) override;
  void ReleaseAll() override;

  struct Impl;  // device weights, sequences and scratch (cuda_backend.cc)

 private:
  CudaBackend(std::shared_ptr<const model::Model> model, const CudaBackendOptions& options);

  std::shared_ptr<const model::Model> model_;
  const CudaBackendOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ss::gpu
