// The lightning indexer (spec §3.8, model::Indexer): the query's RoPE + Hadamard + FP4
// simulation, the head weights, and the scores of the compressed keys (bf16 rows, or the paged
// cache's MXFP4 keys in place). The top-k of the scores is indexer_topk.h. Contract: README.md.
//
// Numerics: the sum over heads, exact double in the reference, is an error-free (TwoSum) fp32
// reduction, equal to the exact sum rounded once except in vanishingly rare cases; the q·k dot
// products are plain fp32, which is exact here because both sides are FP4-simulated (a few
// significant bits per product, 32-element blocks with nearby power-of-two scales).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/limits.h"
#include "gpu_worker/kernels/paged_kv.h"
#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// In place on each of `rows` rows of n bf16 values (n a power of two in [32, kHadamardMaxDim]),
// one warp per row: y = bf16(float(H_n·x)·fp32(n^−1/2)) (codecs.cc HadamardInplace; the
// butterfly in double in the reference's order, so exact and bit-identical; fp64 = false runs it
// in fp32, exact only while no partial sum rounds), then FP4sim_32 (codecs.cc Fp4SimInplace).
cudaError_t HadamardFp4SimInplace(bf16_t* x, int64_t rows, int64_t n, bool fp64,
                                  cudaStream_t stream);

// The indexer query after wq_b (a Linear8, fp8_linear.h's Fp8Linear), in place on
// q bf16 [T, heads, head_dim]: RoPE on the last rope_dim dims of each head (rope.h's ApplyRope
// with the [T, rope_dim/2] cos/sin table of the tokens' positions from
// RopeCosSin), then HadamardFp4SimInplace over each head. One launch: the warp that transforms a
// head rotates it first, in registers (the same bits as the two calls).
cudaError_t IndexerPrepQ(bf16_t* q, int64_t T, int64_t heads, int64_t head_dim, int64_t rope_dim,
                         const float* cos_t, const float* sin_t, bool hadamard_fp64,
                         cudaStream_t stream);

// The head weights: w[i] = bf16(bf16(proj[i])·scale), proj = x·weights_projᵀ in fp32
// (head.h's LinearBf16F32), scale = fp32(index_head_dim^−1/2 · index_n_heads^−1/2) computed in
// double.
cudaError_t IndexerWeightScale(const float* proj, int64_t n, float scale, bf16_t* w,
                               cudaStream_t stream);

// scores[t·n_cols + j] for j < n_cols: −inf where j ≥ (positions[t] + 1)/ratio (the block is not
// complete at the query), else bf16(Σ_h bf16(relu(bf16(q_t,h · k_j))·w_t,h)) as a float.
// q: bf16 [T, heads, head_dim] (IndexerPrepQ); w: bf16 [T, heads]; keys: bf16 rows of head_dim
// values, token t reading its key j at keys + (key_row_offset[t] + j)·head_dim (key_row_offset
// int64 [T], or nullptr for 0: one sequence). Tokens of different sequences may share a call.
// heads ≤ kIndexerMaxHeads, head_dim ≤ kIndexerMaxHeadDim, n_cols < 2^31. Each score is one
// warp's: a task of 8 consecutive keys (4, 2 or 1 while the call has fewer than 1024 tasks, so
// that short rows still spread), q staged once per 4-warp block, the tasks of a row dealt to
// its blocks' warps in turn. Grid (T, blocks per row): a task per warp while that fits in one
// wave of resident blocks (SMs × what shared memory allows, at most 4 per SM: device attributes
// only, so capture-safe); a decode token's long row takes one full wave (16384 columns: 512
// blocks on an H200); many tokens take 4 tasks a warp. Ineligible columns are filled with −inf
// without reading q or keys. Where every factor is a bf16 value in [2^−60, 2^60) (or 0) the dot is
// summed with fma, whose single rounding equals fl(acc + fl(q·k)) because the 16-bit product is
// exact; otherwise with the separate product and sum. No choice here changes any score.
struct IndexerScoresParams {
  const bf16_t* q = nullptr;                // [T, heads, head_dim]
  const bf16_t* w = nullptr;                // [T, heads]
  const bf16_t* keys = nullptr;             // rows of head_dim values
  const int64_t* key_row_offset = nullptr;  // [T], or nullptr for 0
  const int64_t* positions = nullptr;       // [T]
  int64_t T = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t ratio = 0;
  int64_t n_cols = 0;
  float* scores = nullptr;  // [T, n_cols]
};
cudaError_t IndexerScores(const IndexerScoresParams& p, cudaStream_t stream);

// IndexerScores over one sequence's MXFP4 keys (paged_kv.h) [0, n_cols) read in place
// from the pool (g, table: device, n_table entries), each staged tile decoded as KvGatherKeys
// decodes it (keys outside the table read as 0): the same scores, bit for bit, as KvGatherKeys
// followed by IndexerScores, without the bf16 copy. head_dim = g.key_dim (a multiple of 32, at
// most kIndexerMaxHeadDim). The query side and the output are KvIndexerScoresParams; the keys'
// table is the call's (KvIndexerScoresTokens: per token).
struct KvIndexerScoresParams {
  const bf16_t* q = nullptr;           // [T, heads, g.key_dim]
  const bf16_t* w = nullptr;           // [T, heads]
  KvGeom g;                            // the pool
  const int64_t* positions = nullptr;  // [T]
  int64_t T = 0;
  int64_t heads = 0;
  int64_t ratio = 0;
  int64_t n_cols = 0;
  float* scores = nullptr;  // [T, n_cols]
};
cudaError_t KvIndexerScores(const KvIndexerScoresParams& p, const int32_t* table, int64_t n_table,
                            cudaStream_t stream);

// KvIndexerScores for tokens of several sequences in one launch (a decode step's batch): token t
// reads the keys of the table at tokens[t] (device KvTokens: table, n_table), so its row is the
// one a KvIndexerScores call over its own sequence gives, bit for bit. n_cols is every row's:
// columns past a token's eligible keys score −inf, so a shorter sequence's row is its own row
// padded with −inf, whose top-k selections are the same while k ≤ its eligible keys.
cudaError_t KvIndexerScoresTokens(const KvIndexerScoresParams& p, const KvToken* tokens,
                                  cudaStream_t stream);

const void* HadamardFp4Kernel();
const void* IndexerWeightScaleKernel();
const void* IndexerScoresKernel();
const void* KvIndexerScoresKernel();

}  // namespace ss::cuda
