// CUDA kernels of the GPU worker (spec §3, §5), built for sm_86 + compute_86 PTX only: no FP8
// tensor-core instructions, no wgmma, TMA or clusters. FP8 values are decoded in registers and
// multiplied in fp32.
//
// Every kernel takes raw device pointers, sizes, a stream and caller-owned workspace, never
// allocates, and returns the launch's cudaError_t; shape validation happens one layer up
// (STYLE.md "Interfaces"). Activations are bf16 ([rows, n] row-major), weights are the
// checkpoint's bytes ([out, in] e4m3 with ue8m0 128x128 block scales).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::cuda {

// y[r] = bf16(g ⊙ x[r] · rsqrt(mean(x[r]²) + eps)), fp32 math. g: fp32 [n].
cudaError_t RmsNorm(const uint16_t* x, const float* g, int64_t rows, int64_t n, float eps,
                    uint16_t* y, cudaStream_t stream);

// Per-row activation quantisation of spec §5.2: 1x128 blocks, power-of-two scales from the
// fp32 bits of amax·(1/448) (amax floored at 1e-4), q = e4m3(clamp(x/s, ±448)).
// q: [rows, n] e4m3 bytes, s: [rows, ceil(n/128)] fp32.
cudaError_t QuantizeActE4m3(const uint16_t* x, int64_t rows, int64_t n, uint8_t* q, float* s,
                            cudaStream_t stream);

// Linear8 (spec §5.2) on quantised activations: y[r, o] = bf16(Σ_b (Σ_{i∈b} q·w) · s_a · s_w).
// Bandwidth-bound GEMV path for decode (rows small): one warp per output feature reads each
// weight byte once for all rows. The e4m3 products are exact as in the reference; they are
// summed in another order (per-lane partials scaled per block, one warp reduction), so results
// agree up to fp32 summation order.
cudaError_t Fp8Linear(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                      const uint8_t* w_scale, int64_t out, int64_t in, uint16_t* y,
                      cudaStream_t stream);

// Addresses of the kernels' entry points, for attribute queries (ptxVersion) in tests.
const void* RmsNormKernel();
const void* QuantizeActE4m3Kernel();
const void* Fp8LinearKernel();

}  // namespace ss::cuda
