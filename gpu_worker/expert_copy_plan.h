// What the streamed path (ARCHITECTURE.md "Where the routed experts run") copies host -> device
// for one layer, as plain data: where each expert's weights come from, where they go in a
// staging-ring slot, and the copies that move a GROUP of consecutive experts, merged into as few
// copies as the memory allows. Plain C++ (no CUDA): the cuda backend's provider enqueues the
// copies; tests check them anywhere.
//
// Device layout. An expert on the device is `parts` blocks back to back (its slices of the
// intermediate dimension that this GPU computes, in slice order), each in the expert store's
// block layout (cpu_expert_worker/expert_store.h: w1, w1_scale, w3, w3_scale, w2, w2_scale,
// each piece 64-byte aligned; `tile_rows` as the store's). A part that comes from an expert
// store is copied as its whole block (one range); a part that comes from the model's own host
// weights (the checkpoint layout: row-major, whole experts) is copied piece by piece into the
// same block layout with tile_rows 0. Consecutive experts of a layer are consecutive in the slot,
// so a group whose store blocks are consecutive too is ONE copy per store.
//
// Threads: values; no shared state.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace ss::gpu {

// Offsets of one part's pieces inside its block, and the block's bytes.
struct PartBlockLayout {
  int64_t w1 = 0, w1_scale = 0, w3 = 0, w3_scale = 0, w2 = 0, w2_scale = 0;
  int64_t bytes = 0;
};

// The expert store's block layout for a slice of `part_inter` rows of experts of width `dim`
// (common/expert_store_format.h ComputeExpertStoreGeometry: 64-byte aligned pieces in store
// order); its InvalidArgument for a geometry the store does not take.
absl::StatusOr<PartBlockLayout> CompactPartBlockLayout(int64_t dim, int64_t part_inter);

// Where one part of one expert is in host memory: either a whole block in the layout above
// (`block`, from an expert store), or the six checkpoint tensors (`pieces`, row-major).
struct HostPartSource {
  const uint8_t* block = nullptr;
  const uint8_t* w1 = nullptr;
  const uint8_t* w1_scale = nullptr;
  const uint8_t* w3 = nullptr;
  const uint8_t* w3_scale = nullptr;
  const uint8_t* w2 = nullptr;
  const uint8_t* w2_scale = nullptr;
};

// One host -> device copy: `bytes` from src to the slot's byte `dst_offset`.
struct HostCopy {
  const uint8_t* src = nullptr;
  int64_t dst_offset = 0;
  int64_t bytes = 0;
};

// A layer's experts as this GPU streams them.
struct LayerStreamPlan {
  int64_t dim = 0, part_inter = 0;
  int parts = 0;             // 0: this GPU computes none of the layer's experts (its share is 0)
  int64_t tile_rows = 0;     // of every part
  PartBlockLayout part;      // each part's block
  int64_t expert_bytes = 0;  // parts x part.bytes
  int expert_begin = 0, expert_end = 0;  // the experts this GPU computes
  // sources[(e - expert_begin) * parts + p]
  std::vector<HostPartSource> sources;

  // The copies that bring experts [e0, e1) into a slot (expert e0 at offset 0), adjacent ranges
  // merged.
  std::vector<HostCopy> GroupCopies(int e0, int e1) const;
  int64_t GroupBytes(int e0, int e1) const { return (e1 - e0) * expert_bytes; }
};

// The groups of a layer's experts for slots of `experts_per_slot` experts: [begin, end) pairs
// in ascending order covering [expert_begin, expert_end).
std::vector<std::pair<int, int>> ExpertGroups(int expert_begin, int expert_end,
                                              int64_t experts_per_slot);

}  // namespace ss::gpu
