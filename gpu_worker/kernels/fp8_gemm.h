// The prefill FP8 GEMM behind fp8_linear.h's Fp8Linear (more than kFp8GemvMaxRows rows), on the
// tensor cores with f16 operands decoded from e4m3 codes. Contract: README.md.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gpu_worker/kernels/shared_memory.h"
#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// Fp8Linear's function (fp8_linear.h: operands, numerics) for any number of rows: 32/64/128 x 128
// output tiles (the tallest that still fills about every SM), K in 128-blocks through a 3-stage
// cp.async pipeline of raw e4m3 codes (up to 97.5 KiB of dynamic shared memory, within SM 8.6's
// 99 KiB), decoded per fragment. Needs in % 128 == 0 and 16-byte aligned q and w; returns
// cudaErrorInvalidValue otherwise. Needs PrepareKernels (prepare.h) on the device. The
// fp32-output overload skips the final bf16 rounding (fp8_linear.h).
cudaError_t Fp8Gemm(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                    const ue8m0_t* w_scale, int64_t out, int64_t in, bf16_t* y,
                    cudaStream_t stream);
cudaError_t Fp8Gemm(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                    const ue8m0_t* w_scale, int64_t out, int64_t in, float* y, cudaStream_t stream);

// The opt-ins of Fp8Gemm's kernels (every tile height and output type), for PrepareKernels.
std::vector<SharedMemoryOptIn> Fp8GemmOptIns();

const void* Fp8GemmKernel();  // 128-row tiles

}  // namespace ss::cuda
