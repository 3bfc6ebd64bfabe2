// CUDA kernels of the compressed-attention path and the model's head (spec §3.7, §3.8, §3.10,
// §3.12, §5.3): the fp32 linear the compressors, the indexer weights and the LM head use, the KV
// compressor (main and indexer) on its streaming state, the lightning indexer's query
// preparation, scores and top-k, the grouped output projection with wo_a kept in FP8, and greedy
// argmax. Built for sm_86 + compute_86 PTX only (no FP8 tensor-core instructions, wgmma, TMA or
// clusters).
//
// Contract shared by every function here (as block_kernels.h):
//  * Pointers are device pointers; activations are bf16 bit patterns (uint16_t), row-major.
//  * Nothing allocates; workspace and state are caller-owned.
//  * Each call enqueues its kernel(s) on `stream` and returns the launch's cudaError_t
//    (cudaErrorInvalidValue, with nothing launched, for a size, stride or alignment outside the
//    limits stated below). Shape validation against the model config happens one layer up.
//  * Zero rows (tokens, sequences) is a no-op returning cudaSuccess.
//  * Calls on one stream run in order; nothing here is safe to run concurrently with a call that
//    writes the same buffers (in particular one compressor state).
//
// Numerics: each kernel mirrors the operation order and roundings of the CPU reference
// (common/model/compressor.cc, indexer.cc, attention.cc, model.cc, common/codecs.cc), with every
// fp32 operation rounded to nearest (explicit __f*_rn intrinsics, --fmad=false). Where the
// reference forms a sum exactly in double and rounds once:
//  * the compressor (CompressorShape::fp64, the default) sums in double too: the softmax
//    denominator and pooled value (over tap groups in another order, see CompressorStep), the
//    RMS sum of squares and the Hadamard butterfly (in the reference's order), with exp as
//    float(exp(double)), the correctly rounded value glibc's expf approximates;
//  * the indexer's sum over heads uses an error-free (TwoSum) fp32 reduction, equal to the exact
//    sum rounded once except in vanishingly rare cases; its q·k dot products are plain fp32,
//    which is exact here because both sides are FP4-simulated (a few significant bits per
//    product, 32-element blocks with nearby power-of-two scales);
//  * the fp32 linears (LinearBf16F32, LmHead) and the grouped projection sum in fp32 (per-lane
//    partials, then a warp tree; in the mma's order for prefill): equal to the reference up to
//    fp32 summation order.
// Measured on an H200 running the compute_86 PTX (tests/gpu_worker/compressor_test.cc,
// indexer_test.cc, output_projection_test.cc, lm_head_test.cc):
// compressor entries and states, the indexer's q, weights, scores and selections, and the
// Hadamard + FP4sim bit-identical to the reference on tiny-a and Flash shapes (the compressor's
// fp32 mode and fp32 butterfly too); with the device's own fp32 V/G and Fp8Linear upstream still
// ≥ 99.99%; grouped projection ≥ 99.97% bit-identical, logits within 2e-7 relative, argmax and
// top-k equal (ties to the lower index).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::cuda {

// Static limits (shared-memory and register arrays).
inline constexpr int64_t kCompressorMaxDim = 512;   // d (512 main, 128 indexer in Flash)
inline constexpr int64_t kHadamardMaxDim = 512;     // a power of two in [32, 512]
inline constexpr int64_t kIndexerMaxHeads = 64;     // index_n_heads (64 in Flash)
inline constexpr int64_t kIndexerMaxHeadDim = 128;  // index_head_dim (128 in Flash)
inline constexpr int64_t kIndexerMaxTopK = 1024;    // index_topk (512 in Flash)

// ---- fp32 linear on bf16 inputs ----------------------------------------------------------------

// y[r·ldy + o] = Σ_i x[r][i]·w[o][i] in fp32 (model::LinearF32: the compressors' wkv/wgate, the
// indexer's weights_proj before its bf16 rounding, the LM head). x: bf16 [rows, in]; w: bf16
// [out, in]; y: fp32, row r at y + r·ldy (ldy ≥ out). Up to 8 token rows (decode): a
// bandwidth-bound GEMV, one warp per output feature summing its lanes' products in order, then a
// warp tree. More rows (prefill; in a multiple of 64): a GEMM on the tensor cores (bf16 products,
// exact in fp32, summed in the mma's order). Either equals the reference up to fp32 summation
// order. in must be a multiple of 8 and x, w 16-byte aligned (16-byte loads).
cudaError_t LinearBf16F32(const uint16_t* x, int64_t rows, int64_t in, const uint16_t* w,
                          int64_t out, float* y, int64_t ldy, cudaStream_t stream);
// LinearBf16F32 of two weight matrices on the same x (a compressor's wkv and wgate) in one launch:
// the same bits as the two calls (each output's sums do not depend on the launch).
cudaError_t LinearBf16F32Pair(const uint16_t* x, int64_t rows, int64_t in, const uint16_t* w0,
                              int64_t out0, float* y0, int64_t ldy0, const uint16_t* w1,
                              int64_t out1, float* y1, int64_t ldy1, cudaStream_t stream);

// ---- KV compressor (spec §3.7) ------------------------------------------------------------------
//
// Streaming state of one compressor of one sequence, as common/model/state.h CompressorState:
// kv and score fp32 [slots, width], width = coff·d, slots = coff·ratio, coff = 2 for ratio 4
// (overlapping: slots 0..3 the previous block, 4..7 the current one) and 1 otherwise. A new
// sequence starts from kv = 0, score = −inf (CompressorResetState).
//
// One step feeds the next n tokens of each sequence (a chunk of a prefill, or one decode token)
// and emits every block completing inside it, in block order: for sequence s with first
// position p = start[s] and end e = p + n, blocks j = p/ratio … e/ratio − 1. Block j's entry is
//   c = per-channel softmax pooling of its taps (scores G+ape, values V; ratio 4: the A half of
//       block j−1 and the B half of block j),
//   k = RMSNorm_g(bf16(c)), RoPE of the last rope_dim dims at position ratio·j,
//   main:    FP8sim_64 of the first d − rope_dim dims (e4m3 rounding if fp8_round),
//   indexer: Hadamard_d, one bf16 rounding, FP4sim_32 (HadamardFp4SimInplace below).
// Tokens before p are read from the state, which is then advanced to the reference's state
// after token e − 1 (slot writes and the ratio-4 "current → previous" copy). Three launches:
// the pooling, which leaves bf16(c) in the entry's row of `entries` (ratio ≥ 16: one block of
// 512 threads per 32 channels, lanes over the channels and warps over the taps, so that a
// ratio-128 entry spreads over d/32 SMs; ratio 4: a thread per channel), the rest of each entry
// (one block per entry, in place), then the state update.
//
// Arithmetic (`fp64`): true runs the reference's double sums (softmax denominator, pooled value,
// RMS sum of squares), exp as float(exp(double)) and the double Hadamard butterfly; false runs
// fp32 only: CUDA's expf (≤ 2 ulp), TwoSum-compensated fp32 sums (equal to the double sums
// rounded once, but for rare cases) and the fp32 butterfly. Both were bit-identical to the
// reference in every kernel test. fp32 is for GPUs with slow FP64 (RTX 3090: 1/64 of the FP32
// rate), where the fp64 path's 2·ratio double exps per channel (0.13M for a ratio-128 entry of
// d = 512) may show in decode steps in which many sequences complete a block; the cuda backend
// picks by the device's FP64 rate (gpu_worker/fp64_sums.h, --fp64_sums). Not timed on an RTX
// 3090; on an H200 the two run at the same speed (bench/RESULTS.md, session 15).

enum class CompressorKind { kMain, kIndexer };

struct CompressorShape {
  CompressorKind kind = CompressorKind::kMain;
  int64_t ratio = 0;     // m ≥ 1 (4: overlapping)
  int64_t head_dim = 0;  // d ≤ kCompressorMaxDim; indexer: a power of two in [32, 512]
  int64_t rope_dim = 0;  // even, ≤ d
  float norm_eps = 1e-6f;
  bool fp8_round = true;  // main: the current revision's e4m3 rounding in FP8sim
  bool fp64 = true;       // the reference's double arithmetic (see above); false: fp32 only
};

// A batch of sequences, each with its own state: device arrays of n_seqs entries (row_begin has
// n_seqs + 1). Sequence s owns the V/G rows row_begin[s] … row_begin[s+1] − 1 (its tokens in
// position order) and writes its (e/ratio − p/ratio) new entries to rows entry_begin[s] … of
// `entries`. max_new is a host-side upper bound of the new entries of any sequence (the grid
// size; e.g. n/ratio + 1 for chunks of at most n tokens).
struct CompressorBatch {
  int64_t n_seqs = 0;
  int64_t max_new = 0;
  const int64_t* start = nullptr;
  const int64_t* row_begin = nullptr;
  const int64_t* entry_begin = nullptr;
  float* const* kv_state = nullptr;     // [n_seqs] pointers to [slots, width]
  float* const* score_state = nullptr;  // [n_seqs] pointers to [slots, width]
};

// kv[0..n) = 0, score[0..n) = −inf.
cudaError_t CompressorResetState(float* kv, float* score, int64_t n, cudaStream_t stream);

// v, g: fp32 projections x·Wkvᵀ and x·Wgateᵀ (no ape: added here) of the batch's tokens, row r at
// v + r·ld and g + r·ld (ld ≥ width; a fused [rows, 2·width] GEMM output works with g = v + width,
// ld = 2·width). ape: fp32 [ratio, width]; norm: fp32 [d]; rope_freqs: fp32 [rope_dim/2] (the
// layer's table, LayerRopeFrequencies; cos/sin of float(ratio·j)·f_i are taken in double, as
// RopeCosSin does). entries: bf16 [*, d]. max_new < 2^27.
cudaError_t CompressorStep(const float* v, const float* g, int64_t ld, const float* ape,
                           const float* norm, const float* rope_freqs, const CompressorShape& shape,
                           const CompressorBatch& batch, uint16_t* entries, cudaStream_t stream);

// ---- Indexer (spec §3.8) ------------------------------------------------------------------------

// In place on each of `rows` rows of n bf16 values (n a power of two in [32, kHadamardMaxDim]),
// one warp per row: y = bf16(float(H_n·x)·fp32(n^−1/2)) (codecs.cc HadamardInplace; the
// butterfly in double in the reference's order, so exact and bit-identical; fp64 = false runs it
// in fp32, exact only while no partial sum rounds), then FP4sim_32 (codecs.cc Fp4SimInplace).
cudaError_t HadamardFp4SimInplace(uint16_t* x, int64_t rows, int64_t n, bool fp64,
                                  cudaStream_t stream);

// The indexer query after wq_b (a Linear8, Fp8Linear in kernels.h), in place on
// q bf16 [T, heads, head_dim]: RoPE on the last rope_dim dims of each head (ApplyRope of
// block_kernels.h with the [T, rope_dim/2] cos/sin table of the tokens' positions from
// RopeCosSin), then HadamardFp4SimInplace over each head. One launch: the warp that transforms a
// head rotates it first, in registers (the same bits as the two calls).
cudaError_t IndexerPrepQ(uint16_t* q, int64_t T, int64_t heads, int64_t head_dim, int64_t rope_dim,
                         const float* cos_t, const float* sin_t, bool hadamard_fp64,
                         cudaStream_t stream);

// The head weights: w[i] = bf16(bf16(proj[i])·scale), proj = x·weights_projᵀ in fp32
// (LinearBf16F32), scale = fp32(index_head_dim^−1/2 · index_n_heads^−1/2) computed in double.
cudaError_t IndexerWeightScale(const float* proj, int64_t n, float scale, uint16_t* w,
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
cudaError_t IndexerScores(const uint16_t* q, const uint16_t* w, const uint16_t* keys,
                          const int64_t* key_row_offset, const int64_t* positions, int64_t T,
                          int64_t heads, int64_t head_dim, int64_t ratio, int64_t n_cols,
                          float* scores, cudaStream_t stream);

// Per row t of scores [T, n_cols]: the k (≤ min(n_cols, kIndexerMaxTopK)) largest entries in
// descending order, equal scores ordered by the lower index (the reference's stable sort), an
// entry whose score is −inf (a masked block) given as −1: sel int32 [T, k]. Equivalently: the
// first k of the row sorted by (score, −index) descending, which every kernel computes exactly:
//  * counting (short rows, few of them: n_cols ≤ 8192 and T·n_cols² ≤ 2^26, e.g. a decode token
//    at up to 16K context, where the split path does not apply): every column's output slot is
//    its rank, the number of columns ahead of it, counted by 32-column blocks that each hold
//    the row in shared memory (grid (T, n_cols/32), one barrier, no sort);
//  * split (a few long rows, decode: T ≤ 8 and n_cols > 4096): three launches over the whole
//    GPU: blocks of 2048 columns add an 11-bit histogram of the keys' top bits into the row's,
//    then each finds the bin of the k-th largest and appends the entries at or above it (at
//    most 4096) to the row's candidates, then blocks of 64 candidates count the candidates
//    above each: its output slot. Where that bin holds more (scores close together), the
//    second launch appends the entries above the bin and histograms the next 11 bits of the
//    bin's entries, and its last block appends the ones at or above the k-th largest's second
//    bin. More candidates than that (thousands of scores equal in 22 key bits) and one block
//    runs the filtered kernel's code on the row. Needs `scratch`
//    (IndexerTopKScratchBytes, 384 KB, zeroed once when allocated; the launches leave it zeroed
//    for the next call), so calls sharing one scratch must not overlap: issue them on one stream,
//    or order them with events. Without scratch (null) such rows take the filtered kernel;
//  * filtered (otherwise, n_cols > 4096: long rows): one 1024-thread block per row, no
//    workspace: histograms of 11, 11 and 10 key bits (as many as needed) find a key prefix that
//    the k-th largest entry and at most 4096 entries reach; those go to shared memory, where a
//    radix select over (score, −index) finds the k winners, sorted by a bitonic sort. Rows of
//    ≤ 16384 columns are read once (into registers), longer ones once per pass. Fewer than k
//    finite scores, or more than 4096 − k entries equal to the k-th largest, are handled
//    exactly by their own passes;
//  * radix (otherwise): one block per row: an 8-bit radix select of the k-th largest score over
//    the row (≤ 4 passes), a pass collecting the entries above it and the lowest-index entries
//    equal to it, and a bitonic sort of the k winners in shared memory.
// NaN scores are not supported.
cudaError_t IndexerTopK(const float* scores, int64_t T, int64_t n_cols, int64_t k, int32_t* sel,
                        void* scratch, cudaStream_t stream);
int64_t IndexerTopKScratchBytes();

enum class IndexerTopKKind { kCounting, kRadix, kFiltered, kSplit };

// IndexerTopK on the kernel named by `kind` (tests and benchmarks: all give the same bits);
// counting needs n_cols ≤ 8192, split scratch, T ≤ 8 and n_cols ≤ 2048·65535.
cudaError_t IndexerTopKPath(const float* scores, int64_t T, int64_t n_cols, int64_t k,
                            IndexerTopKKind kind, int32_t* sel, void* scratch, cudaStream_t stream);

// ---- Grouped output projection (spec §3.10) -----------------------------------------------------

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
cudaError_t GroupedOutputProjection(const uint16_t* o, int64_t T, int64_t groups, int64_t rank,
                                    int64_t group_in, const uint8_t* wo_a,
                                    const uint8_t* wo_a_scale, uint16_t* z, cudaStream_t stream);

// ---- LM head and sampling (spec §3.12) ----------------------------------------------------------

// logits = fp32(u)·headᵀ for a range of vocabulary rows (vocab-parallel shards): head points at
// the range's first row ([n_rows, dim] bf16), logits row t at logits + t·ld (pass the full
// buffer offset by the range's first id to fill a [T, V] buffer shard by shard). u: bf16
// [T, dim] (the final RMSNorm output). The same kernel as LinearBf16F32.
cudaError_t LmHead(const uint16_t* u, int64_t T, int64_t dim, const uint16_t* head, int64_t n_rows,
                   float* logits, int64_t ld, cudaStream_t stream);

// Greedy sampling: ids[t] = id_base + argmax_j logits[t·ld + j] over j < n, equal values to the
// lower id, NaN ignored (−1 when a row has no non-NaN value); max_vals[t] (fp32, optional) gets
// the maximum, so per-shard results combine by (larger value, then lower id). One block per row.
cudaError_t ArgmaxRows(const float* logits, int64_t T, int64_t n, int64_t ld, int64_t id_base,
                       int32_t* ids, float* max_vals, cudaStream_t stream);

// Entry points of the kernels above, for attribute queries (ptxVersion) in tests.
const void* LinearBf16F32Kernel();
const void* LinearBf16F32GemmKernel();  // more than 8 rows
const void* CompressorResetKernel();
const void* CompressorPoolKernel();        // fp64
const void* CompressorPoolFp32Kernel();    // fp64 = false
const void* CompressorFinishKernel();      // fp64
const void* CompressorFinishFp32Kernel();  // fp64 = false
const void* CompressorUpdateKernel();
const void* HadamardFp4Kernel();
const void* IndexerWeightScaleKernel();
const void* IndexerScoresKernel();
const void* IndexerTopKKernel();
const void* IndexerTopKCountingKernel();
const void* IndexerTopKFilteredKernel();         // rows of ≤ 16384 columns
const void* IndexerTopKFilteredStreamKernel();   // longer rows
const void* IndexerTopKSplitRankKernel();        // the split path's last launch
const void* GroupedOutputProjectionKernel();     // T > 8, rank not a multiple of 128
const void* GroupedOutputProjectionGemmKernel();  // T > 8
const void* GroupedOutputProjectionMmaKernel();  // T ≤ 8
const void* ArgmaxKernel();

}  // namespace ss::cuda
