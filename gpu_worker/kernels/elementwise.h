// Elementwise combines and conversions of the step (spec §3.11's MoE combine; the interface's
// fp32 streams), one thread per element. Contract: README.md.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// y[i] = bf16(routed[i] + bf16(shared[i])), fp32 add, round to nearest even, i < n: the MoE
// combine of the reference (model::MoeForward: the shared expert's output is bf16, the routed sum
// fp32) on the all-reduced sums of the TP ranks' shared-expert and routed-expert partials.
cudaError_t MoeCombineF32(const float* shared, const float* routed, int64_t n, bf16_t* y,
                          cudaStream_t stream);

// y[i] = bf16(routed[i] + shared[i]) in fp32 (the MoE combine, model::MoeForward: the shared
// expert's bf16 output plus the routed experts' fp32 sum); a null shared or routed reads 0.
cudaError_t MoeCombineBf16(const bf16_t* shared, const float* routed, int64_t n, bf16_t* y,
                           cudaStream_t stream);

// y[i] = bf16(x[i]) (round to nearest even), i < n: the all-reduced sum rounded once, as the
// single-GPU projection rounds its fp32 accumulator.
cudaError_t RoundF32ToBf16(const float* x, int64_t n, bf16_t* y, cudaStream_t stream);

// y[i] = float(x[i]): bf16 streams to the interface's fp32 streams (exact).
cudaError_t Bf16ToF32(const bf16_t* x, int64_t n, float* y, cudaStream_t stream);

const void* MoeCombineF32Kernel();
const void* MoeCombineBf16Kernel();
const void* RoundF32ToBf16Kernel();
const void* Bf16ToF32Kernel();

}  // namespace ss::cuda
