#include "gpu_worker/golden_backend.h"

#include <map>
#include <thread>
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

#include "gpu_worker/cuda/cuda_backend.h"
#include "gpu_worker/nccl_comm.h"
#endif

namespace ss::gpu {
namespace {

#if SS_HAVE_CPU_BACKEND
// gRPC expert workers refuse calls without the cluster token: $SPLITSERVE_CLUSTER_TOKEN when set
// (shared-memory endpoints need none; a gRPC one without it answers UNAUTHENTICATED).
ClusterCredential ExpertCredential() {
  absl::StatusOr<ClusterCredential> c = ClusterCredential::Load("", false);
  return c.ok() ? *c : ClusterCredential();
}
#endif

#if SS_HAVE_CPU_BACKEND || SS_HAVE_CUDA
// The golden chunks as a backend batch: every chunk samples; `ids` holds the int32 tokens the
// batch's spans point into.
std::vector<StageChunk> ToBatch(std::span<const golden::GoldenChunk> chunks,
                                std::vector<std::vector<int32_t>>* ids) {
  ids->assign(chunks.size(), {});
  std::vector<StageChunk> batch;
  for (size_t i = 0; i < chunks.size(); ++i) {
    (*ids)[i].assign(chunks[i].tokens, chunks[i].tokens + chunks[i].n);
    batch.push_back({chunks[i].seq_id, chunks[i].start, (*ids)[i], /*samples=*/true, {}, {}, 0});
  }
  return batch;
}

// A StageBackend as a golden stage; chunks' ids become the interface's int32 tokens.
class Stage final : public golden::GoldenStage {
 public:
  explicit Stage(std::unique_ptr<StageBackend> b) : b_(std::move(b)) {}

  absl::Status Run(std::span<const golden::GoldenChunk> chunks, const float* streams_in,
                   std::vector<float>* streams, std::vector<std::vector<float>>* logits) override {
    std::vector<std::vector<int32_t>> ids;
    const std::vector<StageChunk> batch = ToBatch(chunks, &ids);
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

// Pipeline stages run one after the other: each one's streams are the next one's input.
class PipelineStage final : public golden::GoldenStage {
 public:
  explicit PipelineStage(std::vector<std::unique_ptr<golden::GoldenStage>> stages)
      : stages_(std::move(stages)) {}

  absl::Status Run(std::span<const golden::GoldenChunk> chunks, const float* streams_in,
                   std::vector<float>* streams, std::vector<std::vector<float>>* logits) override {
    std::vector<float> in, out;
    const float* cur = streams_in;
    for (size_t s = 0; s + 1 < stages_.size(); ++s) {
      RETURN_IF_ERROR(stages_[s]->Run(chunks, cur, &out, nullptr));
      in = std::move(out);
      cur = in.data();
    }
    return stages_.back()->Run(chunks, cur, streams, logits);
  }
  void Release(uint64_t seq_id) override {
    for (auto& s : stages_) s->Release(seq_id);
  }

 private:
  std::vector<std::unique_ptr<golden::GoldenStage>> stages_;
};

// A golden backend whose stages are one backend's stages: a block check is a one-layer stage in
// the middle of a pipeline (streams in, streams out), a whole-model check one stage of all layers
// (or `stages` pipeline stages of them).
class StagedGolden : public golden::GoldenBackend {
 public:
  explicit StagedGolden(int stages) : stages_(stages) {}

  absl::StatusOr<std::unique_ptr<golden::GoldenStage>> BlockStage(
      std::shared_ptr<const model::Model> m, int64_t layer) override {
    const Layout l = BlockLayout(*m, layer);
    return Make(std::move(m), l);
  }
  absl::StatusOr<std::unique_ptr<golden::GoldenStage>> ModelStage(
      std::shared_ptr<const model::Model> m) override {
    if (stages_ == 1) {
      const Layout l = ModelLayout(*m);
      return Make(std::move(m), l);
    }
    const int n = static_cast<int>(m->config().n_layers);
    if (stages_ > n) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stages ", stages_, " exceeds the model's ", n, " layers"));
    }
    std::vector<std::unique_ptr<golden::GoldenStage>> stages;
    for (int s = 0; s < stages_; ++s) {
      const Layout l{s, stages_, n * s / stages_, n * (s + 1) / stages_};
      ASSIGN_OR_RETURN(std::unique_ptr<golden::GoldenStage> st, Make(m, l));
      stages.push_back(std::move(st));
    }
    return std::make_unique<PipelineStage>(std::move(stages));
  }

 protected:
  const int stages_;

 private:
  virtual absl::StatusOr<std::unique_ptr<golden::GoldenStage>> Make(
      std::shared_ptr<const model::Model> m, const Layout& l) = 0;
};
#endif

#if SS_HAVE_CPU_BACKEND
class CpuGolden final : public StagedGolden {
 public:
  CpuGolden(std::vector<LayerExpertsConfig> experts, int stages)
      : StagedGolden(stages), experts_(std::move(experts)) {}
  std::string name() const override {
    return stages_ == 1 ? "cpu" : absl::StrCat("cpu, PP ", stages_);
  }

 private:
  absl::StatusOr<std::unique_ptr<golden::GoldenStage>> Make(std::shared_ptr<const model::Model> m,
                                                            const Layout& l) override {
    CpuBackendOptions o;
    o.stage = l.stage;
    o.num_stages = l.num_stages;
    o.first_layer = l.first_layer;
    o.end_layer = l.end_layer;
    o.kv_tokens = kGoldenKvTokens;
    o.expert_client.credential = ExpertCredential();
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
using TpGroup = std::vector<std::unique_ptr<NcclComm>>;

// The TP ranks of one stage: each Run runs every rank on its own thread (their collectives meet)
// and returns rank 0's output.
class TpStage final : public golden::GoldenStage {
 public:
  TpStage(std::shared_ptr<TpGroup> group, std::vector<std::unique_ptr<StageBackend>> ranks)
      : group_(std::move(group)), ranks_(std::move(ranks)) {}

  absl::Status Run(std::span<const golden::GoldenChunk> chunks, const float* streams_in,
                   std::vector<float>* streams, std::vector<std::vector<float>>* logits) override {
    std::vector<std::vector<int32_t>> ids;
    const std::vector<StageChunk> batch = ToBatch(chunks, &ids);
    const size_t n = ranks_.size();
    std::vector<StageOutput> out(n);
    std::vector<absl::Status> status(n);
    std::vector<std::thread> threads;
    for (size_t r = 0; r < n; ++r) {
      threads.emplace_back(
          [&, r] { status[r] = ranks_[r]->Run(batch, streams_in, &out[r], nullptr); });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : status) RETURN_IF_ERROR(s);
    if (streams != nullptr) *streams = std::move(out[0].streams);
    if (logits != nullptr) *logits = std::move(out[0].logits);
    return absl::OkStatus();
  }
  void Release(uint64_t seq_id) override {
    for (auto& r : ranks_) r->Release(seq_id);
  }

 private:
  std::shared_ptr<TpGroup> group_;  // outlives the ranks (declared first, destroyed last)
  std::vector<std::unique_ptr<StageBackend>> ranks_;
};

class CudaGolden final : public StagedGolden {
 public:
  CudaGolden(int device, int device_count, const GoldenBackendOptions& o)
      : StagedGolden(o.stages),
        device_(device),
        device_count_(device_count),
        experts_spec_(o.experts),
        tp_(o.tp),
        fp64_sums_(o.fp64_sums),
        threshold_(o.gpu_prefill_threshold),
        ring_bytes_(o.gpu_prefill_ring_bytes),
        slot_bytes_(o.gpu_prefill_slot_bytes),
        indexer_scores_bytes_(o.indexer_scores_bytes),
        gpu_experts_(o.gpu_experts) {}
  std::string name() const override {
    std::string n = "cuda";
    if (tp_ > 1) absl::StrAppend(&n, ", TP ", tp_);
    if (stages_ > 1) absl::StrAppend(&n, ", PP ", stages_);
    if (fp64_sums_ != Fp64Sums::kAuto)
      absl::StrAppend(&n, ", fp64_sums ", Fp64SumsName(fp64_sums_));
    if (threshold_.mode != GpuPrefillThreshold::Mode::kOff)
      absl::StrAppend(&n, ", routed experts streamed from ", threshold_.ToString(), " rows");
    if (gpu_experts_ > 0) absl::StrAppend(&n, ", ", gpu_experts_, " experts a layer resident");
    return n;
  }

 private:
  absl::StatusOr<std::unique_ptr<golden::GoldenStage>> Make(std::shared_ptr<const model::Model> m,
                                                            const Layout& l) override {
    // Pipeline stage s (block stages: 0), rank r on (device + s·tp + r) mod device_count.
    const int s = stages_ > 1 && l.num_stages == stages_ ? l.stage : 0;
    std::vector<int> devices;
    for (int r = 0; r < tp_; ++r) devices.push_back((device_ + s * tp_ + r) % device_count_);
    std::shared_ptr<TpGroup> group;
    if (tp_ > 1) {
      auto it = groups_.find(devices);
      if (it == groups_.end()) {
        ASSIGN_OR_RETURN(TpGroup g, NcclComm::CreateGroup(devices));
        it = groups_.emplace(devices, std::make_shared<TpGroup>(std::move(g))).first;
      }
      group = it->second;
    }
    std::vector<std::unique_ptr<StageBackend>> ranks;
    for (int r = 0; r < tp_; ++r) {
      ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b,
                       MakeRank(m, l, r, devices[r], group ? (*group)[r].get() : nullptr));
      ranks.push_back(std::move(b));
    }
    if (tp_ == 1) return std::make_unique<Stage>(std::move(ranks[0]));
    return std::make_unique<TpStage>(group, std::move(ranks));
  }

  absl::StatusOr<std::unique_ptr<CudaBackend>> MakeRank(std::shared_ptr<const model::Model> m,
                                                        const Layout& l, int rank, int device,
                                                        NcclComm* comm) {
    CudaBackendOptions o;
    o.stage = l.stage;
    o.num_stages = l.num_stages;
    o.first_layer = l.first_layer;
    o.end_layer = l.end_layer;
    o.kv_tokens = kGoldenKvTokens;
    o.device = device;
    o.tp_rank = rank;
    o.tp_size = tp_;
    o.comm = comm;
    o.fp64_sums = fp64_sums_;
    o.gpu_prefill_threshold = threshold_;
    o.gpu_prefill_ring_bytes = ring_bytes_;
    o.gpu_prefill_slot_bytes = slot_bytes_;
    o.indexer_scores_bytes = indexer_scores_bytes_;
    const int E = static_cast<int>(m->config().n_routed_experts);
    const int n = std::min(gpu_experts_, E);
    for (int layer = l.first_layer; layer < l.end_layer && n > 0; ++layer) {
      std::vector<int32_t> ids;
      for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>(int64_t{i} * E / n));
      o.resident_experts.push_back(std::move(ids));
    }
#if SS_HAVE_CPU_BACKEND
    if (!experts_spec_.empty()) {
      // One expert-worker client per (model, rank) -- the variants' models get their own --, kept
      // for the life of this backend: the stages hold pointers to it. Each rank holds its slices.
      const auto key = std::make_pair(m.get(), rank);
      auto it = clients_.find(key);
      if (it == clients_.end()) {
        ASSIGN_OR_RETURN(std::vector<LayerExpertsConfig> layers, ParseExpertsSpec(experts_spec_));
        ExpertClientOptions co;
        co.tp_rank = rank;
        co.tp_size = tp_;
        co.credential = ExpertCredential();
        ASSIGN_OR_RETURN(
            std::unique_ptr<RoutedExpertsClient> c,
            RoutedExpertsClient::Connect(*m, ExpertSlicesForRank(layers, rank, tp_), co));
        it = clients_.emplace(key, std::make_pair(m, std::move(c))).first;
      }
      const RoutedExpertsClient* c = it->second.second.get();
      o.experts = [c](int64_t layer) -> const model::RoutedExperts* {
        return c->remote(layer) ? c : nullptr;
      };
      ASSIGN_OR_RETURN(std::vector<LayerExpertsConfig> layers, ParseExpertsSpec(experts_spec_));
      o.expert_stores = ExpertStoresOf(ExpertSlicesForRank(layers, rank, tp_));
    }
#endif
    return CudaBackend::Create(std::move(m), o);
  }
  const int device_;
  const int device_count_;
  const std::string experts_spec_;
  const int tp_;
  const Fp64Sums fp64_sums_;
  const GpuPrefillThreshold threshold_;
  const int64_t ring_bytes_;
  const int64_t slot_bytes_;
  const int64_t indexer_scores_bytes_;
  const int gpu_experts_;
  std::map<std::vector<int>, std::shared_ptr<TpGroup>> groups_;  // TP > 1, by device list
#if SS_HAVE_CPU_BACKEND
  std::map<std::pair<const model::Model*, int>,
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
  if (o.tp < 1 || o.tp > 8 || (o.tp > 1 && o.backend != "cuda")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp ", o.tp, ": expected 1, or 2..8 with --backend cuda"));
  }
  if (o.stages < 1 || o.stages > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--stages ", o.stages, ": expected 1..64"));
  }
  if (o.gpu_experts < 0 || (o.gpu_experts > 0 && o.backend != "cuda")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_experts ", o.gpu_experts, ": expected 0, or > 0 with --backend cuda"));
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
    return std::make_shared<CpuGolden>(std::move(experts), o.stages);
#else
    return absl::UnimplementedError(
        "--backend cpu: this build has no cpu backend (it is part of the services build; "
        "configured with SS_BUILD_SERVICES=OFF)");
#endif
  }
#if SS_HAVE_CUDA
  if (o.tp > 1 && !NcclComm::Available()) {
    return absl::UnimplementedError(
        absl::StrCat("--tp ", o.tp, ": this build has no NCCL (cmake/nccl.cmake)"));
  }
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || o.cuda_device < 0 || o.cuda_device + o.tp > n) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend cuda: no CUDA devices ", o.cuda_device, "..", o.cuda_device + o.tp - 1, " (",
        e == cudaSuccess ? absl::StrCat(n, " devices") : std::string(cudaGetErrorString(e)), ")"));
  }
  return std::make_shared<CudaGolden>(o.cuda_device, n, o);
#else
  return absl::UnimplementedError(
      "--backend cuda: this build has no CUDA (no CUDA compiler at configure time)");
#endif
}

}  // namespace ss::gpu
