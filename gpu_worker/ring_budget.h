// What `--gpu-prefill-ring-mib auto` makes the streamed path's staging ring (streamed_prefill.h),
// computed the same way by the memory plan (memory_plan.h, from config.json) and by the cuda
// backend at start (from cudaMemGetInfo once the trunk's weights are on the device). Plain C++,
// no CUDA.
//
// A larger ring keeps the copy engine busy through more of a layer's attention, and takes device
// memory from the KV pool or from resident experts. So auto gives:
//   kBaseGpuPrefillRingMiB      when routed experts are resident (--gpu-experts not 0: a larger
//                               ring would trade their decode speed for prefill), or the worker
//                               does not fill its GPU (a --kv_tokens N: other processes may
//                               share the device);
//   else the largest R of kAutoGpuPrefillRingMiB with
//     free - reserve - states - streamed_workspace - kv(K) >= R,
//   and kBaseGpuPrefillRingMiB when none fits (the KV fit or the plan then reports the shortfall),
// with the terms of resident_budget.h: free the device bytes beside the trunk's weights; reserve
// the margin, the largest step's workspace and, in the plan, the stage links' buffers; states the
// compressor states of the planned sequences; kv(K) the KV pool of K = ResidentKvTokens tokens;
// and the streamed path's own workspace for a step of the worker's tokens.
//
// Threads: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>

namespace ss::gpu {

struct RingBudgetInputs {
  int64_t free_bytes = 0;
  int64_t reserve_bytes = 0;
  int64_t state_bytes = 0;
  int64_t kv_tokens = 0;  // K, for the description
  int64_t kv_bytes = 0;
  int64_t streamed_workspace_bytes = 0;
  bool resident_experts = false;
  bool fills_device = true;
};

struct RingBudget {
  RingBudgetInputs in;
  int64_t left_bytes = 0;  // free - reserve - states - streamed workspace - kv (negative: short)
  int64_t ring_bytes = 0;
  // "3072 MiB: free 15.76 GiB - reserve 5.38 GiB - compressor states 0.73 GiB - streamed
  // workspace 256.3 MiB - KV for 1048576 tokens 3.44 GiB leave 5.96 GiB", "1024 MiB: routed
  // experts are resident"
  std::string Describe() const;
};

// The rule above.
RingBudget ComputeRingBudget(const RingBudgetInputs& in);

}  // namespace ss::gpu
