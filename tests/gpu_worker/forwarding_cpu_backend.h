// A StageBackend over a cpu backend that forwards its calls (the snapshots keep StageBackend's
// defaults): a test's wrapper derives from it and overrides only what it changes.
#pragma once

#include <memory>
#include <span>
#include <utility>

#include "gpu_worker/cpu_backend.h"

namespace ss::gpu::testing_util {

class ForwardingCpuBackend : public StageBackend {
 public:
  explicit ForwardingCpuBackend(std::unique_ptr<CpuBackend> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  BackendInfo info() const override { return inner_->info(); }
  KvUsage kv_usage() const override { return inner_->kv_usage(); }
  absl::Status Check(std::span<const StageChunk> b) const override { return inner_->Check(b); }
  absl::Status Run(std::span<const StageChunk> b, const float* in, StageOutput* out,
                   StageTimings* t) override {
    return inner_->Run(b, in, out, t);
  }
  void Release(uint64_t id) override { inner_->Release(id); }
  void ReleaseAll() override { inner_->ReleaseAll(); }

 protected:
  std::unique_ptr<CpuBackend> inner_;
};

}  // namespace ss::gpu::testing_util
