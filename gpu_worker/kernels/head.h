// fp32 linears on bf16 inputs (model::LinearF32: the compressors' wkv/wgate, the indexer's
// weights_proj, the LM head) and greedy sampling over logits (spec §3.12). Contract: README.md.
//
// Numerics: the sums, exact double in the reference, are fp32 (per-lane partials, then a warp
// tree; in the mma's order for prefill): equal to the reference up to fp32 summation order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gpu_worker/kernels/shared_memory.h"
#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// y[r·ldy + o] = Σ_i x[r][i]·w[o][i] in fp32 (model::LinearF32: the compressors' wkv/wgate, the
// indexer's weights_proj before its bf16 rounding, the LM head). x: bf16 [rows, in]; w: bf16
// [out, in]; y: fp32, row r at y + r·ldy (ldy ≥ out). Up to 8 token rows (decode): a
// bandwidth-bound GEMV, one warp per output feature summing its lanes' products in order, then a
// warp tree. More rows (prefill; in a multiple of 64): a GEMM on the tensor cores (bf16 products,
// exact in fp32, summed in the mma's order). Either equals the reference up to fp32 summation
// order. in must be a multiple of 8 and x, w 16-byte aligned (16-byte loads).
cudaError_t LinearBf16F32(const bf16_t* x, int64_t rows, int64_t in, const bf16_t* w, int64_t out,
                          float* y, int64_t ldy, cudaStream_t stream);
// LinearBf16F32 of two weight matrices on the same x (a compressor's wkv and wgate) in one launch:
// the same bits as the two calls (each output's sums do not depend on the launch).
struct Bf16F32PairMatrix {
  const bf16_t* w = nullptr;  // [out, in]
  int64_t out = 0;
  float* y = nullptr;  // row r at y + r·ldy
  int64_t ldy = 0;     // ≥ out
};
struct LinearBf16F32PairParams {
  const bf16_t* x = nullptr;  // [rows, in]
  int64_t rows = 0;
  int64_t in = 0;
  Bf16F32PairMatrix m0;
  Bf16F32PairMatrix m1;
};
cudaError_t LinearBf16F32Pair(const LinearBf16F32PairParams& p, cudaStream_t stream);

// logits = fp32(u)·headᵀ for a range of vocabulary rows (vocab-parallel shards): head points at
// the range's first row ([n_rows, dim] bf16), logits row t at logits + t·ld (pass the full
// buffer offset by the range's first id to fill a [T, V] buffer shard by shard). u: bf16
// [T, dim] (the final RMSNorm output). The same kernel as LinearBf16F32.
cudaError_t LmHead(const bf16_t* u, int64_t T, int64_t dim, const bf16_t* head, int64_t n_rows,
                   float* logits, int64_t ld, cudaStream_t stream);

// Greedy sampling: ids[t] = id_base + argmax_j logits[t·ld + j] over j < n, equal values to the
// lower id, NaN ignored (−1 when a row has no non-NaN value); max_vals[t] (fp32, optional) gets
// the maximum, so per-shard results combine by (larger value, then lower id); nonfinite[t]
// (optional) is 1 when the row holds a NaN or +inf, else 0 (the host sampler refuses such a row:
// sampler.h). One block per row.
cudaError_t ArgmaxRows(const float* logits, int64_t T, int64_t n, int64_t ld, int64_t id_base,
                       int32_t* ids, float* max_vals, int32_t* nonfinite, cudaStream_t stream);

// The opt-in of the GEMM kernel (more than 8 rows: LinearBf16F32, LinearBf16F32Pair, LmHead), for
// PrepareKernels (prepare.h).
std::vector<SharedMemoryOptIn> LinearBf16F32OptIns();

const void* LinearBf16F32Kernel();
const void* LinearBf16F32GemmKernel();  // more than 8 rows
const void* ArgmaxKernel();

}  // namespace ss::cuda
