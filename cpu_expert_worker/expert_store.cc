#include "cpu_expert_worker/expert_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_schema.h"
#include "common/dummy_weights.h"
#include "common/expert_store_format.h"
#include "common/int_math.h"
#include "common/load_progress.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace ss::expert {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string ExpertPrefix(const ModelConfig& c, int layer, int64_t expert) {
  return layer < c.n_layers
             ? absl::StrCat("layers.", layer, ".ffn.experts.", expert, ".")
             : absl::StrCat("mtp.", layer - c.n_layers, ".ffn.experts.", expert, ".");
}

// One expert's six tensors, in the order w1, w1.scale, w3, w3.scale, w2, w2.scale, with the dtypes
// and shapes of the checkpoint schema.
std::array<ExpectedTensor, 6> ExpertTensors(const ModelConfig& c, int layer, int64_t expert) {
  const std::string p = ExpertPrefix(c, layer, expert);
  const int64_t dim = c.dim, inter = c.moe_inter_dim;
  return {{{p + "w1.weight", DType::kI8, {inter, dim / 2}},
           {p + "w1.scale", DType::kF8E8M0, {inter, dim / kMxGroup}},
           {p + "w3.weight", DType::kI8, {inter, dim / 2}},
           {p + "w3.scale", DType::kF8E8M0, {inter, dim / kMxGroup}},
           {p + "w2.weight", DType::kI8, {dim, inter / 2}},
           {p + "w2.scale", DType::kF8E8M0, {dim, inter / kMxGroup}}}};
}

// One expert's six source tensors inside the checkpoint's mapping, in ExpertTensors' order.
using Source = std::array<const TensorView*, 6>;

// The same six tensors' bytes, wherever they are (the mapping, or a dummy expert's scratch).
struct SourceBytes {
  const uint8_t *w1 = nullptr, *w1_scale = nullptr, *w3 = nullptr, *w3_scale = nullptr,
                *w2 = nullptr, *w2_scale = nullptr;
};

SourceBytes BytesOf(const std::array<const uint8_t*, 6>& p) {
  return {p[0], p[1], p[2], p[3], p[4], p[5]};
}

// Generates expert `expert` of `layer` (dummy weights, FillDummyTensor: the bytes
// MakeDummyCheckpoint gives these tensors) into `scratch` and points `out` at them.
absl::Status GenerateExpert(const ModelConfig& c, uint64_t seed, int layer, int64_t expert,
                            std::vector<uint8_t>* scratch, SourceBytes* out) {
  const std::array<ExpectedTensor, 6> tensors = ExpertTensors(c, layer, expert);
  std::array<size_t, 6> offsets, sizes;
  size_t total = 0;
  for (int i = 0; i < 6; ++i) {
    offsets[i] = total;
    sizes[i] = static_cast<size_t>(tensors[i].shape[0] * tensors[i].shape[1]);
    total += sizes[i];
  }
  scratch->resize(total);  // first touched by the thread that uses it
  std::array<const uint8_t*, 6> ptr;
  for (int i = 0; i < 6; ++i) {
    RETURN_IF_ERROR(FillDummyTensor(c, tensors[i], seed, scratch->data() + offsets[i], sizes[i]));
    ptr[i] = scratch->data() + offsets[i];
  }
  *out = BytesOf(ptr);
  return absl::OkStatus();
}

absl::StatusOr<Source> FindSource(const Checkpoint& ckpt, const ModelConfig& c, int layer,
                                  int64_t expert) {
  const std::array<ExpectedTensor, 6> tensors = ExpertTensors(c, layer, expert);
  Source s;
  for (int i = 0; i < 6; ++i) {
    ASSIGN_OR_RETURN(s[i], ckpt.Get(tensors[i].name, tensors[i].dtype, tensors[i].shape));
  }
  return s;
}

absl::Status ValidateSlice(const ModelConfig& c, int index, int count) {
  if (count < 1 || index < 0 || index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice ", index, "/", count, ": need n >= 1 and 0 <= i < n"));
  }
  const int64_t inter = c.moe_inter_dim;
  if (inter % count != 0 || (inter / count) % kActBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slice ", index, "/", count, ": moe_intermediate_size ", inter, " / ", count, " = ",
        static_cast<double>(inter) / count, " is not a multiple of ", kActBlock,
        " (each slice must hold whole 128-wide activation blocks of w2's input; n must divide "
        "moe_intermediate_size / 128 = ",
        inter / kActBlock, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLayers(const ModelConfig& c, const std::vector<int>& layers) {
  if (layers.empty()) return absl::InvalidArgumentError("no layers requested");
  const int64_t limit = c.n_layers + c.n_mtp_layers;
  std::vector<bool> seen(limit, false);
  for (int l : layers) {
    if (l < 0 || l >= limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, " is out of range: the model has ", c.n_layers, " layers (0-",
                       c.n_layers - 1, ")",
                       c.n_mtp_layers > 0 ? absl::StrCat(" and ", c.n_mtp_layers, " MTP block(s) (",
                                                         c.n_layers, "-", limit - 1, ")")
                                          : std::string()));
    }
    if (seen[l]) return absl::InvalidArgumentError(absl::StrCat("layer ", l, " is listed twice"));
    seen[l] = true;
  }
  return absl::OkStatus();
}

// Drops the pages lying wholly inside `t` from this process's mapping (they stay in the page
// cache for other readers); keeps the resident set at the copy's size while loading.
void DropSourcePages(const TensorView& t) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = RoundUp(reinterpret_cast<uintptr_t>(t.data), page);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(t.data) + t.nbytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void CopyRows(uint8_t* dst, const uint8_t* src, int64_t rows, int64_t len, int64_t src_stride) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * len, src + r * src_stride, len);
}

}  // namespace

const ExpertSliceView* ExpertStore::layer_views(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(layer_pos_.size()) || layer_pos_[layer] < 0) {
    return nullptr;
  }
  return views_[layer_pos_[layer]].data();
}

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Load(const ExpertStoreOptions& o,
                                                               ThreadPool* pool) {
  const Clock::time_point t0 = Clock::now();
  std::unique_ptr<ExpertStore> s(new ExpertStore());
  ASSIGN_OR_RETURN(s->config_, LoadModelConfig(o.source));
  const ModelConfig& c = s->config_;
  RETURN_IF_ERROR(ValidateSlice(c, o.slice_index, o.slice_count));
  RETURN_IF_ERROR(ValidateLayers(c, o.layers));
  s->slice_index_ = o.slice_index;
  s->slice_count_ = o.slice_count;
  s->tile_rows_ = o.tile_rows;
  s->layers_ = o.layers;
  const int64_t dim = c.dim, inter = c.moe_inter_dim, E = c.n_routed_experts;
  const int64_t is = inter / o.slice_count, r0 = is * o.slice_index;
  s->inter_slice_ = is;
  if (o.tile_rows != 0 && !IsWeightTileRows(o.tile_rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert store: tile_rows ", o.tile_rows, " (0, 8 or 16)"));
  }
  if (o.tile_rows != 0 && (is % o.tile_rows != 0 || dim % o.tile_rows != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("expert store: weights in tiles of ",
                                                   o.tile_rows, " rows need the slice's I/n (", is,
                                                   ") and dim (", dim, ") to be multiples of it"));
  }

  // Real weights: the six tensors of every (layer, expert) in the checkpoint's mapping. Dummy
  // weights: generated per (layer, expert) into the copying thread's scratch just before its
  // copy, so no more than one expert per thread exists outside the store.
  const int64_t L = static_cast<int64_t>(o.layers.size());
  const bool dummy = o.source.dummy();
  std::unique_ptr<Checkpoint> ckpt;
  std::vector<Source> sources;
  if (!dummy) {
    ASSIGN_OR_RETURN(ckpt, Checkpoint::Open(o.source.model_dir));
    sources.reserve(L * E);
    for (int layer : o.layers) {
      for (int64_t e = 0; e < E; ++e) {
        ASSIGN_OR_RETURN(Source src, FindSource(*ckpt, c, layer, e));
        sources.push_back(src);
      }
    }
  }

  ASSIGN_OR_RETURN(
      const ExpertStoreGeometry g,
      ComputeExpertStoreGeometry(dim, inter, E, o.slice_index, o.slice_count, o.tile_rows));
  s->expert_slice_bytes_ = g.expert_slice_bytes;
  const int64_t w13s = is * dim / kMxGroup;
  const int64_t off_w1s = g.w1_scale, off_w3 = g.w3, off_w3s = g.w3_scale, off_w2 = g.w2;
  const int64_t off_w2s = g.w2_scale, stride = g.expert_stride;
  NodeMemoryOptions mo;
  mo.topology = o.topology;
  mo.node = o.topology != nullptr ? o.numa_node : -1;
  uint8_t* data = nullptr;
  if (o.shm_name.empty()) {
    ASSIGN_OR_RETURN(s->memory_, AllocateNodeMemory(static_cast<size_t>(stride * L * E), mo));
    data = s->memory_.data();
  } else {
    mo.shm_name = o.shm_name.front() == '/' ? o.shm_name : "/" + o.shm_name;
    mo.shm_kind = kExpertStoreSegmentKind;
    const uint32_t n = static_cast<uint32_t>(L);
    ASSIGN_OR_RETURN(s->memory_, AllocateNodeMemory(ExpertStoreBytes(g, n), mo));
    WriteExpertStoreLayout(s->memory_.data(), s->memory_.size(), g, o.layers.data(), n);
    data = s->memory_.data() + ExpertStoreDataOffset(n);
  }

  s->layer_pos_.assign(c.n_layers + c.n_mtp_layers, -1);
  s->views_.resize(L);
  for (int64_t li = 0; li < L; ++li) {
    s->layer_pos_[o.layers[li]] = static_cast<int>(li);
    s->views_[li].resize(E);
    for (int64_t e = 0; e < E; ++e) {
      const uint8_t* base = data + (li * E + e) * stride;
      ExpertSliceView& v = s->views_[li][e];
      v.w1 = base;
      v.w1_scale = base + off_w1s;
      v.w3 = base + off_w3;
      v.w3_scale = base + off_w3s;
      v.w2 = base + off_w2;
      v.w2_scale = base + off_w2s;
      v.w2_stride = is / 2;
      v.w2_scale_stride = is / kMxGroup;
      v.tile_rows = o.tile_rows;
    }
  }

  const double open_s = SecondsSince(t0);
  const int64_t total = s->slice_bytes();
  spdlog::info(
      absl::StrFormat("expert store: %s %d layer(s) x %d experts, slice %d/%d (rows %d-%d of "
                      "I %d), %.3f GB%s",
                      dummy ? "generating (dummy weights) and copying" : "copying", L, E,
                      o.slice_index, o.slice_count, r0, r0 + is - 1, inter, total / 1e9,
                      s->memory_.bound() ? absl::StrCat(" bound to NUMA node ", o.numa_node)
                                         : std::string(" (not node-bound)")) +
      (o.tile_rows != 0 ? absl::StrCat(", weights in tiles of ", o.tile_rows, " rows")
                        : std::string(", weights row-major")));
  LoadProgress progress(dummy ? "expert store: generating and copying" : "expert store: copying",
                        total, {.log_summary = false});
  const Clock::time_point t1 = Clock::now();
  std::vector<std::vector<uint8_t>> scratch(pool != nullptr ? pool->size() : 1);
  std::vector<absl::Status> errors(scratch.size());
  const auto copy = [&](int64_t unit, int worker) {
    SourceBytes src;
    if (dummy) {
      absl::Status st =
          GenerateExpert(c, o.source.seed, o.layers[unit / E], unit % E, &scratch[worker], &src);
      if (!st.ok()) {
        if (errors[worker].ok()) errors[worker] = std::move(st);
        return;
      }
    } else {
      std::array<const uint8_t*, 6> ptr;
      for (int i = 0; i < 6; ++i) ptr[i] = sources[unit][i]->data;
      src = BytesOf(ptr);
    }
    uint8_t* dst = data + unit * stride;
    // The weights row-major as in the checkpoint, or tiled; the scales row-major.
    const auto weights = [&](uint8_t* to, const uint8_t* from, int64_t rows, int64_t len,
                             int64_t from_stride) {
      if (o.tile_rows != 0) {
        TileWeightRows(to, from, rows, len, from_stride, o.tile_rows);
      } else {
        CopyRows(to, from, rows, len, from_stride);
      }
    };
    weights(dst, src.w1 + r0 * dim / 2, is, dim / 2, dim / 2);
    std::memcpy(dst + off_w1s, src.w1_scale + r0 * dim / kMxGroup, w13s);
    weights(dst + off_w3, src.w3 + r0 * dim / 2, is, dim / 2, dim / 2);
    std::memcpy(dst + off_w3s, src.w3_scale + r0 * dim / kMxGroup, w13s);
    weights(dst + off_w2, src.w2 + r0 / 2, dim, is / 2, inter / 2);
    CopyRows(dst + off_w2s, src.w2_scale + r0 / kMxGroup, dim, is / kMxGroup, inter / kMxGroup);
    if (!dummy) {
      for (const TensorView* t : sources[unit]) DropSourcePages(*t);
    }
    progress.Add(s->expert_slice_bytes_);
  };
  if (pool != nullptr) {
    RETURN_IF_ERROR(pool->ParallelFor(L * E, copy));
  } else {
    for (int64_t u = 0; u < L * E; ++u) copy(u, 0);
  }
  for (absl::Status& st : errors) RETURN_IF_ERROR(st);
  progress.Done();
  const double copy_s = SecondsSince(t1);
  if (!o.shm_name.empty()) PublishExpertStore(s->memory_.data());
  ckpt.reset();  // unmaps every shard: nothing of the checkpoint stays resident
  s->load_seconds_ = SecondsSince(t0);
  const std::string how =
      dummy ? absl::StrFormat("%.2f GB/s generating dummy weights and copying; %.2f s to plan",
                              total / 1e9 / std::max(copy_s, 1e-9), open_s)
            : absl::StrFormat(
                  "%.2f GB/s copy; %.2f s to open the checkpoint and check %d expert tensors",
                  total / 1e9 / std::max(copy_s, 1e-9), open_s, sources.size() * 6);
  const int64_t huge = s->memory_.HugePageBytes();
  const HugePagePolicy policy =
      o.shm_name.empty() ? AnonymousHugePagePolicy() : SharedHugePagePolicy();
  spdlog::info(absl::StrFormat(
      "expert store: loaded %.3f GB%s in %.2f s (%s), %d MB allocated in %s, %s, resident %d MB",
      total / 1e9, dummy ? " (dummy)" : "", copy_s, how, s->allocated_bytes() >> 20,
      o.shm_name.empty() ? std::string("anonymous memory")
                         : absl::StrCat("shared-memory segment ", s->shm_name()),
      (huge < 0 ? std::string("huge pages unknown")
                : absl::StrFormat("%d MB in huge pages", huge >> 20)) +
          absl::StrCat(" (", policy.setting,
                       huge == 0 && !policy.allows
                           ? absl::StrCat(": a deployer enables them with `", policy.remedy, "`")
                           : std::string(),
                       ")"),
      ResidentBytes() >> 20));
  return s;
}

}  // namespace ss::expert
