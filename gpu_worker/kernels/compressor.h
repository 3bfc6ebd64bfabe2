// The KV compressors (spec §3.7, model::Compressor), main and indexer, on their streaming state:
// a batch of sequences' new tokens in, their completed blocks' entries out. Contract: README.md.
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
//   indexer: Hadamard_d, one bf16 rounding, FP4sim_32 (indexer.h's HadamardFp4SimInplace).
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
// rounded once, but for rare cases) and the fp32 butterfly. fp32 is for GPUs with slow FP64,
// where the fp64 path's 2·ratio double exps per channel may show in decode steps in which many
// sequences complete a block; the cuda backend picks by the device's FP64 rate
// (common/fp64_sums.h, --fp64_sums).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/limits.h"
#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

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
struct CompressorStepParams {
  const float* v = nullptr;           // rows at v + r·ld
  const float* g = nullptr;           // rows at g + r·ld
  int64_t ld = 0;                     // ≥ width
  const float* ape = nullptr;         // [ratio, width]
  const float* norm = nullptr;        // [d]
  const float* rope_freqs = nullptr;  // [rope_dim/2]
  CompressorShape shape;
  CompressorBatch batch;
  bf16_t* entries = nullptr;  // [*, d]
};
cudaError_t CompressorStep(const CompressorStepParams& p, cudaStream_t stream);

const void* CompressorResetKernel();
const void* CompressorPoolKernel();        // fp64
const void* CompressorPoolFp32Kernel();    // fp64 = false
const void* CompressorFinishKernel();      // fp64
const void* CompressorFinishFp32Kernel();  // fp64 = false
const void* CompressorUpdateKernel();

}  // namespace ss::cuda
