#include "gpu_worker/golden_backend.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_worker/backend.h"

#if SS_HAVE_CPU_BACKEND
#include "gpu_worker/cpu_backend.h"
#include "gpu_worker/routed_experts_client.h"
#include "gpu_worker/worker_config.h"
#endif
#if SS_HAVE_CUDA
#include <cuda_runtime.h>

#include "gpu_worker/cuda_backend.h"
#endif

namespace ss::gpu {
namespace {

#if SS_HAVE_CPU_BACKEND || SS_HAVE_CUDA
// A StageBackend as a golden stage; chunks' ids become the interface's int32 tokens.
class Stage final : public golden::GoldenStage {
 public:
  explicit Stage(std::unique_ptr<StageBackend> b) : b_(std::move(b)) {}

  absl::Status Run(std::span<const golden::GoldenChunk> chunks, const float* streams_in,
                   std::vector<float>* streams, std::vector<std::vector<float>>* logits) override {
    std::vector<std::vector<int32_t>> ids(chunks.size());
    std::vector<StageChunk> batch;
    for (size_t i = 0; i < chunks.size(); ++i) {
      ids[i].assign(chunks[i].tokens, chunks[i].tokens + chunks[i].n);
      batch.push_back({chunks[i].seq_id, chunks[i].start, ids[i], /*samples=*/true, {}});
    }
    StageOutput out;
    RETURN_IF_ERROR(b_->Run(batch, streams_in, &out, nullptr));
    if (streams != nullptr) *streams = std::move(out.streams);
    if (logits != nullptr) *logits = std::move(out.logits);
    return absl::OkStatus();
  }
  void Release(uint64_t seq_id) override { b_->Release(seq_id); }

 private:
  std::unique_ptr<StageBackend> b_;
};

struct Layout {
  int stage, num_stages, first_layer, end_layer;
};
Layout BlockLayout(const model::Model& m, int64_t layer) {
  const int n = static_cast<int>(m.config().n_layers), l = static_cast<int>(layer);
  return {l + 1, n + 2, l, l + 1};
}
Layout ModelLayout(const model::Model& m) {
  return {0, 1, 0, static_cast<int>(m.config().n_layers)};
}

// A golden backend whose stages are one backend's stages: a block check is a one-layer stage in
// the middle of a pipeline (streams in, streams out), a whole-model check one stage of all layers.
class StagedGolden : public golden::GoldenBackend {
 public:
  absl::StatusOr<std::unique_ptr<golden::GoldenStage>> BlockStage(
      std::shared_ptr<const model::Model> m, int64_t layer) override {
    const Layout l = BlockLayout(*m, layer);
    return Make(std::move(m), l);
  }
  absl::StatusOr<std::unique_ptr<golden::GoldenStage>> ModelStage(
      std::shared_ptr<const model::Model> m) override {
    const Layout l = ModelLayout(*m);
    return Make(std::move(m), l);
  }

 private:
  virtual absl::StatusOr<std::unique_ptr<golden::GoldenStage>> Make(
      std::shared_ptr<const model::Model> m, const Layout& l) = 0;
};
#endif

#if SS_HAVE_CPU_BACKEND
class CpuGolden final : public StagedGolden {
 public:
  explicit CpuGolden(std::vector<LayerExpertsConfig> experts) : experts_(std::move(experts)) {}
  std::string name() const override { return "cpu"; }

 private:
  absl::StatusOr<std::unique_ptr<golden::GoldenStage>> Make(std::shared_ptr<const model::Model> m,
                                                            const Layout& l) override {
    CpuBackendOptions o;
    o.stage = l.stage;
    o.num_stages = l.num_stages;
    o.first_layer = l.first_layer;
    o.end_layer = l.end_layer;
    o.kv_tokens = kGoldenKvTokens;
    for (const LayerExpertsConfig& e : experts_) {
      if (e.layer >= l.first_layer && e.layer < l.end_layer) o.experts.push_back(e);
    }
    ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> b, CpuBackend::Create(std::move(m), o));
    return std::make_unique<Stage>(std::move(b));
  }
  const std::vector<LayerExpertsConfig> experts_;
};
#endif

#if SS_HAVE_CUDA
class CudaGolden final : public StagedGolden {
 public:
  CudaGolden(int device, std::string experts)
      : device_(device), experts_spec_(std::move(experts)) {}
  std::string name() const override { return "cuda"; }

 private:
  absl::StatusOr<std::unique_ptr<golden::GoldenStage>> Make(std::shared_ptr<const model::Model> m,
                                                            const Layout& l) override {
    CudaBackendOptions o;
    o.stage = l.stage;
    o.num_stages = l.num_stages;
    o.first_layer = l.first_layer;
    o.end_layer = l.end_layer;
    o.kv_tokens = kGoldenKvTokens;
    o.device = device_;
#if SS_HAVE_CPU_BACKEND
    if (!experts_spec_.empty()) {
      // One expert-worker client per model (the variants' models get their own), kept for the
      // life of this backend: the stages hold pointers to it.
      auto it = clients_.find(m.get());
      if (it == clients_.end()) {
        ASSIGN_OR_RETURN(std::vector<LayerExpertsConfig> layers, ParseExpertsSpec(experts_spec_));
        ASSIGN_OR_RETURN(std::unique_ptr<RoutedExpertsClient> c,
                         RoutedExpertsClient::Connect(*m, layers));
        it = clients_.emplace(m.get(), std::make_pair(m, std::move(c))).first;
      }
      const RoutedExpertsClient* c = it->second.second.get();
      o.experts = [c](int64_t layer) -> const model::RoutedExperts* {
        return c->remote(layer) ? c : nullptr;
      };
    }
#endif
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b, CudaBackend::Create(std::move(m), o));
    return std::make_unique<Stage>(std::move(b));
  }
  const int device_;
  const std::string experts_spec_;
#if SS_HAVE_CPU_BACKEND
  std::map<const model::Model*,
           std::pair<std::shared_ptr<const model::Model>, std::unique_ptr<RoutedExpertsClient>>>
      clients_;
#endif
};
#endif

}  // namespace

absl::StatusOr<std::shared_ptr<golden::GoldenBackend>> MakeGoldenBackend(
    const GoldenBackendOptions& o) {
  if (o.backend == "reference") {
    if (!o.experts.empty()) {
      return absl::InvalidArgumentError(
          "--experts needs --backend cpu or cuda (the reference computes its routed experts "
          "itself)");
    }
    return nullptr;
  }
  if (o.backend != "cpu" && o.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend ", o.backend, ": expected reference, cpu or cuda"));
  }
#if SS_HAVE_CPU_BACKEND
  std::vector<LayerExpertsConfig> experts;
  if (!o.experts.empty()) {
    ASSIGN_OR_RETURN(experts, ParseExpertsSpec(o.experts));
  }
#else
  if (!o.experts.empty()) {
    return absl::UnimplementedError(
        "--experts: this build has no expert-worker client (configured with "
        "SS_BUILD_SERVICES=OFF)");
  }
#endif
  if (o.backend == "cpu") {
#if SS_HAVE_CPU_BACKEND
    return std::make_shared<CpuGolden>(std::move(experts));
#else
    return absl::UnimplementedError(
        "--backend cpu: this build has no cpu backend (it is part of the services build; "
        "configured with SS_BUILD_SERVICES=OFF)");
#endif
  }
#if SS_HAVE_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || o.cuda_device < 0 || o.cuda_device >= n) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend cuda: no CUDA device ", o.cuda_device, " (",
        e == cudaSuccess ? absl::StrCat(n, " devices") : std::string(cudaGetErrorString(e)), ")"));
  }
  return std::make_shared<CudaGolden>(o.cuda_device, o.experts);
#else
  return absl::UnimplementedError(
      "--backend cuda: this build has no CUDA (no CUDA compiler at configure time)");
#endif
}

}  // namespace ss::gpu
