// The attention's grouped output projection (spec §3.10, wo_a) with the weights kept in FP8.
// Contract: README.md.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gpu_worker/kernels/shared_memory.h"
#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// z[t][g·rank + r] = bf16(Σ_i o[t][g·group_in + i] · Wa[g·rank + r][i]) with fp32 accumulation,
// Wa = the dequantised wo_a, decoded in registers from the checkpoint's e4m3 bytes
// [groups·rank, group_in] and ue8m0 128×128 block scales [ceil(groups·rank/128), group_in/128]:
// e4m3·2^(s−127), exactly the bf16 value the demo dequantises to. o: bf16 [T, groups·group_in]
// (the attention output after the inverse RoPE); z: bf16 [T, groups·rank]. Decode (T ≤ 8, rank
// a multiple of 16): the tensor cores (bf16 m16n8k16 mma.sync, the weights decoded to bf16 in
// registers) with K split over a block's warps, as Fp8Gemv; more tokens (rank a multiple of 128):
// a GEMM on the tensor cores (64-token x 128-feature tiles, as Fp8Gemm, the codes decoded to bf16
// in registers); otherwise one warp per output row reads the weight row once for up to 8 tokens
// at a time. Each sums in fp32 in its own order.
// group_in must be a multiple of 128, o and wo_a 16-byte aligned.
cudaError_t GroupedOutputProjection(const bf16_t* o, int64_t T, int64_t groups, int64_t rank,
                                    int64_t group_in, const e4m3_t* wo_a, const ue8m0_t* wo_a_scale,
                                    bf16_t* z, cudaStream_t stream);

// The opt-in of the GEMM kernel (more than 8 tokens), for PrepareKernels (prepare.h).
std::vector<SharedMemoryOptIn> GroupedOutputProjectionOptIns();

const void* GroupedOutputProjectionKernel();      // T > 8, rank not a multiple of 128
const void* GroupedOutputProjectionGemmKernel();  // T > 8
const void* GroupedOutputProjectionMmaKernel();   // T ≤ 8

}  // namespace ss::cuda
