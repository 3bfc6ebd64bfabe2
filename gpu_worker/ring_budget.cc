#include "gpu_worker/ring_budget.h"

#include "absl/strings/str_cat.h"
#include "common/gpu_prefill_flags.h"
#include "gpu_worker/memory_plan.h"

namespace ss::gpu {

RingBudget ComputeRingBudget(const RingBudgetInputs& in) {
  RingBudget b;
  b.in = in;
  b.left_bytes =
      in.free_bytes - in.reserve_bytes - in.state_bytes - in.streamed_workspace_bytes - in.kv_bytes;
  b.ring_bytes = kBaseGpuPrefillRingMiB << 20;
  if (in.resident_experts || !in.fills_device) return b;
  for (const int64_t mib : kAutoGpuPrefillRingMiB) {
    if ((mib << 20) <= b.left_bytes) {
      b.ring_bytes = mib << 20;
      break;
    }
  }
  return b;
}

std::string RingBudget::Describe() const {
  const std::string ring = absl::StrCat(ring_bytes >> 20, " MiB");
  if (in.resident_experts) return absl::StrCat(ring, ": routed experts are resident");
  if (!in.fills_device) {
    return absl::StrCat(ring, ": the KV pool is a given size (--kv_tokens), not the device's rest");
  }
  return absl::StrCat(ring, ": free ", GiB(in.free_bytes), " - reserve ", GiB(in.reserve_bytes),
                      " - compressor states ", GiB(in.state_bytes), " - streamed workspace ",
                      MiB(in.streamed_workspace_bytes), " - KV for ", in.kv_tokens, " tokens ",
                      GiB(in.kv_bytes), " leave ", GiB(left_bytes));
}

}  // namespace ss::gpu
