// The MoE experts' SwiGLU activation (spec §3.11, moe.cc SwiGlu), elementwise, alone or followed
// by the FP8 activation quantisation of its output (fp8_linear.h's QuantizeActE4m3). Contract:
// README.md.
//
// Numerics: exp is CUDA's fp32 expf (≤ 2 ulp from glibc's); the output is rounded to bf16, which
// hides that.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

//   v = row_weight·v when row_weights != nullptr (routed experts; the shared expert passes
//   nullptr), out = bf16(v).
// gate/up rows start every in_stride elements (a fused [rows, 2n] w13 output: up = gate + n,
// in_stride = 2n); out is [rows, n] contiguous; row_weights: fp32 [rows] or nullptr.
cudaError_t SwiGluF32(const float* gate, const float* up, int64_t in_stride,
                      const float* row_weights, int64_t rows, int64_t n, float limit, bf16_t* out,
                      cudaStream_t stream);
cudaError_t SwiGluBf16(const bf16_t* gate, const bf16_t* up, int64_t in_stride,
                       const float* row_weights, int64_t rows, int64_t n, float limit, bf16_t* out,
                       cudaStream_t stream);

// SwiGluBf16 without row weights (the shared expert), then QuantizeActE4m3 of its output, in one
// launch: out, q and s are the same bits as the two calls give (q [rows, n], s [rows,
// ceil(n/128)]).
cudaError_t SwiGluBf16Quant(const bf16_t* gate, const bf16_t* up, int64_t in_stride, int64_t rows,
                            int64_t n, float limit, bf16_t* out, e4m3_t* q, float* s,
                            cudaStream_t stream);

const void* SwiGluF32Kernel();
const void* SwiGluBf16Kernel();
const void* SwiGluBf16QuantKernel();

}  // namespace ss::cuda
