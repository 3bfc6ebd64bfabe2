// The query and raw-KV path's elementwise pieces (spec §3.4, §3.5, §5.3): the per-head q
// normalisation, the RoPE cos/sin tables and rotation, and the FP8 simulation of the raw KV's nope
// dims. Contract: README.md.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// Per-head q normalisation as the demo does it with bf16 tensor ops (the reference's
// HeadNormBf16 in common/model/attention.cc), in place on x bf16 [rows, head_dim] (rows = T ·
// n_heads), one warp per row:
//   sum = Σ bf16(x²) (fp32 here, exact double in the reference), mean = bf16(sum·fp32(1/n)),
//   r = bf16(1/sqrt(bf16(mean + eps))), x = bf16(x·r).
cudaError_t HeadRmsNormBf16(bf16_t* x, int64_t rows, int64_t head_dim, float eps,
                            cudaStream_t stream);

// The cos/sin table of `n` positions (RopeCosSin in common/rope.h): for pair i of row r the
// angle is the fp32 product float(positions[r])·freqs[i], and cos/sin are taken of that fp32
// angle in double and rounded once to fp32, which reproduces the host table bit for bit (the
// host takes std::cos of the same angle in double). freqs: fp32 [pairs] (the layer's table from
// LayerRopeFrequencies); positions: int64 [n]; cos_out, sin_out: fp32 [n, pairs].
// `fp32_trig` = true uses cosf/sinf instead, a diagnostic that does not reproduce the host table
// (1 ulp off in some entries).
//
// Why a table and not cos/sin inside ApplyRope: one table per step serves the query, the raw KV,
// the compressor and indexer rotations and the output de-rotation of every head, so the FP64
// trigonometry runs once per (position, pair), and a host-computed table can be passed instead.
cudaError_t RopeCosSin(const float* freqs, int64_t pairs, const int64_t* positions, int64_t n,
                       bool fp32_trig, float* cos_out, float* sin_out, cudaStream_t stream);
// RopeCosSin (double-precision trigonometry) of the same positions for two frequency sets (the
// step's plain and compressed layers), in one launch: the same bits as the two calls.
struct RopeTable {
  const float* freqs = nullptr;  // [pairs]
  float* cos = nullptr;          // [n, pairs]
  float* sin = nullptr;          // [n, pairs]
};
struct RopeCosSinPairParams {
  int64_t pairs = 0;
  const int64_t* positions = nullptr;  // [n]
  int64_t n = 0;
  RopeTable t0;
  RopeTable t1;
};
cudaError_t RopeCosSinPair(const RopeCosSinPairParams& p, cudaStream_t stream);

// Interleaved-pair RoPE on the LAST rope_dim dims of each head, in place (ss::ApplyRope):
//   v[2i]' = bf16(v[2i]·c − v[2i+1]·s), v[2i+1]' = bf16(v[2i]·s + v[2i+1]·c), fp32 products,
// with s negated for the inverse (output de-rotation). x: bf16 [T, heads, head_dim]; row t uses
// cos/sin row t of the [T, rope_dim/2] tables (from RopeCosSin or the host). rope_dim even and
// ≤ head_dim.
cudaError_t ApplyRope(bf16_t* x, int64_t T, int64_t heads, int64_t head_dim, int64_t rope_dim,
                      const float* cos_t, const float* sin_t, bool inverse, cudaStream_t stream);

// HeadRmsNormBf16 of every head of x bf16 [T, heads, head_dim], then ApplyRope (forward) of its
// last rope_dim dims, by the same warp in one launch: the same bits as the two calls (at
// head_dim 512 with the row in registers).
cudaError_t HeadRmsNormRope(bf16_t* x, int64_t T, int64_t heads, int64_t head_dim, float eps,
                            int64_t rope_dim, const float* cos_t, const float* sin_t,
                            cudaStream_t stream);

// FP8 simulation (ss::Fp8SimInplace, spec §5.3), in place on x[r·row_stride + 0..n) for each row
// r, in blocks of `block` along the row (the last one may be partial): s = Pow2Scale(amax, 1e-4,
// 448), v = clamp(x/s, ±448), v = e4m3(v) if round_e4m3 else bf16(v), x = bf16(v·s).
// Raw KV: rows = T, row_stride = head_dim, n = head_dim − rope_dim, block = 64. One warp per
// (row, block).
cudaError_t Fp8SimInplace(bf16_t* x, int64_t rows, int64_t row_stride, int64_t n, int64_t block,
                          bool round_e4m3, cudaStream_t stream);

const void* HeadRmsNormBf16Kernel();
const void* HeadRmsNormRopeKernel();
const void* HeadRmsNormRopeRegsKernel();  // head_dim 512
const void* RopeCosSinKernel();
const void* RopeCosSinPairKernel();
const void* ApplyRopeKernel();
const void* Fp8SimInplaceKernel();

}  // namespace ss::cuda
