#include "gpu_worker/cuda/streamed_routed_experts.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "gpu_worker/cuda/expert_sources.h"
#include "gpu_worker/cuda_status.h"
#include "gpu_worker/kernels/mxfp4_moe.h"
#include "gpu_worker/memory_plan.h"
#include "gpu_worker/streamed_prefill.h"
#include "spdlog/spdlog.h"

namespace ss::gpu::cuda_backend_internal {
namespace {}  // namespace

StreamedRoutedExperts::StreamedRoutedExperts(const model::Model& model,
                                             const StreamedExpertsOptions& options)
    : model_(model), options_(options) {}

StreamedRoutedExperts::~StreamedRoutedExperts() {
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
  for (const void* p : registered_) cudaHostUnregister(const_cast<void*>(p));
  for (auto* v : {&free_, &filled_, &copy_start_, &copy_end_}) {
    for (cudaEvent_t e : *v) cudaEventDestroy(e);
  }
  if (step_end_ != nullptr) cudaEventDestroy(step_end_);
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
}

absl::StatusOr<std::unique_ptr<StreamedRoutedExperts>> StreamedRoutedExperts::Create(
    const model::Model& model, const StreamedExpertsOptions& options) {
  std::unique_ptr<StreamedRoutedExperts> p(new StreamedRoutedExperts(model, options));
  RETURN_IF_ERROR(p->PlanLayers());
  RETURN_IF_ERROR(p->Allocate());
  RETURN_IF_ERROR(p->MeasureBandwidth());
  return p;
}

absl::Status StreamedRoutedExperts::PlanLayers() {
  for (LayerSources& ls : PlanLayerSources(model_, options_.sources)) {
    LayerPlan lp;
    lp.streamable = ls.usable;
    lp.why_not = std::move(ls.why_not);
    lp.plan = std::move(ls.plan);
    if (!lp.streamable) {
      spdlog::warn("streamed prefill: layer {} keeps the CPU path: {}",
                   options_.sources.first_layer + static_cast<int>(plans_.size()), lp.why_not);
    }
    plans_.push_back(std::move(lp));
  }
  return absl::OkStatus();
}

absl::Status StreamedRoutedExperts::Allocate() {
  int64_t expert_bytes = 0;
  for (const LayerPlan& lp : plans_) {
    if (lp.streamable) expert_bytes = std::max(expert_bytes, lp.plan.expert_bytes);
  }
  if (expert_bytes == 0) return absl::OkStatus();  // nothing to copy
  const RingPlan ring = PlanRing(options_.ring_bytes, expert_bytes,
                                 model_.config().n_routed_experts, options_.slot_bytes);
  if (ring.slots == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the streamed-prefill ring of ", MiB(options_.ring_bytes), " cannot hold ",
                     kGpuPrefillMinRingSlots, " slots of one expert (", MiB(expert_bytes),
                     " each): raise --gpu_prefill_ring_mib"));
  }
  experts_per_slot_ = ring.experts_per_slot;
  slots_ = ring.slots;
  slot_bytes_ = experts_per_slot_ * expert_bytes;
  RETURN_IF_ERROR(ring_.Reserve(static_cast<size_t>(slot_bytes_ * slots_)));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  for (int b = 0; b < slots_; ++b) {
    for (auto* v : {&free_, &filled_}) {
      cudaEvent_t e = nullptr;
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      v->push_back(e);
    }
  }
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&step_end_));
  for (LayerPlan& lp : plans_) {
    if (!lp.streamable) continue;
    const int64_t bytes = lp.plan.GroupBytes(lp.plan.expert_begin, lp.plan.expert_end);
    layer_bytes_ = std::max(layer_bytes_, bytes);
    if (lp.plan.parts == 0) continue;
    lp.groups = ExpertGroups(lp.plan.expert_begin, lp.plan.expert_end, experts_per_slot_);
    for (const auto& [e0, e1] : lp.groups) lp.copies.push_back(lp.plan.GroupCopies(e0, e1));
  }
  RETURN_IF_ERROR(ReserveWork(static_cast<int>(plans_.size()), options_.max_rows));
  // The stores' memory as pinned (page-locked, DMA-able) host memory, read-only.
  if (options_.sources.stores != nullptr) {
    for (const ExpertStoreMap* m : options_.sources.stores->maps()) {
      const auto t0 = std::chrono::steady_clock::now();
      const cudaError_t e =
          cudaHostRegister(const_cast<uint8_t*>(m->data()), m->size(), cudaHostRegisterReadOnly);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        spdlog::warn(
            "streamed prefill: cudaHostRegister of expert store {} ({}) failed: {}; its copies "
            "run from pageable memory, at a fraction of the PCIe bandwidth",
            m->name(), GiB(static_cast<int64_t>(m->size())), cudaGetErrorString(e));
        continue;
      }
      registered_.push_back(m->data());
      spdlog::info("streamed prefill: registered expert store {} ({}) for DMA in {:.1f} s",
                   m->name(), GiB(static_cast<int64_t>(m->size())), s);
    }
  }
  return absl::OkStatus();
}

absl::Status StreamedRoutedExperts::MeasureBandwidth() {
  if (slot_bytes_ == 0) return absl::OkStatus();
  // From a registered store (what the copies read) or, without one, from pinned memory.
  const uint8_t* src = nullptr;
  int64_t bytes = std::min<int64_t>(slot_bytes_ * slots_, int64_t{256} << 20);
  PinnedBuf pinned;
  if (!registered_.empty()) {
    const ExpertStoreMap* m = options_.sources.stores->maps()[0];
    for (const ExpertStoreMap* x : options_.sources.stores->maps()) {
      if (x->data() == registered_[0]) m = x;
    }
    src = m->data();
    bytes = std::min<int64_t>(bytes, static_cast<int64_t>(m->size()));
  } else {
    bytes = std::min<int64_t>(bytes, int64_t{64} << 20);
    RETURN_IF_ERROR(pinned.Reserve(static_cast<size_t>(bytes)));
    src = pinned.as<uint8_t>();
  }
  cudaEvent_t a = nullptr, b = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&a));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&b));
  constexpr int kRepeats = 3;
  cudaError_t e = cudaMemcpyAsync(ring_.p, src, bytes, cudaMemcpyHostToDevice, copy_);  // warm-up
  if (e == cudaSuccess) e = cudaEventRecord(a, copy_);
  for (int i = 0; i < kRepeats && e == cudaSuccess; ++i) {
    e = cudaMemcpyAsync(ring_.p, src, bytes, cudaMemcpyHostToDevice, copy_);
  }
  if (e == cudaSuccess) e = cudaEventRecord(b, copy_);
  if (e == cudaSuccess) e = cudaEventSynchronize(b);
  float ms = 0;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  CUDA_RETURN_IF_ERROR(e);
  h2d_ = ms > 0 ? static_cast<double>(bytes) * kRepeats / (ms * 1e-3) : 0.0;
  return absl::OkStatus();
}

std::string StreamedRoutedExperts::Describe() const {
  int streamable = 0;
  for (const LayerPlan& lp : plans_) streamable += lp.streamable ? 1 : 0;
  return absl::StrFormat(
      "%d of %d layers streamable, %s per layer, ring %d x %s (%d experts a slot), pinned H2D "
      "%.1f GB/s%s",
      streamable, static_cast<int>(plans_.size()), MiB(layer_bytes_), slots_, MiB(slot_bytes_),
      experts_per_slot_, h2d_ / 1e9,
      registered_.empty() && options_.sources.stores != nullptr ? " (stores NOT registered)" : "");
}

absl::Status StreamedRoutedExperts::PrepareStep(int n_layers, int64_t rows) {
  RETURN_IF_ERROR(ReserveWork(n_layers, rows));
  // Copies of an earlier step that never computed (a failed step) still took their slots.
  slot0_ = (slot0_ + copied_) % std::max(slots_, 1);
  seq_.clear();
  copied_ = computed_ = 0;
  step_bytes_ = 0;
  for (int l = 0; l < n_layers; ++l) {
    if (!plans_[l].streamable) continue;
    for (size_t g = 0; g < plans_[l].groups.size(); ++g) seq_.emplace_back(l, static_cast<int>(g));
  }
  return EnqueueCopies();
}

absl::Status StreamedRoutedExperts::EnqueueCopies() {
  const int64_t n = static_cast<int64_t>(seq_.size());
  for (; copied_ < n && copied_ < computed_ + slots_; ++copied_) {
    const auto [l, g] = seq_[copied_];
    const LayerPlan& lp = plans_[l];
    const int b = Slot(copied_);
    uint8_t* slot = ring_.as<uint8_t>() + b * slot_bytes_;
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, free_[b], 0));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(copy_start_[copied_], copy_));
    for (const HostCopy& cp : lp.copies[g]) {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(slot + cp.dst_offset, cp.src, cp.bytes, cudaMemcpyHostToDevice, copy_));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(copy_end_[copied_], copy_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(filled_[b], copy_));
    step_bytes_ += lp.plan.GroupBytes(lp.groups[g].first, lp.groups[g].second);
  }
  return absl::OkStatus();
}

absl::Status StreamedRoutedExperts::ReserveWork(int n_layers, int64_t rows) {
  const ModelConfig& c = model_.config();
  int64_t inter = 0, groups = 0;
  for (int l = 0; l < n_layers; ++l) {
    const LayerPlan& lp = plans_[l];
    if (!lp.streamable) continue;
    inter = std::max(inter, lp.plan.parts * lp.plan.part_inter);
    groups += static_cast<int64_t>(lp.groups.size());
  }
  const int64_t bytes = MoeWorkspaceBytes(rows, static_cast<int>(c.n_activated_experts),
                                          static_cast<int>(c.n_routed_experts), c.dim, inter, 0);
  RETURN_IF_ERROR(work_.Reserve(static_cast<size_t>(bytes)));
  rows_ = rows;
  while (static_cast<int64_t>(copy_start_.size()) < groups) {
    for (auto* v : {&copy_start_, &copy_end_}) {
      cudaEvent_t e = nullptr;
      CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
      v->push_back(e);
    }
  }
  return absl::OkStatus();
}

absl::Status StreamedRoutedExperts::Enqueue(int l, const cuda::bf16_t* xn, const int32_t* ids,
                                            const float* weights, int64_t rows, float* sum,
                                            cudaStream_t side) {
  const LayerPlan& lp = plans_[l];
  if (!lp.streamable) {
    return absl::InternalError(absl::StrCat("streamed prefill: layer ", l, " is not streamable"));
  }
  const ModelConfig& c = model_.config();
  const int64_t T = rows, dim = c.dim;
  const int K = static_cast<int>(c.n_activated_experts), E = static_cast<int>(c.n_routed_experts);
  const LayerStreamPlan& sp = lp.plan;
  if (sp.parts == 0) {  // none of this layer's experts is this rank's: its share is zero
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sum, 0, T * dim * 4, side));
    return absl::OkStatus();
  }
  const int64_t inter = sp.parts * sp.part_inter;
  const MoeWorkspace w = CarveMoeWorkspace(work_.p, T, K, E, dim, inter, 0);
  const cuda::MoeRouting& routing = w.routing;
  cuda::bf16_t* const xq = w.xq;
  cuda::bf16_t* const h = w.h;
  float* const y = w.y;
  CUDA_RETURN_IF_ERROR(cuda::MoeBuildRouting({.ids = ids,
                                              .weights = weights,
                                              .T = T,
                                              .K = K,
                                              .E = E,
                                              .expert_begin = sp.expert_begin,
                                              .expert_end = sp.expert_end,
                                              .routing = routing},
                                             side));
  CUDA_RETURN_IF_ERROR(cuda::FakeQuantE4m3(xn, T, dim, xq, side));

  const cuda::Mxfp4ExpertLayout layout = DeviceExpertLayout(sp);
  for (size_t g = 0; g < lp.groups.size(); ++g) {
    const auto [e0, e1] = lp.groups[g];
    if (computed_ >= static_cast<int64_t>(seq_.size()) ||
        seq_[computed_] != std::make_pair(l, static_cast<int>(g))) {
      return absl::InternalError(absl::StrCat("streamed prefill: layer ", l, " group ", g,
                                              " is not the step's next planned group"));
    }
    const int b = Slot(computed_);
    uint8_t* slot = ring_.as<uint8_t>() + b * slot_bytes_;
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side, filled_[b], 0));
    CUDA_RETURN_IF_ERROR(cuda::Mxfp4MoeGroup({.routing = routing,
                                              .T = T,
                                              .K = K,
                                              .expert_begin = e0,
                                              .expert_end = e1,
                                              .base = slot,
                                              .layout = layout,
                                              .xq = xq,
                                              .h = h,
                                              .y = y,
                                              .limit = static_cast<float>(c.swiglu_limit),
                                              .round_output_bf16 = inter == c.moe_inter_dim},
                                             side));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(free_[b], side));
    ++computed_;
    RETURN_IF_ERROR(EnqueueCopies());
  }
  CUDA_RETURN_IF_ERROR(cuda::MoeCombineRoutes({.y = y,
                                               .ids = ids,
                                               .T = T,
                                               .K = K,
                                               .dim = dim,
                                               .expert_begin = sp.expert_begin,
                                               .expert_end = sp.expert_end,
                                               .sum = sum},
                                              side));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(step_end_, side));
  return absl::OkStatus();
}

absl::Status StreamedRoutedExperts::FillTimings(StageTimings* t) const {
  t->experts_streamed = true;
  t->streamed_bytes = step_bytes_;
  t->streamed_copy_seconds = 0.0;
  t->streamed_span_seconds = 0.0;
  if (copied_ == 0) return absl::OkStatus();
  double copy = 0.0;
  for (int64_t g = 0; g < copied_; ++g) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, copy_start_[g], copy_end_[g]));
    copy += ms * 1e-3;
  }
  float span = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&span, copy_start_[0], step_end_));
  t->streamed_copy_seconds = copy;
  t->streamed_span_seconds = span * 1e-3;
  return absl::OkStatus();
}

void StreamedRoutedExperts::Synchronize() {
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
}

}  // namespace ss::gpu::cuda_backend_internal
