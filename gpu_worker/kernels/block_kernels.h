// CUDA kernels of one decoder block around its GEMMs (spec §3.3–§3.5, §3.11, §5.3):
// hyper-connection collapse and expand, the per-head q normalisation, RoPE, the FP8 simulation of
// the raw-KV nope dims, the router and the SwiGLU activation. Built for sm_86 + compute_86 PTX
// only (no FP8 tensor-core instructions, wgmma, TMA or clusters).
//
// Contract shared by every function here (STYLE.md "Interfaces"):
//  * Pointers are device pointers; activations are bf16 bit patterns (uint16_t), row-major.
//  * Nothing allocates; the only workspace (router logits) is caller-owned.
//  * Each call enqueues its kernel(s) on `stream` and returns the launch's cudaError_t
//    (cudaErrorInvalidValue, with nothing launched, for a size outside the static limits below).
//    Shape validation against the model config happens one layer up.
//  * Zero rows is a no-op returning cudaSuccess.
//
// Numerics: each kernel mirrors the operation order and roundings of the CPU reference in
// common/model/*.cc and common/rope.cc, with every fp32 operation rounded to nearest (explicit
// __f*_rn intrinsics, --fmad=false), so there is no FMA contraction. Two kinds of difference
// remain, both measured by tests/gpu_worker/block_kernels_test.cc:
//  * Sums the reference forms exactly in double and rounds once (DotF32, MeanSquare: the HC
//    mixes and RMS, the router logits) are fp32 warp/block tree sums here.
//  * exp, log1p, cos and sin of the reference are glibc's float functions (or double cos/sin of
//    an fp32 angle). Here they are evaluated in double on the fp32 argument and rounded once to
//    fp32, as close as a GPU gets to glibc's (nearly) correctly rounded results; CUDA's
//    expf/cosf are within 1–2 ulp. The cost is a handful of FP64 operations per token (HC
//    sigmoid/Sinkhorn, router scores, one cos/sin table per step). SwiGLU is elementwise over the
//    intermediate size, so it uses fp32 expf (≤ 2 ulp); its output is rounded to bf16, which hides
//    that (bit-identical on all 70k test elements).
// Measured on an H200 running the compute_86 PTX: HC y/z, HcPost, the q norm, RoPE, FP8sim and
// SwiGLU bit-identical to the reference on tiny-a and Flash shapes but for ≤ 3e-4 of HC outputs;
// the HC split and router logits/weights within 3e-7 relative; router index sequences equal.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/kernels.h"

namespace ss::cuda {

// Static limits (shared-memory and register arrays).
inline constexpr int64_t kHcMaxMult = 8;            // hc (4 in every released model)
inline constexpr int64_t kRouterMaxExperts = 1024;  // E (256 in Flash)
inline constexpr int64_t kRouterMaxTopK = 32;       // k (6 in Flash)

// ---- Manifold-constrained hyper-connections (spec §3.3) ---------------------------------------
//
// A token's residual state is `hc` streams of `dim` bf16 values, stream-major: streams is
// [T, hc, dim]. HC parameters are the checkpoint's fp32 tensors: fn [mix, hc·dim], base [mix],
// scale [3] for blocks (mix = (2 + hc)·hc), and fn [hc, hc·dim], base [hc], scale [1] for the head.

// Collapse before a sublayer, one block per token (model::HcPre):
//   r = 1/sqrt(mean(X²) + norm_eps) over all hc·dim values, mix = (X·fnᵀ)·r,
//   pre = sigmoid(mix·scale[0] + base) + hc_eps, post = 2·sigmoid(...), comb = Sinkhorn of
//   mix·scale[2] + base (row softmax + hc_eps, column normalisation, then sinkhorn_iters − 1
//   row/column rounds; one thread, the reference's loop order), y = bf16(Σ_s pre[s]·X_s).
// Outputs: y bf16 [T, dim]; pre, post fp32 [T, hc]; comb fp32 [T, hc, hc] with comb[t][j][k] the
// weight of old stream j in new stream k (the reference's HcSplit layout), for the HcPost below.
// hc ≤ kHcMaxMult. Up to 64 tokens (decode) it runs as two kernels, the mixes' sums spread over
// blocks per token and parked in y's row, then Sinkhorn and y: the same arithmetic, so the same
// bits as the one-block-per-token kernel used for longer chunks. Where y's row holds them
// ((mix·32 + 256)·4 ≤ dim·2 bytes, hc·dim % 32 == 0: Flash's 4 × 4096) each of a mix row's 32
// lane sums and the 256 partial sums of squares is its own chain and the butterflies run in the
// second kernel; otherwise one block per mix row. At hc = 4 the second kernel is specialised
// (unrolled one-warp Sinkhorn, pre/post in the same warp's spare lanes; the same operations).
cudaError_t HcPre(const uint16_t* streams, const float* fn, const float* base, const float* scale,
                  int64_t T, int64_t hc, int64_t dim, int64_t sinkhorn_iters, float hc_eps,
                  float norm_eps, uint16_t* y, float* pre, float* post, float* comb,
                  cudaStream_t stream);

// HcPre with its Sinkhorn taken off the critical path (decode): where HcPreDefersComb holds
// (hc = 4 and the decode split, so at most 64 tokens), HcPreDeferComb writes y, pre and post as
// HcPre does (they do not depend on the Sinkhorn's rounds) and, in comb_logits [T, 16], the
// Sinkhorn's inputs mix·scale[2] + base; HcCombSinkhorn (one warp per token, on any stream) then
// turns them into HcPre's comb in place, with the same operations: the same bits.
// HcPreDeferComb returns cudaErrorInvalidValue where HcPreDefersComb does not hold, HcCombSinkhorn
// for hc ≠ 4.
bool HcPreDefersComb(int64_t T, int64_t hc, int64_t dim, const uint16_t* y);
cudaError_t HcPreDeferComb(const uint16_t* streams, const float* fn, const float* base,
                           const float* scale, int64_t T, int64_t hc, int64_t dim,
                           int64_t sinkhorn_iters, float hc_eps, float norm_eps, uint16_t* y,
                           float* pre, float* post, float* comb_logits, cudaStream_t stream);
cudaError_t HcCombSinkhorn(float* comb, int64_t T, int64_t hc, int64_t sinkhorn_iters, float hc_eps,
                           cudaStream_t stream);
// HcPreDeferComb, then the sublayer's input norm RmsNormQuant(y, g, T, dim, rms_eps, xn, q, s)
// (kernels.h): for dim = 4096 (Flash) in HcPreDeferComb's second kernel, from y's row in
// registers, else as a launch of its own. The same bits as the two calls. With `sync` (T
// counters, zero, left zero; not shared by overlapping calls) and dim = 4096 the two kernels are
// one launch, whose last block per token finishes it, while that launch's grid is resident at
// once (a token or two: its blocks hold the finish's registers); more tokens take the two.
cudaError_t HcPreDeferCombNormQuant(const uint16_t* streams, const float* fn, const float* base,
                                    const float* scale, int64_t T, int64_t hc, int64_t dim,
                                    int64_t sinkhorn_iters, float hc_eps, float norm_eps,
                                    uint16_t* y, float* pre, float* post, float* comb_logits,
                                    const float* g, float rms_eps, uint16_t* xn, uint8_t* q,
                                    float* s, uint32_t* sync, cudaStream_t stream);

// Expand after a sublayer (model::HcPost): for each new stream k,
//   out[t][k] = bf16(post[t][k]·x[t] + acc), acc = comb[t][0][k]·R[t][0] + Σ_{j=1..hc−1}
//   comb[t][j][k]·R[t][j] summed in j order.
// x: sublayer output bf16 [T, dim]; residual R and out: bf16 [T, hc, dim]. `out` may alias
// `residual` (each thread reads its element of every old stream before writing any new one).
cudaError_t HcPost(const uint16_t* x, const uint16_t* residual, const float* post,
                   const float* comb, int64_t T, int64_t hc, int64_t dim, uint16_t* out,
                   cudaStream_t stream);

// HcPost on its operands struct (kernels.h), with out_f32 if set.
cudaError_t HcPost(const uint16_t* x, int64_t T, const HcPostOperands& hp, cudaStream_t stream);

// HcPost with the sublayer output formed per element instead of read, in one launch (the same
// bits as the launches they replace; hp.out must not alias hp.residual):
//   HcPostF32: x = bf16(x_f32) (RoundF32ToBf16 of a TP rank's all-reduced sum, then HcPost);
//   MoeCombineHcPost: x = MoeCombineBf16(shared, routed) (either may be null), then HcPost;
//   MoeCombineF32HcPost: x = MoeCombineF32(shared, routed) (all-reduced partials), then HcPost.
cudaError_t HcPostF32(const float* x_f32, int64_t T, const HcPostOperands& hp, cudaStream_t stream);
cudaError_t MoeCombineHcPost(const uint16_t* shared, const float* routed, int64_t T,
                             const HcPostOperands& hp, cudaStream_t stream);
cudaError_t MoeCombineF32HcPost(const float* shared, const float* routed, int64_t T,
                                const HcPostOperands& hp, cudaStream_t stream);

// Block 0's input (model::Model::EmbedStreams): streams[t][s] = rows[t] for every stream s < hc,
// rows: the tokens' embedding rows, bf16 [T, dim] (the checkpoint's bytes, gathered on the host);
// streams: bf16 [T, hc, dim]. A copy: the same bits as rounding the reference's fp32 streams.
cudaError_t HcEmbedStreams(const uint16_t* rows, int64_t T, int64_t hc, int64_t dim,
                           uint16_t* streams, cudaStream_t stream);

// Head collapse (final norm input and MTP head, model::HcHead): the same r and mix with the head's
// fn [hc, hc·dim], a = sigmoid(mix·scale[0] + base) + hc_eps, z = bf16(Σ_s a[s]·X_s), no Sinkhorn.
// z: bf16 [T, dim]. hc ≤ kHcMaxMult.
cudaError_t HcHead(const uint16_t* streams, const float* fn, const float* base, const float* scale,
                   int64_t T, int64_t hc, int64_t dim, float hc_eps, float norm_eps, uint16_t* z,
                   cudaStream_t stream);

// ---- Query / KV path pieces (spec §3.4, §3.5, §5.3) ---------------------------------------------

// Per-head q normalisation as the demo does it with bf16 tensor ops (the reference's
// HeadNormBf16 in common/model/attention.cc), in place on x bf16 [rows, head_dim] (rows = T ·
// n_heads), one warp per row:
//   sum = Σ bf16(x²) (fp32 here, exact double in the reference), mean = bf16(sum·fp32(1/n)),
//   r = bf16(1/sqrt(bf16(mean + eps))), x = bf16(x·r).
cudaError_t HeadRmsNormBf16(uint16_t* x, int64_t rows, int64_t head_dim, float eps,
                            cudaStream_t stream);

// The cos/sin table of `n` positions (RopeCosSin in common/rope.h): for pair i of row r the
// angle is the fp32 product float(positions[r])·freqs[i], and cos/sin are taken of that fp32
// angle in double and rounded once to fp32, which reproduces the host table bit for bit (the
// host takes std::cos of the same angle in double). freqs: fp32 [pairs] (the layer's table from
// LayerRopeFrequencies); positions: int64 [n]; cos_out, sin_out: fp32 [n, pairs].
// `fp32_trig` = true uses cosf/sinf instead, a diagnostic: they differ from the host table by
// 1 ulp in 10–17% of entries, which after the bf16 rounding of RoPE changed 1 of 196,608 rotated
// values; the double-precision table was bit-identical to the host's in every entry.
//
// Why a table and not cos/sin inside ApplyRope: one table per step serves the query, the raw KV,
// the compressor and indexer rotations and the output de-rotation of every head, so the FP64
// trigonometry runs once per (position, pair), and a host-computed table can be passed instead.
cudaError_t RopeCosSin(const float* freqs, int64_t pairs, const int64_t* positions, int64_t n,
                       bool fp32_trig, float* cos_out, float* sin_out, cudaStream_t stream);
// RopeCosSin (double-precision trigonometry) of the same positions for two frequency sets (the
// step's plain and compressed layers), in one launch: the same bits as the two calls.
cudaError_t RopeCosSinPair(const float* freqs0, const float* freqs1, int64_t pairs,
                           const int64_t* positions, int64_t n, float* cos0, float* sin0,
                           float* cos1, float* sin1, cudaStream_t stream);

// Interleaved-pair RoPE on the LAST rope_dim dims of each head, in place (ss::ApplyRope):
//   v[2i]' = bf16(v[2i]·c − v[2i+1]·s), v[2i+1]' = bf16(v[2i]·s + v[2i+1]·c), fp32 products,
// with s negated for the inverse (output de-rotation). x: bf16 [T, heads, head_dim]; row t uses
// cos/sin row t of the [T, rope_dim/2] tables (from RopeCosSin or the host). rope_dim even and
// ≤ head_dim.
cudaError_t ApplyRope(uint16_t* x, int64_t T, int64_t heads, int64_t head_dim, int64_t rope_dim,
                      const float* cos_t, const float* sin_t, bool inverse, cudaStream_t stream);

// HeadRmsNormBf16 of every head of x bf16 [T, heads, head_dim], then ApplyRope (forward) of its
// last rope_dim dims, by the same warp in one launch: the same bits as the two calls (at
// head_dim 512 with the row in registers).
cudaError_t HeadRmsNormRope(uint16_t* x, int64_t T, int64_t heads, int64_t head_dim, float eps,
                            int64_t rope_dim, const float* cos_t, const float* sin_t,
                            cudaStream_t stream);

// FP8 simulation (ss::Fp8SimInplace, spec §5.3), in place on x[r·row_stride + 0..n) for each row
// r, in blocks of `block` along the row (the last one may be partial): s = Pow2Scale(amax, 1e-4,
// 448), v = clamp(x/s, ±448), v = e4m3(v) if round_e4m3 else bf16(v), x = bf16(v·s).
// Raw KV: rows = T, row_stride = head_dim, n = head_dim − rope_dim, block = 64. One warp per
// (row, block).
cudaError_t Fp8SimInplace(uint16_t* x, int64_t rows, int64_t row_stride, int64_t n, int64_t block,
                          bool round_e4m3, cudaStream_t stream);

// ---- MoE (spec §3.11) ---------------------------------------------------------------------------

// The router (model::Route): logits = fp32(x)·fp32(gate)ᵀ (fp32 sums, lane l of a warp adding
// i ≡ l (mod 32) in order, then a butterfly; up to 8 tokens one block per (token, expert) forms
// the products at once and one warp adds them, the same bits), s = sqrt(softplus(logits)) with
// softplus(z) = z for z > 20 else log1p(exp(z)), then per token (one warp):
//  * hash layers (tid2eid != nullptr): indices = tid2eid[token_ids[t]] (int32 [vocab, k]); the
//    ids must lie in [0, E) (checked at load time);
//  * learned layers (tid2eid == nullptr): the top-k of s + bias (fp32 [E]) in descending order,
//    equal values ordered by the lower expert index (the reference's stable sort);
//  * weights[t][i] = s[idx_i] / (Σ_i s[idx_i], summed in i order) · route_scale.
// x: bf16 [T, dim]; gate: bf16 [E, dim]; token_ids: int64 [T] (read only for hash layers);
// logits: caller-owned fp32 workspace [T, E] (holds the logits afterwards); indices: int32 [T, k];
// weights: fp32 [T, k]. E ≤ kRouterMaxExperts, k ≤ min(E, kRouterMaxTopK).
cudaError_t Route(const uint16_t* x, const uint16_t* gate, const float* bias,
                  const int32_t* tid2eid, const int64_t* token_ids, int64_t T, int64_t E,
                  int64_t dim, int64_t k, float route_scale, float* logits, int32_t* indices,
                  float* weights, cudaStream_t stream);

// SwiGLU with the demo's clamp (moe.cc SwiGlu), elementwise over [rows, n]:
//   g = min(g, limit), u = clamp(u, −limit, limit) (limit 0: no clamp), v = g/(1 + exp(−g))·u,
//   v = row_weight·v when row_weights != nullptr (routed experts; the shared expert passes
//   nullptr), out = bf16(v).
// gate/up rows start every in_stride elements (a fused [rows, 2n] w13 output: up = gate + n,
// in_stride = 2n); out is [rows, n] contiguous; row_weights: fp32 [rows] or nullptr.
cudaError_t SwiGluF32(const float* gate, const float* up, int64_t in_stride,
                      const float* row_weights, int64_t rows, int64_t n, float limit, uint16_t* out,
                      cudaStream_t stream);
cudaError_t SwiGluBf16(const uint16_t* gate, const uint16_t* up, int64_t in_stride,
                       const float* row_weights, int64_t rows, int64_t n, float limit,
                       uint16_t* out, cudaStream_t stream);

// SwiGluBf16 without row weights (the shared expert), then QuantizeActE4m3 of its output, in one
// launch: out, q and s are the same bits as the two calls give (q [rows, n], s [rows,
// ceil(n/128)]).
cudaError_t SwiGluBf16Quant(const uint16_t* gate, const uint16_t* up, int64_t in_stride,
                            int64_t rows, int64_t n, float limit, uint16_t* out, uint8_t* q,
                            float* s, cudaStream_t stream);

// Entry points of the kernels above, for attribute queries (ptxVersion) in tests.
const void* HcPreKernel();
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
const void* HeadRmsNormBf16Kernel();
const void* RopeCosSinKernel();
const void* RopeCosSinPairKernel();
const void* ApplyRopeKernel();
const void* Fp8SimInplaceKernel();
const void* RouterLogitsKernel();
const void* RouterLogitsRowKernel();  // Route's logits up to 8 tokens
const void* RouterSelectKernel();
const void* SwiGluF32Kernel();
const void* SwiGluBf16Kernel();
const void* SwiGluBf16QuantKernel();
const void* HeadRmsNormRopeKernel();
const void* HeadRmsNormRopeRegsKernel();  // head_dim 512

}  // namespace ss::cuda
