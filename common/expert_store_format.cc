#include "common/expert_store_format.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/int_math.h"

namespace ss {
namespace {

constexpr int64_t kPieceAlign = 64;
constexpr int64_t kActBlock = 128;  // expert_kernels.h: a slice holds whole activation blocks
constexpr int64_t kMxGroup = 32;    // MXFP4 scale group
constexpr uint64_t kPage = 4096;

int64_t AlignUp(int64_t v) { return RoundUp(v, kPieceAlign); }

absl::Status Bad(const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat("expert store: ", why));
}

}  // namespace

std::string ExpertStoreSegmentName(std::string_view shm_name) {
  return std::string(shm_name) + "-store";
}

absl::StatusOr<ExpertStoreGeometry> ComputeExpertStoreGeometry(int64_t dim, int64_t inter,
                                                               int64_t num_experts, int slice_index,
                                                               int slice_count, int64_t tile_rows) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrFormat("expert store geometry (dim %d, I %d, E %d, slice %d/%d, tile_rows %d): %s",
                        dim, inter, num_experts, slice_index, slice_count, tile_rows, why));
  };
  if (dim <= 0 || inter <= 0 || num_experts <= 0 || dim % kMxGroup != 0) {
    return bad("dim, I and E must be > 0 and dim a multiple of 32");
  }
  if (slice_count < 1 || slice_index < 0 || slice_index >= slice_count) {
    return bad("need n >= 1 and 0 <= i < n");
  }
  if (inter % slice_count != 0 || (inter / slice_count) % kActBlock != 0) {
    return bad("I/n must be a multiple of 128");
  }
  const int64_t is = inter / slice_count;
  if (tile_rows != 0 && tile_rows != 8 && tile_rows != 16) return bad("tile_rows is 0, 8 or 16");
  if (tile_rows != 0 && (is % tile_rows != 0 || dim % tile_rows != 0)) {
    return bad("I/n and dim must be multiples of tile_rows");
  }
  ExpertStoreGeometry g;
  g.dim = dim;
  g.inter = inter;
  g.inter_slice = is;
  g.slice_index = slice_index;
  g.slice_count = slice_count;
  g.tile_rows = tile_rows;
  g.num_experts = num_experts;
  const int64_t w13 = is * dim / 2, w13s = is * dim / kMxGroup;
  const int64_t w2 = dim * is / 2, w2s = dim * is / kMxGroup;
  g.expert_slice_bytes = 2 * w13 + 2 * w13s + w2 + w2s;
  g.w1 = 0;
  g.w1_scale = AlignUp(w13);
  g.w3 = g.w1_scale + AlignUp(w13s);
  g.w3_scale = g.w3 + AlignUp(w13);
  g.w2 = g.w3_scale + AlignUp(w13s);
  g.w2_scale = g.w2 + AlignUp(w2);
  g.expert_stride = g.w2_scale + AlignUp(w2s);
  g.w2_stride = is / 2;
  g.w2_scale_stride = is / kMxGroup;
  return g;
}

uint64_t ExpertStoreDataOffset(uint32_t layer_count) {
  return RoundUp(kExpertStoreHeaderBytes + uint64_t{layer_count} * sizeof(ExpertStoreLayerEntry),
                 kPage);
}

uint64_t ExpertStoreBytes(const ExpertStoreGeometry& g, uint32_t layer_count) {
  return ExpertStoreDataOffset(layer_count) +
         uint64_t{layer_count} * static_cast<uint64_t>(g.num_experts * g.expert_stride);
}

void WriteExpertStoreLayout(uint8_t* base, uint64_t segment_bytes, const ExpertStoreGeometry& g,
                            const int* layers, uint32_t layer_count) {
  auto* h = reinterpret_cast<ExpertStoreHeader*>(base);
  h->format_version = kExpertStoreFormatVersion;
  h->header_bytes = sizeof(ExpertStoreHeader);
  h->layer_count = layer_count;
  h->dim = g.dim;
  h->inter = g.inter;
  h->inter_slice = g.inter_slice;
  h->slice_index = g.slice_index;
  h->slice_count = g.slice_count;
  h->tile_rows = g.tile_rows;
  h->num_experts = g.num_experts;
  h->expert_stride = g.expert_stride;
  h->w1 = g.w1;
  h->w1_scale = g.w1_scale;
  h->w3 = g.w3;
  h->w3_scale = g.w3_scale;
  h->w2 = g.w2;
  h->w2_scale = g.w2_scale;
  h->w2_stride = g.w2_stride;
  h->w2_scale_stride = g.w2_scale_stride;
  h->expert_slice_bytes = g.expert_slice_bytes;
  h->layer_table_offset = kExpertStoreHeaderBytes;
  h->data_offset = ExpertStoreDataOffset(layer_count);
  const uint64_t layer_bytes = static_cast<uint64_t>(g.num_experts * g.expert_stride);
  h->data_bytes = layer_bytes * layer_count;
  h->segment_bytes = segment_bytes;
  h->pid_namespace = PidNamespaceId();
  auto* table = reinterpret_cast<ExpertStoreLayerEntry*>(base + kExpertStoreHeaderBytes);
  for (uint32_t i = 0; i < layer_count; ++i) {
    table[i] = {layers[i], 0, h->data_offset + i * layer_bytes};
  }
}

void PublishExpertStore(uint8_t* base) {
  std::atomic_ref<uint64_t>(reinterpret_cast<ExpertStoreHeader*>(base)->magic)
      .store(kExpertStoreMagic, std::memory_order_release);
}

absl::StatusOr<const ExpertStoreHeader*> ParseExpertStore(const uint8_t* base,
                                                          uint64_t mapped_bytes) {
  if (mapped_bytes < sizeof(ExpertStoreHeader)) {
    return Bad(absl::StrCat(mapped_bytes, " bytes, smaller than the ", sizeof(ExpertStoreHeader),
                            "-byte header"));
  }
  const auto* h = reinterpret_cast<const ExpertStoreHeader*>(base);
  const uint64_t magic =
      std::atomic_ref<uint64_t>(const_cast<uint64_t&>(h->magic)).load(std::memory_order_acquire);
  if (magic == 0)
    return Bad("incomplete (its expert worker is still loading it, or died doing so)");
  if (magic != kExpertStoreMagic) {
    return Bad(absl::StrFormat("not an expert store (magic 0x%016x, expected 0x%016x)", magic,
                               kExpertStoreMagic));
  }
  if (h->format_version != kExpertStoreFormatVersion) {
    return Bad(absl::StrCat("format version ", h->format_version, ", this build reads version ",
                            kExpertStoreFormatVersion));
  }
  if (h->header_bytes != sizeof(ExpertStoreHeader)) {
    return Bad(absl::StrCat("header of ", h->header_bytes, " bytes, expected ",
                            sizeof(ExpertStoreHeader)));
  }
  absl::StatusOr<ExpertStoreGeometry> g = ComputeExpertStoreGeometry(
      h->dim, h->inter, h->num_experts, h->slice_index, h->slice_count, h->tile_rows);
  if (!g.ok()) return Bad(std::string(g.status().message()));
  const bool same = g->inter_slice == h->inter_slice && g->expert_stride == h->expert_stride &&
                    g->w1 == h->w1 && g->w1_scale == h->w1_scale && g->w3 == h->w3 &&
                    g->w3_scale == h->w3_scale && g->w2 == h->w2 && g->w2_scale == h->w2_scale &&
                    g->w2_stride == h->w2_stride && g->w2_scale_stride == h->w2_scale_stride &&
                    g->expert_slice_bytes == h->expert_slice_bytes;
  if (!same) return Bad("piece offsets or strides differ from the layout of its own sizes");
  if (h->layer_count < 1 || h->layer_count > kExpertStoreMaxLayers) {
    return Bad(absl::StrCat(h->layer_count, " layers (1-", kExpertStoreMaxLayers, ")"));
  }
  const uint64_t layer_bytes = static_cast<uint64_t>(g->num_experts * g->expert_stride);
  if (h->layer_table_offset != kExpertStoreHeaderBytes ||
      h->data_offset != ExpertStoreDataOffset(h->layer_count) ||
      h->data_bytes != layer_bytes * h->layer_count) {
    return Bad("layer table or data offsets differ from the format's");
  }
  if (h->segment_bytes != mapped_bytes || h->data_offset + h->data_bytes > mapped_bytes) {
    return Bad(absl::StrCat("header says ", h->segment_bytes, " bytes (data to ",
                            h->data_offset + h->data_bytes, "), the segment has ", mapped_bytes));
  }
  const ExpertStoreLayerEntry* table = ExpertStoreLayers(base);
  std::vector<int32_t> ids;
  for (uint32_t i = 0; i < h->layer_count; ++i) {
    if (table[i].layer < 0) return Bad(absl::StrCat("layer id ", table[i].layer, " < 0"));
    for (const int32_t id : ids) {
      if (id == table[i].layer) return Bad(absl::StrCat("layer ", id, " listed twice"));
    }
    ids.push_back(table[i].layer);
    if (table[i].offset != h->data_offset + i * layer_bytes) {
      return Bad(absl::StrCat("layer ", table[i].layer, " at offset ", table[i].offset,
                              ", expected ", h->data_offset + i * layer_bytes));
    }
  }
  return h;
}

}  // namespace ss
