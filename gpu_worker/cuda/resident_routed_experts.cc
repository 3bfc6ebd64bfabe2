#include "gpu_worker/cuda/resident_routed_experts.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/load_progress.h"
#include "common/status.h"
#include "gpu_worker/cuda_status.h"
#include "gpu_worker/kernels/mxfp4_moe.h"
#include "gpu_worker/kernels/mxfp4_moe_decode.h"
#include "gpu_worker/memory_plan.h"
#include "spdlog/spdlog.h"

namespace ss::gpu::cuda_backend_internal {
namespace {}  // namespace

ResidentRoutedExperts::ResidentRoutedExperts(const model::Model& model,
                                             std::unique_ptr<RoutedExpertsProvider> host)
    : model_(model), host_(std::move(host)) {}

ResidentRoutedExperts::~ResidentRoutedExperts() {
  rebalancer_.reset();
  if (heat_ != nullptr) {
    heat_->SetSource(nullptr);
    if (pull_ != nullptr) PullCounts();  // the last steps' counts
  }
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
  if (gpu_ != nullptr) cudaStreamSynchronize(gpu_);
  if (absl::StatusOr<std::vector<LayerHits>> h = Hits(); h.ok() && experts_ > 0) {
    uint64_t all = 0, gpu = 0;
    for (const LayerHits& l : *h) {
      all += l.choices;
      gpu += l.resident;
    }
    spdlog::info(
        "resident experts: {} of {} routed choices of the resident path's steps served "
        "on the GPU ({:.1f}%)",
        gpu, all, all > 0 ? 100.0 * static_cast<double>(gpu) / all : 0.0);
  }
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  if (join_ != nullptr) cudaEventDestroy(join_);
  if (staged_ != nullptr) cudaEventDestroy(staged_);
  if (gpu_ != nullptr) cudaStreamDestroy(gpu_);
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
  if (pull_ != nullptr) cudaStreamDestroy(pull_);
}

absl::StatusOr<std::unique_ptr<ResidentRoutedExperts>> ResidentRoutedExperts::Create(
    const model::Model& model, const ResidentExpertsOptions& options,
    std::unique_ptr<RoutedExpertsProvider> host) {
  std::unique_ptr<ResidentRoutedExperts> p(new ResidentRoutedExperts(model, std::move(host)));
  p->max_rows_ = options.max_rows;
  RETURN_IF_ERROR(p->Load(options));
  int least = 0, greatest = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&p->gpu_, cudaStreamNonBlocking, least));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&p->fork_, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&p->join_, cudaEventDisableTiming));
  RETURN_IF_ERROR(p->ReserveWork(std::max<int64_t>(options.max_rows, 1)));
  RETURN_IF_ERROR(p->SetUpCounts(options));
  RETURN_IF_ERROR(p->SetUpRebalance(options));
  return p;
}

absl::Status ResidentRoutedExperts::SetUpCounts(const ResidentExpertsOptions& o) {
  if (o.heat == nullptr || experts_ == 0) return absl::OkStatus();
  const size_t n = layers_.size() * static_cast<size_t>(model_.config().n_routed_experts);
  RETURN_IF_ERROR(expert_counts_.Reserve(n * sizeof(unsigned long long)));
  CUDA_RETURN_IF_ERROR(cudaMemset(expert_counts_.p, 0, n * sizeof(unsigned long long)));
  RETURN_IF_ERROR(pulled_host_.Reserve(n * sizeof(unsigned long long)));
  pulled_.assign(n, 0);
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&pull_, cudaStreamNonBlocking));
  heat_ = o.heat;
  heat_->SetSource([this] { PullCounts(); });
  return absl::OkStatus();
}

void ResidentRoutedExperts::PullCounts() {
  std::lock_guard<std::mutex> lock(pull_mu_);
  const size_t n = pulled_.size();
  const auto* now = pulled_host_.as<unsigned long long>();
  if (cudaSetDevice(device_) != cudaSuccess ||
      cudaMemcpyAsync(pulled_host_.p, expert_counts_.p, n * sizeof(unsigned long long),
                      cudaMemcpyDeviceToHost, pull_) != cudaSuccess ||
      cudaStreamSynchronize(pull_) != cudaSuccess) {
    spdlog::warn("resident experts: reading the routing counts from the device failed: {}",
                 cudaGetErrorString(cudaGetLastError()));
    return;
  }
  const int E = static_cast<int>(model_.config().n_routed_experts);
  for (size_t i = 0; i < n; ++i) {
    if (now[i] <= pulled_[i]) continue;
    heat_->Add(first_layer_ + static_cast<int64_t>(i / E), static_cast<int>(i % E),
               now[i] - pulled_[i], ChoicePath::kGpu);
    pulled_[i] = now[i];
  }
}

absl::Status ResidentRoutedExperts::SetUpRebalance(const ResidentExpertsOptions& o) {
  if (o.heat == nullptr || o.rebalance.interval <= absl::ZeroDuration() || experts_ == 0 ||
      o.max_swaps < 1) {
    return absl::OkStatus();
  }
  max_swaps_ = o.max_swaps;
  RETURN_IF_ERROR(staging_.Reserve(static_cast<size_t>(max_swaps_ * max_expert_bytes_)));
  int least = 0, greatest = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&copy_, cudaStreamNonBlocking, least));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
  rebalancer_ = std::make_unique<ExpertRebalancer>(o.heat, this, o.rebalance);
  rebalancer_->Start();
  spdlog::info(
      "resident experts: rebalanced every {} while serving, up to {} experts a round (staging "
      "{}), promoted past a {:.0f}% margin",
      absl::FormatDuration(o.rebalance.interval), max_swaps_, MiB(staging_.cap),
      100.0 * o.rebalance.margin);
  return absl::OkStatus();
}

absl::Status ResidentRoutedExperts::Load(const ResidentExpertsOptions& o) {
  const int E = static_cast<int>(model_.config().n_routed_experts);
  std::vector<LayerSources> sources = PlanLayerSources(model_, o.sources);
  const int n = o.sources.end_layer - o.sources.first_layer;
  std::vector<int32_t> slot_of(static_cast<size_t>(n) * E, -1);
  std::vector<std::vector<int32_t>> sets(n);
  int64_t total = 0;
  for (int l = 0; l < n; ++l) {
    const int L = o.sources.first_layer + l;
    std::vector<int32_t> set =
        l < static_cast<int>(o.resident.size()) ? o.resident[l] : std::vector<int32_t>{};
    std::sort(set.begin(), set.end());
    if (std::adjacent_find(set.begin(), set.end()) != set.end() ||
        (!set.empty() && (set.front() < 0 || set.back() >= E))) {
      return absl::InvalidArgumentError(
          absl::StrCat("resident experts of layer ", L, ": ids must be distinct, in [0, ", E, ")"));
    }
    Layer layer;
    layer.plan = std::move(sources[l].plan);
    if (!set.empty() && !sources[l].usable) {
      return absl::FailedPreconditionError(absl::StrCat(
          "resident experts of layer ", L, ": the GPU cannot compute them: ", sources[l].why_not));
    }
    const LayerStreamPlan& plan = layer.plan;
    set = RankShare({L, {set}},
                    [&](int) {  // this rank's experts only
                      return plan.parts > 0
                                 ? std::pair<int32_t, int32_t>{plan.expert_begin, plan.expert_end}
                                 : std::pair<int32_t, int32_t>{0, 0};
                    })
              .layers[0];
    layer.count = static_cast<int>(set.size());
    layer.offset = total;
    total += layer.count * layer.plan.expert_bytes;
    for (int j = 0; j < layer.count; ++j) slot_of[static_cast<size_t>(l) * E + set[j]] = j;
    experts_ += layer.count;
    sets[l] = std::move(set);
    layers_.push_back(std::move(layer));
  }
  first_layer_ = o.sources.first_layer;
  for (const Layer& layer : layers_) {
    max_count_ = std::max(max_count_, layer.count);
    max_inter_ = std::max(max_inter_, layer.plan.parts * layer.plan.part_inter);
    max_expert_bytes_ = std::max(max_expert_bytes_, layer.plan.expert_bytes);
  }
  RETURN_IF_ERROR(weights_.Reserve(static_cast<size_t>(total)));
  RETURN_IF_ERROR(hits_.Reserve(static_cast<size_t>(n) * 2 * sizeof(unsigned long long)));
  CUDA_RETURN_IF_ERROR(
      cudaMemset(hits_.p, 0, static_cast<size_t>(n) * 2 * sizeof(unsigned long long)));
  RETURN_IF_ERROR(slot_of_.Reserve(slot_of.size() * 4));
  RETURN_IF_ERROR(slot_host_.Reserve(slot_of.size() * 4));
  std::copy(slot_of.begin(), slot_of.end(), slot_host_.as<int32_t>());
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(slot_of_.p, slot_of.data(), slot_of.size() * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device_));
  LoadProgress progress(absl::StrCat("copying resident experts to CUDA device ", device_), total);
  for (int l = 0; l < n; ++l) {
    const Layer& layer = layers_[l];
    for (int j = 0; j < layer.count; ++j) {
      uint8_t* slot = weights_.as<uint8_t>() + layer.offset + j * layer.plan.expert_bytes;
      for (const HostCopy& cp : layer.plan.GroupCopies(sets[l][j], sets[l][j] + 1)) {
        CUDA_RETURN_IF_ERROR(
            cudaMemcpy(slot + cp.dst_offset, cp.src, cp.bytes, cudaMemcpyHostToDevice));
      }
      progress.Add(layer.plan.expert_bytes);
    }
  }
  progress.Done();
  sets_ = std::move(sets);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ResidentRoutedExperts::LayerHits>> ResidentRoutedExperts::Hits() const {
  std::vector<unsigned long long> raw(layers_.size() * 2);
  if (!raw.empty()) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(raw.data(), hits_.p, raw.size() * sizeof(raw[0]), cudaMemcpyDeviceToHost));
  }
  std::vector<LayerHits> out(layers_.size());
  for (size_t l = 0; l < out.size(); ++l) out[l] = {raw[2 * l], raw[2 * l + 1]};
  return out;
}

// The extra int32 values: each choice's slot, then the host's ids.
absl::Status ResidentRoutedExperts::ReserveWork(int64_t rows) {
  const ModelConfig& c = model_.config();
  const int K = static_cast<int>(c.n_activated_experts);
  RETURN_IF_ERROR(work_.Reserve(static_cast<size_t>(
      MoeWorkspaceBytes(rows, K, max_count_, c.dim, max_inter_, 2 * rows * K))));
  rows_ = std::max(rows_, rows);
  return absl::OkStatus();
}

double ResidentRoutedExperts::HostShare(int64_t rows) const {
  const double all =
      static_cast<double>(layers_.size()) * static_cast<double>(model_.config().n_routed_experts);
  if (rows > max_rows_ || !(all > 0)) return 1.0;
  return std::max(0.0, 1.0 - static_cast<double>(experts_) / all);
}

absl::Status ResidentRoutedExperts::PrepareStep(int n_layers, int64_t rows) {
  RETURN_IF_ERROR(host_->PrepareStep(n_layers, rows));
  RETURN_IF_ERROR(ApplyStaged());
  step_resident_ = experts_ > 0 && rows <= max_rows_;
  if (step_resident_ && rows > rows_) RETURN_IF_ERROR(ReserveWork(rows));
  return absl::OkStatus();
}

void ResidentRoutedExperts::AppendGraphKey(std::vector<int64_t>* key) const {
  host_->AppendGraphKey(key);
  key->push_back(step_resident_ ? 1 : 0);
  key->push_back(reinterpret_cast<int64_t>(work_.p));
}

absl::Status ResidentRoutedExperts::Enqueue(int l, const cuda::bf16_t* xn, const int32_t* ids,
                                            const float* weights, int64_t rows, float* sum,
                                            cudaStream_t side) {
  const Layer& layer = layers_[l];
  if (!step_resident_ || layer.count == 0) {
    return host_->Enqueue(l, xn, ids, weights, rows, sum, side);
  }
  const ModelConfig& c = model_.config();
  const int64_t T = rows, dim = c.dim;
  const int K = static_cast<int>(c.n_activated_experts), E = static_cast<int>(c.n_routed_experts);
  const MoeWorkspace w = CarveMoeWorkspace(work_.p, T, K, max_count_, dim, max_inter_, 2 * T * K);
  int32_t* const slots = w.extra;
  int32_t* const host_ids = w.extra + T * K;
  const cuda::MoeRouting& routing = w.routing;
  cuda::bf16_t* const xq = w.xq;
  cuda::bf16_t* const h = w.h;
  float* const y = w.y;

  CUDA_RETURN_IF_ERROR(cuda::SplitResidentRoutes(
      {.ids = ids,
       .n = T * K,
       .slot_of = slot_of_.as<int32_t>() + l * E,
       .E = E,
       .resident = slots,
       .host = host_ids,
       .counts = hits_.as<unsigned long long>() + 2 * l,
       .expert_counts = heat_ != nullptr
                            ? expert_counts_.as<unsigned long long>() + static_cast<int64_t>(l) * E
                            : nullptr},
      side));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, side));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(gpu_, fork_, 0));
  const int64_t inter = layer.plan.parts * layer.plan.part_inter;
  const bool round_output = inter == c.moe_inter_dim;
  if (T * K <= cuda::kMxfp4MoeDecodeMaxRoutes) {
    // Decode: each chosen expert's weights read once (mxfp4_moe_decode.h).
    CUDA_RETURN_IF_ERROR(cuda::Mxfp4MoeDecode({.x = xn,
                                               .slots = slots,
                                               .weights = weights,
                                               .T = T,
                                               .K = K,
                                               .n_slots = layer.count,
                                               .base = weights_.as<uint8_t>() + layer.offset,
                                               .layout = DeviceExpertLayout(layer.plan),
                                               .h = h,
                                               .y = y,
                                               .limit = static_cast<float>(c.swiglu_limit),
                                               .round_output_bf16 = round_output},
                                              gpu_));
  } else {
    CUDA_RETURN_IF_ERROR(cuda::FakeQuantE4m3(xn, T, dim, xq, gpu_));
    CUDA_RETURN_IF_ERROR(cuda::MoeBuildRouting({.ids = slots,
                                                .weights = weights,
                                                .T = T,
                                                .K = K,
                                                .E = layer.count,
                                                .expert_begin = 0,
                                                .expert_end = layer.count,
                                                .routing = routing},
                                               gpu_));
    CUDA_RETURN_IF_ERROR(cuda::Mxfp4MoeGroup({.routing = routing,
                                              .T = T,
                                              .K = K,
                                              .expert_begin = 0,
                                              .expert_end = layer.count,
                                              .base = weights_.as<uint8_t>() + layer.offset,
                                              .layout = DeviceExpertLayout(layer.plan),
                                              .xq = xq,
                                              .h = h,
                                              .y = y,
                                              .limit = static_cast<float>(c.swiglu_limit),
                                              .round_output_bf16 = round_output},
                                             gpu_));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(join_, gpu_));
  RETURN_IF_ERROR(host_->Enqueue(l, xn, host_ids, weights, rows, sum, side));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side, join_, 0));
  CUDA_RETURN_IF_ERROR(cuda::MoeCombineRoutes({.y = y,
                                               .ids = slots,
                                               .T = T,
                                               .K = K,
                                               .dim = dim,
                                               .expert_begin = 0,
                                               .expert_end = layer.count,
                                               .sum = sum,
                                               .accumulate = true},
                                              side));
  return absl::OkStatus();
}

ResidentSet ResidentRoutedExperts::Current() const {
  std::lock_guard<std::mutex> lock(move_mu_);
  ResidentSet set{first_layer_, sets_};
  for (std::vector<int32_t>& l : set.layers) std::sort(l.begin(), l.end());
  return set;
}

std::pair<int32_t, int32_t> ResidentRoutedExperts::Range(int layer) const {
  const int l = layer - first_layer_;
  if (l < 0 || l >= static_cast<int>(layers_.size()) || layers_[l].plan.parts == 0) return {0, 0};
  return {layers_[l].plan.expert_begin, layers_[l].plan.expert_end};  // as Load's RankShare
}

absl::Status ResidentRoutedExperts::CheckSwaps(const std::vector<ExpertSwap>& swaps) const {
  const int E = static_cast<int>(model_.config().n_routed_experts);
  std::vector<int32_t> table(slot_host_.as<int32_t>(),
                             slot_host_.as<int32_t>() + layers_.size() * E);
  for (const ExpertSwap& s : swaps) {
    const int l = s.promote_layer - first_layer_;
    const auto [begin, end] = Range(s.promote_layer);
    if (s.evict_layer != s.promote_layer || l < 0 || l >= static_cast<int>(layers_.size()) ||
        s.evict < 0 || s.evict >= E || s.promote < begin || s.promote >= end ||
        table[static_cast<size_t>(l) * E + s.evict] < 0 ||
        table[static_cast<size_t>(l) * E + s.promote] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resident experts: swap of layer ", s.evict_layer, " expert ", s.evict, " for layer ",
          s.promote_layer, " expert ", s.promote,
          ": must be within one layer, evict a resident expert and promote one this rank may hold "
          "that is not resident"));
    }
    std::swap(table[static_cast<size_t>(l) * E + s.evict],
              table[static_cast<size_t>(l) * E + s.promote]);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ResidentRoutedExperts::Stage(const std::vector<ExpertSwap>& swaps) {
  std::lock_guard<std::mutex> lock(move_mu_);
  if (!pending_.empty()) return false;
  if (static_cast<int>(swaps.size()) > max_swaps_) {
    return absl::InvalidArgumentError(
        absl::StrCat("resident experts: ", swaps.size(), " swaps, at most ", max_swaps_));
  }
  RETURN_IF_ERROR(CheckSwaps(swaps));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  for (size_t i = 0; i < swaps.size(); ++i) {
    const Layer& layer = layers_[swaps[i].promote_layer - first_layer_];
    uint8_t* dst = staging_.as<uint8_t>() + i * max_expert_bytes_;
    for (const HostCopy& cp : layer.plan.GroupCopies(swaps[i].promote, swaps[i].promote + 1)) {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst + cp.dst_offset, cp.src, cp.bytes, cudaMemcpyHostToDevice, copy_));
    }
    pending_.push_back({swaps[i].promote_layer - first_layer_, swaps[i].evict, swaps[i].promote});
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, copy_));
  return true;
}

absl::Status ResidentRoutedExperts::ApplyStaged() {
  std::lock_guard<std::mutex> lock(move_mu_);
  if (pending_.empty()) return absl::OkStatus();
  const cudaError_t ready = cudaEventQuery(staged_);
  if (ready == cudaErrorNotReady) return absl::OkStatus();
  if (ready != cudaSuccess) {
    pending_.clear();
    CUDA_RETURN_IF_ERROR(ready);
  }
  const int E = static_cast<int>(model_.config().n_routed_experts);
  int32_t* table = slot_host_.as<int32_t>();
  std::vector<bool> changed(layers_.size(), false);
  int64_t bytes = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    const Pending& p = pending_[i];
    const Layer& layer = layers_[p.layer];
    int32_t* row = table + static_cast<size_t>(p.layer) * E;
    const int32_t slot = row[p.evict];
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(weights_.as<uint8_t>() + layer.offset + slot * layer.plan.expert_bytes,
                        staging_.as<uint8_t>() + i * max_expert_bytes_, layer.plan.expert_bytes,
                        cudaMemcpyDeviceToDevice, gpu_));
    row[p.evict] = -1;
    row[p.promote] = slot;
    sets_[p.layer][slot] = p.promote;
    changed[p.layer] = true;
    bytes += layer.plan.expert_bytes;
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!changed[l]) continue;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot_of_.as<int32_t>() + l * E, table + l * E, E * 4,
                                         cudaMemcpyHostToDevice, gpu_));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(gpu_));
  heat_->AddRebalance(static_cast<int64_t>(pending_.size()), bytes);
  pending_.clear();
  return absl::OkStatus();
}

}  // namespace ss::gpu::cuda_backend_internal
