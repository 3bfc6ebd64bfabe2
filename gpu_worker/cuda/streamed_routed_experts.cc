#include "gpu_worker/cuda/streamed_routed_experts.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "gpu_worker/cuda_status.h"
#include "gpu_worker/kernels/mxfp4_moe.h"
#include "gpu_worker/memory_plan.h"
#include "gpu_worker/streamed_prefill.h"
#include "spdlog/spdlog.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

constexpr int64_t kAlign = 256;
int64_t Up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// The step workspace's parts for T rows (one arena, work_).
struct WorkLayout {
  int64_t offsets, tile_offsets, route_token, route_slot, route_weight, scratch, xq, h, y, bytes;
};
WorkLayout LayoutWork(int64_t T, int K, int E, int64_t dim, int64_t inter) {
  const int64_t R = T * K;
  WorkLayout w{};
  int64_t at = 0;
  auto take = [&at](int64_t bytes) {
    const int64_t o = at;
    at += Up(std::max<int64_t>(bytes, 1));
    return o;
  };
  w.offsets = take((E + 1) * 4);
  w.tile_offsets = take((E + 1) * 4);
  w.route_token = take(R * 4);
  w.route_slot = take(R * 4);
  w.route_weight = take(R * 4);
  w.scratch = take(cuda::MoeRoutingScratchBytes(T, K, E));
  w.xq = take(T * dim * 2);
  w.h = take(R * inter * 2);
  w.y = take(R * dim * 4);
  w.bytes = at;
  return w;
}

}  // namespace

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
  const ModelConfig& c = model_.config();
  const int E = static_cast<int>(c.n_routed_experts);
  const int64_t dim = c.dim, I = c.moe_inter_dim;
  for (int L = options_.first_layer; L < options_.end_layer; ++L) {
    LayerPlan lp;
    LayerStreamPlan& sp = lp.plan;
    sp.dim = dim;
    const bool remote = std::find(options_.remote_layers.begin(), options_.remote_layers.end(),
                                  L) != options_.remote_layers.end();
    if (remote) {
      if (options_.stores == nullptr) {
        lp.why_not = "no expert stores are mapped";
      } else if (!options_.stores->streamable(L)) {
        lp.why_not = options_.stores->reason(L);
      } else {
        const std::vector<const ExpertStoreMap*>& slices = options_.stores->slices(L);
        sp.parts = static_cast<int>(slices.size());
        sp.expert_begin = 0;
        sp.expert_end = E;
        lp.streamable = true;
        if (sp.parts > 0) {
          const StoreExpertLayout& s0 = slices[0]->layout();
          sp.part_inter = s0.inter_slice;
          sp.tile_rows = s0.tile_rows;
          absl::StatusOr<PartBlockLayout> part = CompactPartBlockLayout(dim, sp.part_inter);
          if (part.ok()) sp.part = *part;
          for (const ExpertStoreMap* m : slices) {
            const StoreExpertLayout& s = m->layout();
            const PartBlockLayout& want = sp.part;
            if (!part.ok() || s.inter_slice != sp.part_inter || s.tile_rows != sp.tile_rows ||
                s.expert_stride != want.bytes || s.w1 != want.w1 || s.w1_scale != want.w1_scale ||
                s.w3 != want.w3 || s.w3_scale != want.w3_scale || s.w2 != want.w2 ||
                s.w2_scale != want.w2_scale) {
              lp.streamable = false;
              lp.why_not = absl::StrCat("store ", m->name(),
                                        " has a slice layout the streamed path does not take");
            }
          }
          for (int e = 0; e < E && lp.streamable; ++e) {
            for (const ExpertStoreMap* m : slices) sp.sources.push_back({.block = m->expert(L, e)});
          }
        }
      }
    } else {
      const model::MoeWeights& moe = model_.weights().blocks[L].moe;
      if (static_cast<int>(moe.experts.size()) != E || moe.experts[0].w1.w == nullptr) {
        lp.why_not = "this worker holds no routed-expert weights of the layer";
      } else {
        absl::StatusOr<PartBlockLayout> part = CompactPartBlockLayout(dim, I);
        lp.streamable = part.ok();
        if (!part.ok()) lp.why_not = std::string(part.status().message());
        sp.parts = 1;
        sp.part_inter = I;
        sp.tile_rows = 0;
        if (part.ok()) sp.part = *part;
        const int tp = options_.tp, rank = options_.rank;
        sp.expert_begin = static_cast<int>(int64_t{rank} * E / tp);
        sp.expert_end = static_cast<int>(int64_t{rank + 1} * E / tp);
        for (int e = sp.expert_begin; e < sp.expert_end && lp.streamable; ++e) {
          const model::ExpertWeights& x = moe.experts[e];
          sp.sources.push_back({.w1 = x.w1.w,
                                .w1_scale = x.w1.s,
                                .w3 = x.w3.w,
                                .w3_scale = x.w3.s,
                                .w2 = x.w2.w,
                                .w2_scale = x.w2.s});
        }
      }
    }
    if (lp.streamable && sp.parts > 0 &&
        (dim % 128 != 0 || sp.part_inter % 128 != 0 || sp.parts > cuda::kMxfp4MoeMaxParts ||
         E > cuda::kMxfp4MoeMaxExperts)) {
      lp.streamable = false;
      lp.why_not =
          absl::StrFormat("dim %d, %d parts of %d rows, %d experts: outside the kernels' limits",
                          dim, sp.parts, sp.part_inter, E);
    }
    sp.expert_bytes = sp.parts * sp.part.bytes;
    if (!lp.streamable) {
      spdlog::warn("streamed prefill: layer {} keeps the CPU path: {}", L, lp.why_not);
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
  experts_per_slot_ = options_.ring_bytes / kGpuPrefillRingSlots / expert_bytes;
  if (experts_per_slot_ < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("the streamed-prefill ring of ", MiB(options_.ring_bytes), " cannot hold ",
                     kGpuPrefillRingSlots, " slots of one expert (", MiB(expert_bytes),
                     " each): raise --gpu_prefill_ring_mib"));
  }
  // A slot never needs more than a whole layer's experts.
  experts_per_slot_ = std::min<int64_t>(experts_per_slot_, model_.config().n_routed_experts);
  slot_bytes_ = experts_per_slot_ * expert_bytes;
  RETURN_IF_ERROR(ring_.Reserve(static_cast<size_t>(slot_bytes_ * kGpuPrefillRingSlots)));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  for (int b = 0; b < kGpuPrefillRingSlots; ++b) {
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
  if (options_.stores != nullptr) {
    for (const ExpertStoreMap* m : options_.stores->maps()) {
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
  int64_t bytes = std::min<int64_t>(slot_bytes_ * kGpuPrefillRingSlots, int64_t{256} << 20);
  PinnedBuf pinned;
  if (!registered_.empty()) {
    const ExpertStoreMap* m = options_.stores->maps()[0];
    for (const ExpertStoreMap* x : options_.stores->maps()) {
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
      streamable, static_cast<int>(plans_.size()), MiB(layer_bytes_), kGpuPrefillRingSlots,
      MiB(slot_bytes_), experts_per_slot_, h2d_ / 1e9,
      registered_.empty() && options_.stores != nullptr ? " (stores NOT registered)" : "");
}

absl::Status StreamedRoutedExperts::PrepareStep(int n_layers, int64_t rows) {
  RETURN_IF_ERROR(ReserveWork(n_layers, rows));
  step_groups_ = 0;
  step_bytes_ = 0;
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
  const WorkLayout w = LayoutWork(rows, static_cast<int>(c.n_activated_experts),
                                  static_cast<int>(c.n_routed_experts), c.dim, inter);
  RETURN_IF_ERROR(work_.Reserve(static_cast<size_t>(w.bytes)));
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
  const WorkLayout w = LayoutWork(T, K, E, dim, inter);
  auto* base = work_.as<uint8_t>();
  cuda::MoeRouting routing;
  routing.offsets = reinterpret_cast<int32_t*>(base + w.offsets);
  routing.tile_offsets = reinterpret_cast<int32_t*>(base + w.tile_offsets);
  routing.route_token = reinterpret_cast<int32_t*>(base + w.route_token);
  routing.route_slot = reinterpret_cast<int32_t*>(base + w.route_slot);
  routing.route_weight = reinterpret_cast<float*>(base + w.route_weight);
  routing.scratch = base + w.scratch;
  auto* xq = reinterpret_cast<cuda::bf16_t*>(base + w.xq);
  auto* h = reinterpret_cast<cuda::bf16_t*>(base + w.h);
  auto* y = reinterpret_cast<float*>(base + w.y);
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

  cuda::Mxfp4ExpertLayout layout;
  layout.dim = dim;
  layout.part_inter = sp.part_inter;
  layout.parts = sp.parts;
  layout.tile_rows = sp.tile_rows;
  layout.expert_bytes = sp.expert_bytes;
  layout.w2_scale_stride = sp.part_inter / 32;
  layout.w2_scale_col0 = 0;
  for (int p = 0; p < sp.parts; ++p) {
    const int64_t o = p * sp.part.bytes;
    layout.w1[p] = o + sp.part.w1;
    layout.w1_scale[p] = o + sp.part.w1_scale;
    layout.w3[p] = o + sp.part.w3;
    layout.w3_scale[p] = o + sp.part.w3_scale;
    layout.w2[p] = o + sp.part.w2;
    layout.w2_scale[p] = o + sp.part.w2_scale;
  }
  for (size_t g = 0; g < lp.groups.size(); ++g) {
    const auto [e0, e1] = lp.groups[g];
    const int b = static_cast<int>(next_slot_++ % kGpuPrefillRingSlots);
    uint8_t* slot = ring_.as<uint8_t>() + b * slot_bytes_;
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, free_[b], 0));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(copy_start_[step_groups_], copy_));
    for (const HostCopy& cp : lp.copies[g]) {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(slot + cp.dst_offset, cp.src, cp.bytes, cudaMemcpyHostToDevice, copy_));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(copy_end_[step_groups_], copy_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(filled_[b], copy_));
    ++step_groups_;
    step_bytes_ += sp.GroupBytes(e0, e1);

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
  if (step_groups_ == 0) return absl::OkStatus();
  double copy = 0.0;
  for (int64_t g = 0; g < step_groups_; ++g) {
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
