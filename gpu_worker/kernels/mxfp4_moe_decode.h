// The routed experts resident on the GPU at decode (a few tokens): what FakeQuantE4m3(x) +
// MoeBuildRouting + Mxfp4MoeGroup (mxfp4_moe.h) write into y, for T·K <= 64 routes, as two
// memory-bound GEMV kernels that read each chosen expert's weights once. Contract: README.md.
//
// Work split. The choices' slots name at most min(T·K, n_slots) distinct experts; every block
// finds "its" expert itself (the i-th distinct valid slot in ascending order, i = blockIdx.y,
// from the T·K slots loaded to shared memory; blocks past the last distinct slot return), so the
// launch sizes depend on T·K, n_slots and the layout only (graph-capture safe, no host reads).
//   Up:   one block per (expert, part, 64 intermediate rows); each of its 8 warps owns 8 rows of
//         w1 and the same 8 rows of w3 for every route to the expert, so that gate and up of one
//         element meet in one lane: h[route, part·part_inter + n] = bf16(w · SwiGLU(g, u)).
//   Down: one block per (expert, 128 output features); each warp owns 16 rows of w2 over
//         K = parts·part_inter, part by part: y[route, n].
// Each block first quantises its routes' activation rows (x for up, h for down: Linear4's 1x128
// e4m3 blocks, the arithmetic of QuantizeBlock128, so the codes and scales are FakeQuantE4m3's)
// into shared memory; each warp streams its 16 weight rows (16 x 64 bytes a K-block, with the
// rows' four ue8m0 scale bytes) through a 4-stage cp.async pipeline of its own, the first stages
// issued before the quantisation. Routes go 4 at a time (an expert with more routes streams its
// weights again per 4; shared memory for min(T·K, 4) routes, fewer when dim is large).
//
// Numerics (bit for bit the grouped path's, argued here). Every term of Linear4 is formed exactly
// and the group partials are summed exactly, so only the accumulation order could differ, and it
// is the same. Per 32-wide K group, the 32 products are summed by two m16n8k16 mma.sync with
// f16 operands and fp32 accumulation, from zero: A = 16 weight rows, each e2m1 code decoded to the
// f16 of its value times 2^-14 (the code's 3 magnitude bits as the f16's low exponent bits and
// top mantissa bit, exact, 0.5 an f16 subnormal); B = up to 8 routes, each e4m3 activation code
// as the f16 of its value times 2^-8 (E4m3x2ToF16x2, exact). Every product is the e4m3·e2m1
// product times 2^-22, an exact multiple of 2^-32, so the group's sum is exact while it and the
// first mma's half of it stay below 2^14 block units in magnitude (2^24 multiples of the smallest
// product; the tensor cores' products are exact and their fp32 sums keep 24 bits below the
// largest term): the same sum Mxfp4MoeGroup forms from the bf16 values (e4m3 · s_act) on its
// tensor cores, exact under the same bound (its two mmas split the group's 32 elements
// differently: elements 0..3 and 4..7 of each lane's 8, here 0,4,1,5 and 2,6,3,7). The partial p is
// then added as acc = fma(p, 2^(S−127) · s_act·2^22, acc) in K order: the factor is a power of two,
// so p times it is exactly Mxfp4MoeGroup's partial, and the fma is its fma(p_group, 2^(S−127), acc)
// — the same rounding — whenever that factor is an fp32 number: s_act·2^22·2^(S−127) < 2^128 (it is
// never below 2^-127, s_act >= 2^-22), for example whenever |x| < 2^100 and S < 141. Everything
// after the sum is the grouped path's code: bf16 rounding of g and u, clamp, silu with CUDA's expf,
// the routing weight multiplied before the bf16 rounding of a, h quantised in 1x128 blocks (here by
// the down kernel when it loads h; the up kernel writes bf16(a)), y rounded to bf16 when
// round_output_bf16. Where a partial passes 2^14 block units the two paths' tensor cores may round
// it differently (neither is then Linear4's exact sum rounded once).
//
// Determinism: each route's row of y comes from one fixed sequence of operations (no atomics),
// whatever the other routes are.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gpu_worker/kernels/mxfp4_moe.h"
#include "gpu_worker/kernels/shared_memory.h"
#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// Largest T·K the decode path takes.
inline constexpr int kMxfp4MoeDecodeMaxRoutes = 64;

// One layer's resident experts for a decode step. Device pointers; the caller owns every buffer.
// Alignment: x, h and base 16 bytes, y 4 bytes; 1 <= K <= kMxfp4MoeMaxTopK, T·K <=
// kMxfp4MoeDecodeMaxRoutes, n_slots in [0, kMxfp4MoeMaxExperts], the layout as
// Mxfp4ExpertLayout states; else cudaErrorInvalidValue with nothing launched. T = 0 or n_slots = 0
// launch nothing. The kernels take up to 96 KiB of dynamic shared memory: PrepareKernels
// (prepare.h) must have run on the device.
struct Mxfp4MoeDecodeParams {
  const bf16_t* x = nullptr;       // [T, dim], the MoE input NOT quantised (Linear4's
                                   //   quantisation, FakeQuantE4m3's arithmetic, is applied here)
  const int32_t* slots = nullptr;  // [T, K]: each choice's slot among the resident experts; a
                                   //   value outside [0, n_slots) (−1: not resident) is skipped
  const float* weights = nullptr;  // [T, K] routing weights
  int64_t T = 0;
  int K = 0;
  int n_slots = 0;                // experts at slots [0, n_slots): slot s at base + s·expert_bytes
  const uint8_t* base = nullptr;  // Mxfp4ExpertLayout (parts, tile_rows 0/8/16, offsets)
  Mxfp4ExpertLayout layout;
  bf16_t* h = nullptr;  // workspace [T·K, parts·part_inter]: row t·K + k gets bf16(a) of choice k
  float* y = nullptr;   // [T·K, dim]: row t·K + k written for each choice with a slot in range;
                        //   the other rows are not touched
  float limit = 10.0f;            // swiglu_limit
  bool round_output_bf16 = true;  // y = fp32(bf16(...)): the expert is whole (parts cover I)
};
cudaError_t Mxfp4MoeDecode(const Mxfp4MoeDecodeParams& p, cudaStream_t stream);

// The opt-ins of the decode kernels, for PrepareKernels.
std::vector<SharedMemoryOptIn> Mxfp4MoeDecodeOptIns();

const void* Mxfp4MoeDecodeUpKernel();    // x quantisation, w1/w3, SwiGLU, routing weight -> h
const void* Mxfp4MoeDecodeDownKernel();  // h quantisation, w2 -> y

}  // namespace ss::cuda
