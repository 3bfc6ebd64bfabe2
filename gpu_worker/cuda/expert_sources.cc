#include "gpu_worker/cuda/expert_sources.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpu_worker/expert_placement.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

constexpr int64_t kAlign = 256;
int64_t Up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// The arena's parts: the routing's five arrays and scratch, xq, h, y, extra.
struct WorkLayout {
  int64_t offsets, tile_offsets, route_token, route_slot, route_weight, scratch, xq, h, y, extra,
      bytes;
};
WorkLayout LayoutWork(int64_t T, int K, int E, int64_t dim, int64_t inter, int64_t extra) {
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
  w.extra = take(extra * 4);
  w.bytes = at;
  return w;
}

// A layer served by expert workers: every slice of this rank from its store.
void FromStores(int L, int E, const ExpertStoreSet* stores, LayerSources& ls) {
  LayerStreamPlan& sp = ls.plan;
  if (stores == nullptr) {
    ls.why_not = "no expert stores are mapped";
    return;
  }
  if (!stores->streamable(L)) {
    ls.why_not = stores->reason(L);
    return;
  }
  const std::vector<const ExpertStoreMap*>& slices = stores->slices(L);
  sp.parts = static_cast<int>(slices.size());
  sp.expert_begin = 0;
  sp.expert_end = E;
  ls.usable = true;
  if (sp.parts == 0) return;
  const StoreExpertLayout& s0 = slices[0]->layout();
  sp.part_inter = s0.inter_slice;
  sp.tile_rows = s0.tile_rows;
  absl::StatusOr<PartBlockLayout> part = CompactPartBlockLayout(sp.dim, sp.part_inter);
  if (part.ok()) sp.part = *part;
  for (const ExpertStoreMap* m : slices) {
    const StoreExpertLayout& s = m->layout();
    const PartBlockLayout& want = sp.part;
    if (!part.ok() || s.inter_slice != sp.part_inter || s.tile_rows != sp.tile_rows ||
        s.expert_stride != want.bytes || s.w1 != want.w1 || s.w1_scale != want.w1_scale ||
        s.w3 != want.w3 || s.w3_scale != want.w3_scale || s.w2 != want.w2 ||
        s.w2_scale != want.w2_scale) {
      ls.usable = false;
      ls.why_not =
          absl::StrCat("store ", m->name(), " has a slice layout the GPU kernels do not take");
    }
  }
  for (int e = 0; e < E && ls.usable; ++e) {
    for (const ExpertStoreMap* m : slices) sp.sources.push_back({.block = m->expert(L, e)});
  }
}

// A layer without expert workers: this rank's experts from the model's host weights.
void FromHostWeights(const model::Model& model, int L, int E, int tp, int rank, LayerSources& ls) {
  LayerStreamPlan& sp = ls.plan;
  const model::MoeWeights& moe = model.weights().blocks[L].moe;
  if (static_cast<int>(moe.experts.size()) != E || moe.experts[0].w1.w == nullptr) {
    ls.why_not = "this worker holds no routed-expert weights of the layer";
    return;
  }
  absl::StatusOr<PartBlockLayout> part =
      CompactPartBlockLayout(sp.dim, model.config().moe_inter_dim);
  ls.usable = part.ok();
  if (!part.ok()) ls.why_not = std::string(part.status().message());
  sp.parts = 1;
  sp.part_inter = model.config().moe_inter_dim;
  sp.tile_rows = 0;
  if (part.ok()) sp.part = *part;
  std::tie(sp.expert_begin, sp.expert_end) = HostWeightsRange(E, tp, rank);
  for (int e = sp.expert_begin; e < sp.expert_end && ls.usable; ++e) {
    const model::ExpertWeights& x = moe.experts[e];
    sp.sources.push_back({.w1 = x.w1.w,
                          .w1_scale = x.w1.s,
                          .w3 = x.w3.w,
                          .w3_scale = x.w3.s,
                          .w2 = x.w2.w,
                          .w2_scale = x.w2.s});
  }
}

}  // namespace

std::vector<LayerSources> PlanLayerSources(const model::Model& model,
                                           const ExpertSourcesOptions& o) {
  const ModelConfig& c = model.config();
  const int E = static_cast<int>(c.n_routed_experts);
  std::vector<LayerSources> out;
  for (int L = o.first_layer; L < o.end_layer; ++L) {
    LayerSources ls;
    ls.plan.dim = c.dim;
    if (std::find(o.remote_layers.begin(), o.remote_layers.end(), L) != o.remote_layers.end()) {
      FromStores(L, E, o.stores, ls);
    } else {
      FromHostWeights(model, L, E, o.tp, o.rank, ls);
    }
    LayerStreamPlan& sp = ls.plan;
    if (ls.usable && sp.parts > 0 &&
        (c.dim % 128 != 0 || sp.part_inter % 128 != 0 || sp.parts > cuda::kMxfp4MoeMaxParts ||
         E > cuda::kMxfp4MoeMaxExperts)) {
      ls.usable = false;
      ls.why_not =
          absl::StrFormat("dim %d, %d parts of %d rows, %d experts: outside the kernels' limits",
                          c.dim, sp.parts, sp.part_inter, E);
    }
    sp.expert_bytes = sp.parts * sp.part.bytes;
    out.push_back(std::move(ls));
  }
  return out;
}

cuda::Mxfp4ExpertLayout DeviceExpertLayout(const LayerStreamPlan& sp) {
  cuda::Mxfp4ExpertLayout layout;
  layout.dim = sp.dim;
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
  return layout;
}

int64_t MoeWorkspaceBytes(int64_t T, int K, int E, int64_t dim, int64_t inter, int64_t extra) {
  return LayoutWork(T, K, E, dim, inter, extra).bytes;
}

MoeWorkspace CarveMoeWorkspace(void* arena, int64_t T, int K, int E, int64_t dim, int64_t inter,
                               int64_t extra) {
  const WorkLayout w = LayoutWork(T, K, E, dim, inter, extra);
  auto* base = static_cast<uint8_t*>(arena);
  MoeWorkspace m;
  m.routing.offsets = reinterpret_cast<int32_t*>(base + w.offsets);
  m.routing.tile_offsets = reinterpret_cast<int32_t*>(base + w.tile_offsets);
  m.routing.route_token = reinterpret_cast<int32_t*>(base + w.route_token);
  m.routing.route_slot = reinterpret_cast<int32_t*>(base + w.route_slot);
  m.routing.route_weight = reinterpret_cast<float*>(base + w.route_weight);
  m.routing.scratch = base + w.scratch;
  m.xq = reinterpret_cast<cuda::bf16_t*>(base + w.xq);
  m.h = reinterpret_cast<cuda::bf16_t*>(base + w.h);
  m.y = reinterpret_cast<float*>(base + w.y);
  m.extra = reinterpret_cast<int32_t*>(base + w.extra);
  return m;
}

}  // namespace ss::gpu::cuda_backend_internal
