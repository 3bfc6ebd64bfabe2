#include "gpu_worker/cuda/step_timings.h"

#include <algorithm>

namespace ss::gpu::cuda_backend_internal {

StepMarks::~StepMarks() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

absl::Status StepMarks::Prepare(int n_layers, StageTimings* timings) {
  for (auto* v : {&timings->attention, &timings->moe_gpu, &timings->moe_cpu, &timings->allreduce}) {
    v->assign(n_layers, 0.0);
  }
  while (events_.size() < static_cast<size_t>(n_layers) * kMarks) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) {
      return absl::InternalError("cudaEventCreate (timing marks) failed");
    }
    events_.push_back(e);
  }
  return absl::OkStatus();
}

double StepMarks::Ms(int l, int a, int b) {
  float v = 0.0f;
  if (cudaEventElapsedTime(&v, events_[l * kMarks + a], events_[l * kMarks + b]) != cudaSuccess) {
    (void)cudaGetLastError();  // no figure; the error must not reach a later launch's check
    v = 0.0f;
  }
  return static_cast<double>(v) * 1e-3;
}

void StepMarks::Fill(int n_layers, bool all_reduces, absl::FunctionRef<double(int)> host_seconds,
                     StageTimings* timings) {
  for (int l = 0; l < n_layers; ++l) {
    const double ar_attn = all_reduces ? Ms(l, kAttnArBegin, kAttnArEnd) : 0.0;
    const double ar_moe = all_reduces ? Ms(l, kMoeArBegin, kMoeArEnd) : 0.0;
    const double host = host_seconds(l);
    timings->attention[l] = Ms(l, kLayerStart, kAttnEnd) - ar_attn;
    timings->moe_cpu[l] = host;
    timings->moe_gpu[l] = std::max(0.0, Ms(l, kAttnEnd, kLayerEnd) - host - ar_moe);
    timings->allreduce[l] = ar_attn + ar_moe;
  }
}

}  // namespace ss::gpu::cuda_backend_internal
