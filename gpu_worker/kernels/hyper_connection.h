// Manifold-constrained hyper-connections (spec §3.3): the collapse of a token's residual
// streams before a sublayer (HcPre), their expand after it (HcPost and the launches that form the
// sublayer output on the way), block 0's input streams and the head's collapse. Contract:
// README.md.
//
// Numerics: the mixes' and RMS sums, which the reference forms exactly in double (DotF32,
// MeanSquare), are fp32 warp/block tree sums here; the sigmoid and Sinkhorn exps are evaluated in
// double on the fp32 argument and rounded once to fp32 (as close as a GPU gets to glibc's expf).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/limits.h"
#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// A token's residual state is `hc` streams of `dim` bf16 values, stream-major: streams is
// [T, hc, dim]. HC parameters are the checkpoint's fp32 tensors: fn [mix, hc·dim], base [mix],
// scale [3] for blocks (mix = (2 + hc)·hc), and fn [hc, hc·dim], base [hc], scale [1] for the head.

// Collapse before a sublayer (model::HcPre):
//   r = 1/sqrt(mean(X²) + norm_eps) over all hc·dim values, mix = (X·fnᵀ)·r,
//   pre = sigmoid(mix·scale[0] + base) + hc_eps, post = 2·sigmoid(...), comb = Sinkhorn of
//   mix·scale[2] + base (row softmax + hc_eps, column normalisation, then sinkhorn_iters − 1
//   row/column rounds; one thread, the reference's loop order), y = bf16(Σ_s pre[s]·X_s).
// Outputs: y bf16 [T, dim]; pre, post fp32 [T, hc]; comb fp32 [T, hc, hc] with comb[t][j][k] the
// weight of old stream j in new stream k (the reference's HcSplit layout), for the HcPost below.
// hc ≤ kHcMaxMult. Past 64 tokens at hc ≤ 4 a block takes 16 tokens (fn read once a tile), with
// every sum's chain and order as the one-block-per-token kernel's: the same bits. Up to 64 tokens
// (decode) it runs as two kernels, the mixes' sums spread over
// blocks per token and parked in y's row, then Sinkhorn and y: the same arithmetic, so the same
// bits as the one-block-per-token kernel used for longer chunks. Where y's row holds them
// ((mix·32 + 256)·4 ≤ dim·2 bytes, hc·dim % 32 == 0: Flash's 4 × 4096) each of a mix row's 32
// lane sums and the 256 partial sums of squares is its own chain and the butterflies run in the
// second kernel; otherwise one block per mix row. At hc = 4 the second kernel is specialised
// (unrolled one-warp Sinkhorn, pre/post in the same warp's spare lanes; the same operations).
struct HcPreParams {
  const bf16_t* streams = nullptr;  // [T, hc, dim]
  const float* fn = nullptr;        // [mix, hc·dim]
  const float* base = nullptr;      // [mix]
  const float* scale = nullptr;     // [3]
  int64_t T = 0;
  int64_t hc = 0;
  int64_t dim = 0;
  int64_t sinkhorn_iters = 0;
  float hc_eps = 0.0f;
  float norm_eps = 0.0f;
  bf16_t* y = nullptr;    // [T, dim]
  float* pre = nullptr;   // [T, hc]
  float* post = nullptr;  // [T, hc]
  float* comb = nullptr;  // [T, hc, hc]; HcPreDeferComb*: the Sinkhorn's inputs, [T, 16]
};
cudaError_t HcPre(const HcPreParams& p, cudaStream_t stream);

// HcPre with its Sinkhorn taken off the critical path (decode): where HcPreDefersComb holds
// (hc = 4 and the decode split, so at most 64 tokens), HcPreDeferComb writes y, pre and post as
// HcPre does (they do not depend on the Sinkhorn's rounds) and, in p.comb [T, 16], the
// Sinkhorn's inputs mix·scale[2] + base; HcCombSinkhorn (one warp per token, on any stream) then
// turns them into HcPre's comb in place, with the same operations: the same bits.
// HcPreDeferComb returns cudaErrorInvalidValue where HcPreDefersComb does not hold, HcCombSinkhorn
// for hc ≠ 4.
bool HcPreDefersComb(int64_t T, int64_t hc, int64_t dim, const bf16_t* y);
cudaError_t HcPreDeferComb(const HcPreParams& p, cudaStream_t stream);
cudaError_t HcCombSinkhorn(float* comb, int64_t T, int64_t hc, int64_t sinkhorn_iters, float hc_eps,
                           cudaStream_t stream);
// HcPreDeferComb, then the sublayer's input norm RmsNormQuant(p.y, nq.g, T, dim, nq.rms_eps,
// nq.xn, nq.q, nq.s) (rms_norm.h): for dim = 4096 (Flash) in HcPreDeferComb's second kernel, from
// y's row in registers, else as a launch of its own. The same bits as the two calls. With `sync` (T
// counters, zero, left zero; not shared by overlapping calls) and dim = 4096 the two kernels are
// one launch, whose last block per token finishes it, while that launch's grid is resident at
// once (a token or two: its blocks hold the finish's registers); more tokens take the two.
struct HcNormQuantParams {
  const float* g = nullptr;  // the norm's weight, fp32 [dim] (required)
  float rms_eps = 0.0f;
  bf16_t* xn = nullptr;      // [T, dim]
  e4m3_t* q = nullptr;       // [T, dim]
  float* s = nullptr;        // [T, ceil(dim/128)]
  uint32_t* sync = nullptr;  // optional: T counters, zero, left zero
};
cudaError_t HcPreDeferCombNormQuant(const HcPreParams& p, const HcNormQuantParams& nq,
                                    cudaStream_t stream);

// HcPost's operands other than the sublayer output x (HcPost below): the old streams
// `residual` [T, hc, dim], post [T, hc], comb [T, hc, hc] and the new streams `out` [T, hc, dim]
// (bf16; out must not alias residual in the kernels that take this struct). For the kernels that
// run HcPost on a result they have just formed. The kernels take it by value, so its bf16
// pointers are the raw bit patterns (Raw of a typed buffer).
struct HcPostOperands {
  const uint16_t* residual = nullptr;
  const float* post = nullptr;
  const float* comb = nullptr;
  int64_t hc = 0;
  int64_t dim = 0;
  uint16_t* out = nullptr;
  float* out_f32 = nullptr;  // set: also the new streams as fp32 (a stage's output), exact
};

// Expand after a sublayer (model::HcPost): for each new stream k,
//   out[t][k] = bf16(post[t][k]·x[t] + acc), acc = comb[t][0][k]·R[t][0] + Σ_{j=1..hc−1}
//   comb[t][j][k]·R[t][j] summed in j order.
// x: sublayer output bf16 [T, dim]; residual R and out: bf16 [T, hc, dim]. `out` may alias
// `residual` (each thread reads its element of every old stream before writing any new one).
cudaError_t HcPost(const bf16_t* x, const bf16_t* residual, const float* post, const float* comb,
                   int64_t T, int64_t hc, int64_t dim, bf16_t* out, cudaStream_t stream);

// HcPost on its operands struct, with out_f32 if set.
cudaError_t HcPost(const bf16_t* x, int64_t T, const HcPostOperands& hp, cudaStream_t stream);

// HcPost with the sublayer output formed per element instead of read, in one launch (the same
// bits as the launches they replace; hp.out must not alias hp.residual), x formed as by the
// combines and conversions of elementwise.h:
//   HcPostF32: x = bf16(x_f32) (RoundF32ToBf16 of a TP rank's all-reduced sum, then HcPost);
//   MoeCombineHcPost: x = MoeCombineBf16(shared, routed) (either may be null), then HcPost;
//   MoeCombineF32HcPost: x = MoeCombineF32(shared, routed) (all-reduced partials), then HcPost.
cudaError_t HcPostF32(const float* x_f32, int64_t T, const HcPostOperands& hp, cudaStream_t stream);
cudaError_t MoeCombineHcPost(const bf16_t* shared, const float* routed, int64_t T,
                             const HcPostOperands& hp, cudaStream_t stream);
cudaError_t MoeCombineF32HcPost(const float* shared, const float* routed, int64_t T,
                                const HcPostOperands& hp, cudaStream_t stream);

// Block 0's input (model::Model::EmbedStreams): streams[t][s] = rows[t] for every stream s < hc,
// rows: the tokens' embedding rows, bf16 [T, dim] (the checkpoint's bytes, gathered on the host);
// streams: bf16 [T, hc, dim]. A copy: the same bits as rounding the reference's fp32 streams.
cudaError_t HcEmbedStreams(const bf16_t* rows, int64_t T, int64_t hc, int64_t dim, bf16_t* streams,
                           cudaStream_t stream);

// Head collapse (final norm input and MTP head, model::HcHead): the same r and mix with the head's
// fn [hc, hc·dim], a = sigmoid(mix·scale[0] + base) + hc_eps, z = bf16(Σ_s a[s]·X_s), no Sinkhorn.
// z: bf16 [T, dim]. hc ≤ kHcMaxMult.
struct HcHeadParams {
  const bf16_t* streams = nullptr;  // [T, hc, dim]
  const float* fn = nullptr;        // [hc, hc·dim]
  const float* base = nullptr;      // [hc]
  const float* scale = nullptr;     // [1]
  int64_t T = 0;
  int64_t hc = 0;
  int64_t dim = 0;
  float hc_eps = 0.0f;
  float norm_eps = 0.0f;
  bf16_t* z = nullptr;  // [T, dim]
};
cudaError_t HcHead(const HcHeadParams& p, cudaStream_t stream);

const void* HcPreKernel();
const void* HcPreTiledKernel();  // HcPre past the decode split at hc <= 4: 16 tokens a block
const void* HcPostKernel();
const void* HcHeadKernel();
const void* HcPreMixKernel();          // HcPre's decode split
const void* HcPreFinishKernel();       // HcPre's decode split (the hc = 4 kernel)
const void* HcPreMixLanesKernel();     // HcPre's decode split, lane sums over blocks (Flash)
const void* HcPreFinishLanesKernel();  // HcPre's decode split, lane sums over blocks (Flash, hc 4)
const void* HcPreFinishDeferKernel();  // HcPreDeferComb's second kernel (Flash)
const void* HcPreFinishNormKernel();   // HcPreDeferCombNormQuant's second kernel (Flash)
const void* HcPreMixFinishKernel();    // HcPreDeferCombNormQuant's one launch (with sync)
const void* HcCombSinkhornKernel();    // HcCombSinkhorn
const void* HcEmbedStreamsKernel();

}  // namespace ss::cuda
