#include "gpu_worker/expert_copy_plan.h"

#include <algorithm>

#include "common/expert_store_format.h"
#include "common/status.h"

namespace ss::gpu {
namespace {

constexpr int64_t kMxGroup = 32;

// Appends a copy, merged into the previous one when both its source and destination continue it.
void Append(std::vector<HostCopy>* out, const uint8_t* src, int64_t dst, int64_t bytes) {
  if (bytes <= 0) return;
  if (!out->empty()) {
    HostCopy& last = out->back();
    if (last.src + last.bytes == src && last.dst_offset + last.bytes == dst) {
      last.bytes += bytes;
      return;
    }
  }
  out->push_back({src, dst, bytes});
}

}  // namespace

absl::StatusOr<PartBlockLayout> CompactPartBlockLayout(int64_t dim, int64_t part_inter) {
  ASSIGN_OR_RETURN(const ExpertStoreGeometry g,
                   ComputeExpertStoreGeometry(dim, part_inter, 1, 0, 1, 0));
  return PartBlockLayout{.w1 = g.w1,
                         .w1_scale = g.w1_scale,
                         .w3 = g.w3,
                         .w3_scale = g.w3_scale,
                         .w2 = g.w2,
                         .w2_scale = g.w2_scale,
                         .bytes = g.expert_stride};
}

std::vector<HostCopy> LayerStreamPlan::GroupCopies(int e0, int e1) const {
  std::vector<HostCopy> out;
  const int64_t w13 = part_inter * dim / 2, w13s = part_inter * dim / kMxGroup;
  const int64_t w2b = dim * part_inter / 2, w2s = dim * part_inter / kMxGroup;
  for (int e = e0; e < e1; ++e) {
    for (int p = 0; p < parts; ++p) {
      const HostPartSource& s = sources[static_cast<size_t>((e - expert_begin) * parts + p)];
      const int64_t dst = (e - e0) * expert_bytes + p * part.bytes;
      if (s.block != nullptr) {
        Append(&out, s.block, dst, part.bytes);
        continue;
      }
      Append(&out, s.w1, dst + part.w1, w13);
      Append(&out, s.w1_scale, dst + part.w1_scale, w13s);
      Append(&out, s.w3, dst + part.w3, w13);
      Append(&out, s.w3_scale, dst + part.w3_scale, w13s);
      Append(&out, s.w2, dst + part.w2, w2b);
      Append(&out, s.w2_scale, dst + part.w2_scale, w2s);
    }
  }
  return out;
}

std::vector<std::pair<int, int>> ExpertGroups(int expert_begin, int expert_end,
                                              int64_t experts_per_slot) {
  std::vector<std::pair<int, int>> groups;
  const int64_t g = std::max<int64_t>(1, experts_per_slot);
  for (int64_t e = expert_begin; e < expert_end; e += g) {
    groups.emplace_back(static_cast<int>(e),
                        static_cast<int>(std::min<int64_t>(expert_end, e + g)));
  }
  return groups;
}

}  // namespace ss::gpu
