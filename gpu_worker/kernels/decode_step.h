// Kernels that keep a step's attention bookkeeping on the device (no host round trip between the
// indexer and the sparse attention): the per-token candidate lists, the raw-KV staging and ring
// writes, sparse attention over many sequences' pools in one launch, the MoE combine and the
// bf16 → fp32 stream conversion. Built for sm_86 + compute_86 PTX only (no FP8 tensor-core
// instructions, wgmma, TMA or clusters).
//
// A step's token rows (all chunks of the batch, in batch order) are described, per layer, by one
// DecodeToken each, built on the host from sizes alone (positions, chunk bounds, pool layout; see
// gpu_worker/cuda_backend.h for the pool: rows [0, W) the window ring, [W, W + stage_cap) the
// chunk's staged raw KV, then the compressed entries at comp_row). The indexer's selections, the
// only data-dependent part of a candidate list, are read on the device.
//
// Contract as kernels.h: device pointers, nothing allocates, each call enqueues on `stream` and
// returns the launch's cudaError_t (cudaErrorInvalidValue for sizes outside the stated limits),
// zero rows is a no-op. All of it is safe to capture in a CUDA graph (static shared memory only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::cuda {

// One token row of a step for one layer.
struct DecodeToken {
  uint64_t pool = 0;        // bf16 [*, head_dim]: its sequence's pool for the layer
  int32_t pos = 0;          // absolute position
  int32_t chunk_start = 0;  // its chunk's first position
  int32_t chunk_end = 0;    // one past its chunk's last position
  int32_t win_width = 0;    // window slots of the chunk's lists (start == 0 ? min(S, W) : W)
  int32_t n_comp = 0;       // compressed slots of the chunk's lists (after the window slots)
  int32_t comp_row = 0;     // pool row of compressed entry 0
  int32_t ratio = 0;        // the layer's compress ratio (0: none)
  int32_t sel_off = -1;     // ≥ 0: the indexer's selections for this row start at sel + sel_off
};
static_assert(sizeof(DecodeToken) == 40);

// cand[t·n_cand + j] (int32, −1 = masked), the reference's list layout (common/model/attention.h):
// slots [0, win_width) the window positions max(0, pos − W + 1) … pos in order (staged rows
// W + (p − chunk_start) for p ≥ chunk_start, else ring slot p mod W), −1 after them; slots
// [win_width, win_width + n_comp) the compressed entries: the selections (comp_row + s, −1 where
// s = −1) when sel_off ≥ 0, else entry m for m < (pos + 1)/ratio, −1 beyond; slots up to n_cand
// (the step's longest list) −1. Masked tail slots change no bit of the attention (they add 0 to
// every sum and leave the running max as it was).
cudaError_t BuildCandidates(const DecodeToken* tokens, int64_t T, int64_t window,
                            const int32_t* sel, int64_t n_cand, int32_t* cand, cudaStream_t stream);

// Raw KV kv bf16 [T, head_dim] into the pools: KvStage writes row t to pool row
// W + (pos − chunk_start) (before the attention reads it), KvRing to ring slot pos mod W for the
// chunk's last W positions (after the attention: earlier tokens of the chunk still read the old
// ring rows). head_dim a multiple of 8, pools and kv 16-byte aligned.
cudaError_t KvStage(const DecodeToken* tokens, int64_t T, const uint16_t* kv, int64_t window,
                    int64_t head_dim, cudaStream_t stream);
cudaError_t KvRing(const DecodeToken* tokens, int64_t T, const uint16_t* kv, int64_t window,
                   int64_t head_dim, cudaStream_t stream);

// SparseAttention (sparse_attention.h) with each token reading its own pool (tokens[t].pool): the
// same arithmetic (bit for bit), one launch for all sequences of a step. head_dim 256 and 512
// (Flash) run a variant that stages each 64-entry chunk of the list in shared memory (64 KiB of
// dynamic shared memory at 512, within SM 8.6's 99 KiB; the first call on a device sets the
// opt-in, so make one before capturing a graph) and spreads the softmax over the block; other
// head dims run SparseAttention's kernel body.
cudaError_t SparseAttentionRows(const uint16_t* q, const DecodeToken* tokens, const int32_t* cand,
                                const float* sink, int64_t T, int64_t n_heads, int64_t head_dim,
                                int64_t n_cand, float scale, uint16_t* out, cudaStream_t stream);

// y[i] = bf16(routed[i] + shared[i]) in fp32 (the MoE combine, model::MoeForward: the shared
// expert's bf16 output plus the routed experts' fp32 sum); a null shared or routed reads 0.
cudaError_t MoeCombineBf16(const uint16_t* shared, const float* routed, int64_t n, uint16_t* y,
                           cudaStream_t stream);

// y[i] = float(x[i]): bf16 streams to the interface's fp32 streams (exact).
cudaError_t Bf16ToF32(const uint16_t* x, int64_t n, float* y, cudaStream_t stream);

// Entry points, for attribute queries (ptxVersion) in tests.
const void* BuildCandidatesKernel();
const void* KvStageKernel();
const void* KvRingKernel();
const void* SparseAttentionRowsKernel();
const void* SparseAttentionRowsFastKernel();  // head_dim 512
const void* MoeCombineBf16Kernel();
const void* Bf16ToF32Kernel();

}  // namespace ss::cuda
