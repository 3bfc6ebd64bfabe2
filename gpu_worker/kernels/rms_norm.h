// RMSNorm of activation rows (spec §3.3, model::RmsNorm), alone or followed by the FP8
// activation quantisation of its output (fp8_linear.h's QuantizeActE4m3). Contract: README.md.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// y[r] = bf16(g ⊙ x[r] · rsqrt(mean(x[r]²) + eps)), fp32 math. x, y: bf16 [rows, n];
// g: fp32 [n].
cudaError_t RmsNorm(const bf16_t* x, const float* g, int64_t rows, int64_t n, float eps, bf16_t* y,
                    cudaStream_t stream);

// RmsNorm, then QuantizeActE4m3 of its output, in one launch (one block per row): y, q and s
// are the same bits as the two calls give (q: e4m3 [rows, n], s: fp32 [rows, ceil(n/128)]).
// For n = 1024, 2048 and 4096 the row stays in registers and shared memory between the two
// (one read of x and g).
cudaError_t RmsNormQuant(const bf16_t* x, const float* g, int64_t rows, int64_t n, float eps,
                         bf16_t* y, e4m3_t* q, float* s, cudaStream_t stream);

const void* RmsNormKernel();
const void* RmsNormQuantKernel();
const void* RmsNormQuantRegsKernel();  // RmsNormQuant for n = 4096 (and 1024, 2048)

}  // namespace ss::cuda
