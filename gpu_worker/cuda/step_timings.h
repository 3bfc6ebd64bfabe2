// A step's StageTimings (backend.h) from CUDA events recorded in the step's stream (StepMarks):
// kMarks marks per layer, read after the step's final wait, so timing adds no host
// synchronisation and runs inside a captured graph as well. Per layer:
//   attention  = LayerStart..AttnEnd, less the attention's all-reduce (AttnArBegin..AttnArEnd);
//   moe_cpu    = the routed experts' host seconds (RoutedExpertsProvider::Seconds);
//   moe_gpu    = AttnEnd..LayerEnd, less moe_cpu and the MoE's all-reduce (MoeArBegin..MoeArEnd),
//                at least 0;
//   allreduce  = the two all-reduces (all_reduces: TP > 1; else 0).
// One step at a time, from the step's thread; the events are the object's and grow only.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "gpu_worker/backend.h"

namespace ss::gpu::cuda_backend_internal {

enum Mark : int {
  kLayerStart,
  kAttnArBegin,
  kAttnArEnd,
  kAttnEnd,
  kMoeArBegin,
  kMoeArEnd,
  kLayerEnd,
  kMarks
};

class StepMarks {
 public:
  StepMarks() = default;
  StepMarks(const StepMarks&) = delete;
  StepMarks& operator=(const StepMarks&) = delete;
  ~StepMarks();

  // Before a step that is timed: `timings`' per-layer vectors set to n_layers zeros, and an
  // event for every mark of n_layers layers.
  absl::Status Prepare(int n_layers, StageTimings* timings);
  // Mark m of layer l on `stream`: under capture an event-record node (cudaEventRecordExternal;
  // a plain record would only order the capture, and the flag is refused outside one), otherwise
  // a record.
  cudaError_t Record(int l, int m, cudaStream_t stream, bool capturing) {
    return cudaEventRecordWithFlags(events_[l * kMarks + m], stream,
                                    capturing ? cudaEventRecordExternal : cudaEventRecordDefault);
  }
  // After the step's final wait: `timings` from the marks (above) and `host_seconds(l)`, the
  // routed experts' host time of layer l. An unreadable mark counts 0.
  void Fill(int n_layers, bool all_reduces, absl::FunctionRef<double(int)> host_seconds,
            StageTimings* timings);

 private:
  double Ms(int l, int a, int b);  // seconds between two marks of layer l

  std::vector<cudaEvent_t> events_;
};

}  // namespace ss::gpu::cuda_backend_internal
