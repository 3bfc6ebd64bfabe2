// The `cpu` backend: the reference model (common/model) behind the StageBackend interface, so
// the whole distributed system runs without GPUs (tests, CI, laptops, debugging). Its arithmetic
// is the reference's own: a stage computes its layers with Model::RunBlock, so splitting the
// layers over pipeline stages changes no bit, and routed experts served by expert workers that
// return the reference's routed sum (RoutedExperts) change none either.
//
// State. Each sequence is a model::SequenceState (per-layer vectors, not pages: block tables
// are ignored); only the stage's layers are touched. Capacity is `kv_tokens` positions summed
// over the live sequences; `kv_bytes` is an estimate of what the stage's compressed KV and
// indexer keys take at that capacity. A resume snapshot (backend.h) is kept as a copy of the
// whole sequence state at its position, by snapshot id (this backend has no paged pool to hold it
// in), until DropSnapshot.
//
// Threads: the StageBackend methods from one thread at a time (the stage runner's); the model
// parallelises each block internally with OpenMP.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/routed_experts_client.h"

namespace ss::gpu {

struct CpuBackendOptions {
  int stage = 0;
  int num_stages = 1;
  int first_layer = 0;  // [first_layer, end_layer)
  int end_layer = 0;
  int64_t kv_tokens = 0;                    // > 0
  std::vector<LayerExpertsConfig> experts;  // layers absent or without endpoints: local
  ExpertClientOptions expert_client;
};

class CpuBackend final : public StageBackend {
 public:
  // Validates the layer range against the model and connects the expert workers.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(
      std::shared_ptr<const model::Model> model, const CpuBackendOptions& options);

  const ModelConfig& config() const override { return model_->config(); }
  BackendInfo info() const override { return info_; }
  KvUsage kv_usage() const override;
  absl::Status Check(std::span<const StageChunk> batch) const override;
  absl::Status Run(std::span<const StageChunk> batch, const float* streams_in, StageOutput* out,
                   StageTimings* timings) override;
  absl::Status SaveSnapshot(uint64_t seq_id, int64_t position, uint64_t snapshot_id,
                            std::span<const int32_t> blocks) override;
  void DropSnapshot(uint64_t snapshot_id) override { snapshots_.erase(snapshot_id); }
  void Release(uint64_t seq_id) override {
    sequences_.erase(seq_id);
    resumed_.erase(seq_id);
  }
  void ReleaseAll() override {
    sequences_.clear();
    resumed_.clear();
  }

 private:
  CpuBackend(std::shared_ptr<const model::Model> model, const CpuBackendOptions& options);

  std::shared_ptr<const model::Model> model_;
  const CpuBackendOptions options_;
  std::unique_ptr<RoutedExpertsClient> experts_;
  BackendInfo info_;
  std::map<uint64_t, model::SequenceState> sequences_;
  std::map<uint64_t, int64_t> resumed_;                 // sequence -> the position it resumed at
  std::map<uint64_t, model::SequenceState> snapshots_;  // by snapshot id
};

}  // namespace ss::gpu
