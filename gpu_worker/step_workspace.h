// The cuda backend's per-step device workspace, sized on the host without CUDA: the scratch arena
// a step of T tokens carves (StepScratch) and, beside it, Run's per-step buffers (candidate lists,
// decoded rows, the indexer's scores and selections, the upload). The backend carves its arena
// with CarveStepScratch; the worker keeps StepWorkspaceBytes free beside its KV pool
// (cuda/cuda_backend.cc Create) and the memory plan (memory_plan.h) counts it in its reserve.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/model_config.h"
#include "gpu_worker/kernels/types.h"

namespace ss::gpu {

// Cap of the attention's decoded-rows scratch (KvSparseAttention's rows): a step of more tokens
// (prefill) runs the attention in slices of this many bytes of rows.
inline constexpr int64_t kAttentionRowsBytes = int64_t{64} << 20;
// The indexer's score columns are a multiple of this (cuda/cuda_backend_plan.cc).
inline constexpr int64_t kScoreColumns = 256;
// Cap of the indexer's score rows in a prefill step (CudaBackendOptions::indexer_scores_bytes):
// a chunk whose rows x columns of fp32 scores exceed it scores and selects its rows in slices of
// IndexerScoreRows rows. 2 GiB: a 2048-token chunk at 1M positions still takes one slice.
inline constexpr int64_t kIndexerScoresBytes = int64_t{2} << 30;

// Rows of a chunk of `rows` rows the indexer scores at once under a cap of `cap_bytes` (0: none),
// with `n_cols` score columns: as many as fit, at least 1, at most `rows`.
inline int64_t IndexerScoreRows(int64_t rows, int64_t n_cols, int64_t cap_bytes) {
  if (cap_bytes <= 0 || n_cols <= 0) return rows;
  const int64_t fit = cap_bytes / (n_cols * 4);
  return fit < 1 ? 1 : (fit < rows ? fit : rows);
}

// The step's device scratch (sized by the batch's token count T), carved from one allocation.
struct StepScratch {
  cuda::bf16_t *h = nullptr, *h2 = nullptr, *mid = nullptr;  // [T, hc, dim]
  cuda::bf16_t *y = nullptr, *xn = nullptr, *attn = nullptr, *moe = nullptr, *shared = nullptr;
  float *pre = nullptr, *post = nullptr, *comb = nullptr;
  cuda::bf16_t *qa = nullptr, *qr = nullptr, *q = nullptr, *kva = nullptr, *kv = nullptr;
  cuda::bf16_t *o = nullptr, *z = nullptr;
  float *cv = nullptr, *cg = nullptr;    // the main compressor's projections
  float *icv = nullptr, *icg = nullptr;  // the indexer compressor's (the two run concurrently)
  cuda::bf16_t* iq = nullptr;
  float* proj = nullptr;
  cuda::bf16_t* iw = nullptr;
  float* rlogits = nullptr;
  int32_t* ridx = nullptr;
  float* rw = nullptr;
  cuda::bf16_t *sg = nullptr, *su = nullptr, *sa = nullptr;
  // Quantised activations (QuantizeActE4m3 layout) of a linear's input: the normed attention
  // and MoE inputs, z and the shared expert's activations in qbuf/sbuf; the normed q latent in
  // qbuf2/sbuf2 (while a branch's GEMV may still read qbuf).
  cuda::e4m3_t *qbuf = nullptr, *qbuf2 = nullptr;
  float *sbuf = nullptr, *sbuf2 = nullptr;
  float *cos0 = nullptr, *sin0 = nullptr, *cos1 = nullptr, *sin1 = nullptr;
  int64_t *ids = nullptr, *pos = nullptr;
  // TP > 1: the rank's fp32 partial sums, [T, dim] after attention, [2, T, dim] (shared expert,
  // routed experts) after the MoE.
  float* part = nullptr;
  float* routed = nullptr;  // TP = 1: the routed experts' fp32 sum [T, dim] from the host
  float* sf32 = nullptr;    // the interface's fp32 streams [T, hc, dim], in and out
  // Paged KV: the chunks' raw KV as records [T], the compressors' new entries bf16 [T, head_dim]
  // and new indexer keys bf16 [T, index_head_dim] before they are encoded into their blocks.
  uint8_t* staging = nullptr;
  cuda::bf16_t *centries = nullptr, *ckeys = nullptr;
};

// Carves s's pieces (256-byte aligned) for T tokens at TP `tp` (the per-rank head and group
// buffers) from `base` and returns the bytes used; with a null base it only measures.
size_t CarveStepScratch(const ModelConfig& c, int tp, int64_t T, char* base, StepScratch* s);

// The device bytes a step of `tokens` tokens (one chunk ending at position `context`; ≤ 0: the
// model's max_position_embeddings, or its rope's original length where the config has none) of
// the layers [first_layer, end_layer) takes beside the weights and the KV pool, at its largest:
// the scratch arena and Run's per-step buffers. The indexer's scores grow with the context: tokens
// x context / 4 floats (2 GiB for a 2048-token chunk at 1M positions), up to kIndexerScoresBytes
// (the slices' rows beyond it).
int64_t StepWorkspaceBytes(const ModelConfig& c, int tp, int first_layer, int end_layer,
                           int64_t tokens, int64_t context);

}  // namespace ss::gpu
