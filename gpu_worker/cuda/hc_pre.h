// A sublayer's input (SublayerInput): HcPre of the hc streams `streams` with the sublayer's
// hyper-connection weights `w`, then its input norm (weight g) and the quantisation: sc.xn and
// sc.qbuf / sc.sbuf, with sc.pre / sc.post / sc.comb for the sublayer's HcPost. Where
// s.defer_comb holds (decode: cuda::HcPreDefersComb) the norm runs in HcPre's last kernel and the
// Sinkhorn (comb, read only by the sublayer's HcPost) on kBranchHc, beside the sublayer: the
// HcPost must wait for that branch. Enqueues only; returns the CUDA error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/cuda/step.h"

namespace ss::gpu::cuda_backend_internal {

cudaError_t SublayerInput(StepState& s, const cuda::bf16_t* streams, const DevHc& w,
                          const float* g);

}  // namespace ss::gpu::cuda_backend_internal
