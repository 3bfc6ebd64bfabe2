// The expert store's shared-memory segment (ARCHITECTURE.md "Where the routed experts run": one
// copy of the experts in host RAM). An expert worker that serves calls on the segment NAME keeps
// its store (cpu_expert_worker/expert_store.h) in the segment ExpertStoreSegmentName(NAME),
// created exclusively with mode 0600 (common/shm_segment.h); a GPU worker on the same host maps it
// read-only (gpu_worker/expert_store_map.h) and copies experts from it by DMA. STYLE.md "Wire
// formats are versioned".
//
// Layout (byte offsets from the start of the segment; little-endian x86-64):
//
//   [0, 4096)                          ExpertStoreHeader: magic, version, owner, geometry
//   [4096, 4096 + 16·layer_count)      the layer table: ExpertStoreLayerEntry per held layer
//   [data_offset, data_offset + data_bytes)   the expert blocks, page-aligned start:
//       layer-major in table order, the num_experts blocks of a layer consecutive,
//       expert_stride bytes each; block = w1 | w1_scale | w3 | w3_scale | w2 | w2_scale at the
//       header's piece offsets (each 64-byte aligned), the compact slice layout of
//       expert_store.h (ComputeExpertStoreGeometry is its one definition)
//   [data_offset + data_bytes, segment_bytes)  padding (huge-page rounding)
//
// Writing order: the owner fields first (so a crash leaves a reclaimable leftover), then the
// geometry and the table, then the data, then the magic last (release store). A reader that sees
// the magic (acquire) sees a complete store; magic 0 means incomplete (being filled, or its
// writer died). The segment never changes after that until its owner unlinks it.
//
// Versioning. The first 24 bytes are ShmOwnerPrefix (magic, version, owner pid, start time) in
// every version; any other change bumps kExpertStoreFormatVersion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/shm_segment.h"

namespace ss {

inline constexpr uint64_t kExpertStoreMagic = 0x4f54535850455353ull;  // "SSEXPSTO" little-endian
inline constexpr uint32_t kExpertStoreFormatVersion = 1;
inline constexpr size_t kExpertStoreHeaderBytes = 4096;
inline constexpr uint32_t kExpertStoreMaxLayers = 4096;
inline constexpr ShmSegmentKind kExpertStoreSegmentKind{kExpertStoreMagic,
                                                        "splitserve expert store"};

// "<shm_name>-store": the store segment of the expert worker serving calls on `shm_name`.
std::string ExpertStoreSegmentName(std::string_view shm_name);

// One expert's slice inside its block, and the slice's geometry (the layout of
// cpu_expert_worker/kernels/expert_kernels.h ExpertSliceView, as byte offsets).
struct ExpertStoreGeometry {
  int64_t dim = 0;
  int64_t inter = 0;        // I, the whole expert's
  int64_t inter_slice = 0;  // I/n, what the store holds of each expert
  int32_t slice_index = 0, slice_count = 1;
  int64_t tile_rows = 0;  // 0, 8 or 16 (ExpertSliceView::tile_rows)
  int64_t num_experts = 0;
  int64_t expert_stride = 0;  // bytes between consecutive experts' blocks
  int64_t w1 = 0, w1_scale = 0, w3 = 0, w3_scale = 0, w2 = 0, w2_scale = 0;  // offsets in a block
  int64_t w2_stride = 0;           // bytes between w2 rows (tile_rows 0): inter_slice/2
  int64_t w2_scale_stride = 0;     // inter_slice/32
  int64_t expert_slice_bytes = 0;  // the six pieces without padding
};

// The compact layout of one expert's slice i of n: w1 [I/n, dim/2], w1_scale [I/n, dim/32], w3,
// w3_scale (same), w2 [dim, I/n/2], w2_scale [dim, I/n/32], each piece 64-byte aligned.
// InvalidArgument unless dim, I, E > 0, 0 <= i < n, n divides I into multiples of 128, dim is a
// multiple of 32 and tile_rows is 0, 8 or 16 dividing I/n and dim.
absl::StatusOr<ExpertStoreGeometry> ComputeExpertStoreGeometry(int64_t dim, int64_t inter,
                                                               int64_t num_experts, int slice_index,
                                                               int slice_count, int64_t tile_rows);

struct ExpertStoreLayerEntry {
  int32_t layer;  // the model layer id (expert_store.h "Layers")
  uint32_t reserved;
  uint64_t offset;  // of the layer's expert 0 block, from the segment start
};
static_assert(sizeof(ExpertStoreLayerEntry) == 16);

struct ExpertStoreHeader {
  // --- ShmOwnerPrefix: identical offsets in every version ---
  uint64_t magic;             // kExpertStoreMagic, written last (release); 0 = incomplete
  uint32_t format_version;    // kExpertStoreFormatVersion
  int32_t owner_pid;          // the expert worker
  uint64_t owner_start_time;  // its start time (ProcessStartTime)
  // --- version 1 ---
  uint32_t header_bytes;  // sizeof(ExpertStoreHeader)
  uint32_t layer_count;
  int64_t dim, inter, inter_slice;
  int32_t slice_index, slice_count;
  int64_t tile_rows, num_experts, expert_stride;
  int64_t w1, w1_scale, w3, w3_scale, w2, w2_scale;
  int64_t w2_stride, w2_scale_stride;
  int64_t expert_slice_bytes;
  uint64_t layer_table_offset;  // == header_bytes
  uint64_t data_offset;         // page-aligned, after the table
  uint64_t data_bytes;          // layer_count · num_experts · expert_stride
  uint64_t segment_bytes;       // the segment's size (>= data_offset + data_bytes)
  uint64_t pid_namespace;       // inode of the owner's /proc/self/ns/pid (0 if unknown)
  uint8_t reserved[kExpertStoreHeaderBytes - 200];
};
static_assert(sizeof(ExpertStoreHeader) == kExpertStoreHeaderBytes);
static_assert(offsetof(ExpertStoreHeader, magic) == offsetof(ShmOwnerPrefix, magic));
static_assert(offsetof(ExpertStoreHeader, format_version) == offsetof(ShmOwnerPrefix, version));
static_assert(offsetof(ExpertStoreHeader, owner_pid) == offsetof(ShmOwnerPrefix, owner_pid));
static_assert(offsetof(ExpertStoreHeader, owner_start_time) ==
              offsetof(ShmOwnerPrefix, owner_start_time));
static_assert(offsetof(ExpertStoreHeader, header_bytes) == 24);
static_assert(offsetof(ExpertStoreHeader, dim) == 32);
static_assert(offsetof(ExpertStoreHeader, slice_index) == 56);
static_assert(offsetof(ExpertStoreHeader, tile_rows) == 64);
static_assert(offsetof(ExpertStoreHeader, expert_stride) == 80);
static_assert(offsetof(ExpertStoreHeader, w1) == 88);
static_assert(offsetof(ExpertStoreHeader, w2_scale) == 128);
static_assert(offsetof(ExpertStoreHeader, w2_stride) == 136);
static_assert(offsetof(ExpertStoreHeader, expert_slice_bytes) == 152);
static_assert(offsetof(ExpertStoreHeader, layer_table_offset) == 160);
static_assert(offsetof(ExpertStoreHeader, data_offset) == 168);
static_assert(offsetof(ExpertStoreHeader, segment_bytes) == 184);
static_assert(offsetof(ExpertStoreHeader, pid_namespace) == 192);

// Where the data of a store of `layer_count` layers starts (page-aligned, after the table), and
// the bytes up to the end of its data.
uint64_t ExpertStoreDataOffset(uint32_t layer_count);
uint64_t ExpertStoreBytes(const ExpertStoreGeometry& g, uint32_t layer_count);

// Fills everything of a header but the ShmOwnerPrefix's magic and owner, and the table's
// entries for `layers` (layer_count ids, in block order), at `base` (ExpertStoreBytes(g, n) or
// more bytes, `segment_bytes` in all). The caller writes the owner first and
// PublishExpertStore after the data.
void WriteExpertStoreLayout(uint8_t* base, uint64_t segment_bytes, const ExpertStoreGeometry& g,
                            const int* layers, uint32_t layer_count);
// Marks the store complete: the magic, with release order.
void PublishExpertStore(uint8_t* base);

// The header and table of a mapped store of `mapped_bytes`, validated: magic (0: incomplete),
// version, header size, the geometry against ComputeExpertStoreGeometry of its own sizes, the
// table (distinct non-negative ids, each layer's blocks at its place inside the data), the data
// inside the mapping and segment_bytes == mapped_bytes. Owner liveness is the caller's check.
// FailedPrecondition with the reason otherwise. The magic is read with acquire order.
absl::StatusOr<const ExpertStoreHeader*> ParseExpertStore(const uint8_t* base,
                                                          uint64_t mapped_bytes);
inline const ExpertStoreLayerEntry* ExpertStoreLayers(const uint8_t* base) {
  return reinterpret_cast<const ExpertStoreLayerEntry*>(base + kExpertStoreHeaderBytes);
}

}  // namespace ss
