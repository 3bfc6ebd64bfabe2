// Internals of the cuda backend (cuda_backend.h), shared by its source files: the device weights
// of a stage (Dev*), a step's host-side plan (StepPlan, cuda_backend_plan.cc) and the backend's
// state (CudaBackend::Impl: streams, weights, KV pool, scratch and the step's parts).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/load_progress.h"
#include "common/model/model.h"
#include "gpu_worker/cuda/branches.h"
#include "gpu_worker/cuda/cuda_backend.h"
#include "gpu_worker/cuda/cuda_backend_kv.h"
#include "gpu_worker/cuda/device_buffers.h"
#include "gpu_worker/cuda/graph_cache.h"
#include "gpu_worker/cuda/routed_experts_provider.h"
#include "gpu_worker/cuda/step_timings.h"
#include "gpu_worker/cuda/streamed_routed_experts.h"
#include "gpu_worker/cuda_status.h"
#include "gpu_worker/kernels/types.h"
#include "gpu_worker/step_workspace.h"

namespace ss::gpu {

class NcclComm;

namespace cuda_backend_internal {

using Clock = std::chrono::steady_clock;
inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct DevFp8 {
  const cuda::e4m3_t* w = nullptr;
  const cuda::ue8m0_t* s = nullptr;
  int64_t out = 0, in = 0;
};
struct DevBf16 {
  const cuda::bf16_t* p = nullptr;
  int64_t rows = 0, cols = 0;
};
struct DevHc {
  const float *fn = nullptr, *base = nullptr, *scale = nullptr;
};
struct DevCompressor {
  const float* ape = nullptr;
  DevBf16 wkv, wgate;
  const float* norm = nullptr;
  int64_t width = 0;
};
struct DevBlock {
  int64_t ratio = 0;
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  DevHc hc_attn, hc_ffn;
  const float* sink = nullptr;
  DevFp8 wq_a, wq_b, wkv, wo_a, wo_b;
  const float *q_norm = nullptr, *kv_norm = nullptr;
  bool has_compressor = false, has_indexer = false;
  DevCompressor compressor, index_compressor;
  DevFp8 index_wq_b;
  DevBf16 index_weights_proj;
  DevBf16 gate;
  const float* bias = nullptr;
  const int32_t* tid2eid = nullptr;
  DevFp8 shared_w1, shared_w2, shared_w3;
  int64_t shared_inter = 0;  // this rank's slice of the shared expert's intermediate dim (may be 0)
};

// A rank's share [begin, end) of `n` items split in `parts` contiguous runs of whole `unit`s.
struct Share {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
inline Share ShareOf(int64_t n, int64_t unit, int parts, int rank) {
  const int64_t units = (n + unit - 1) / unit;
  return {std::min(n, rank * units / parts * unit), std::min(n, (rank + 1) * units / parts * unit)};
}

// Steps of at most this many tokens run the indexer's scores and top-k for all their chunks in
// one launch each (StepPlan::index_one_launch); the split top-k takes up to 8 rows.
inline constexpr int64_t kIndexerOneLaunchTokens = 8;
// A decode step's (index_one_launch) sizes that grow with the sequences are rounded up to a
// multiple of this, so its launches, and its CUDA graph, stay the same over many positions
// (StepPlan: index_k, n_cand, table_cap).
inline constexpr int64_t kDecodeSizeStep = 64;

// The host side of one step (cuda_backend_plan.cc), from the batch's sizes, positions and block
// tables alone: what the step's launches take per chunk, per (layer, token) and per layer, and
// the layout of its one upload (Run stages it in pinned memory):
//   compressor arrays | KvTokens | tables | main-entry addresses | key addresses | token ids |
//   positions | input (from streams_at, 256-aligned: the first stage's bf16 embedding rows, else
//   fp32 streams; a middle stage's output streams come back through the same rows).
struct StepPlan {
  int64_t T = 0, max_rows = 0, max_cand = 1, scores_cap = 0;
  std::vector<int64_t> row0, ids, pos;  // chunk i's rows are [row0[i], row0[i + 1])
  // Per chunk: the indexer's selections per token, where they start, its score columns; where
  // the chunk's table starts in the uploaded tables (int32s).
  std::vector<int64_t> n_sel, sel_base, n_cols, table_off;
  // A step of at most kIndexerOneLaunchTokens tokens (decode) scores and selects every chunk's
  // rows in one launch each (index_one_launch): rows of index_cols columns (the widest chunk's),
  // index_k selections each (the most any chunk takes, rounded up to kDecodeSizeStep, at most
  // index_cols), token t's at t · index_k; a chunk reads the first n_sel of its rows' (the
  // top-k's order is total, so they are its own top n_sel, whatever k).
  // Longer steps score and select chunk by chunk, with each chunk's own widths, in slices of
  // score_rows[i] rows (IndexerScoreRows under the backend's indexer_scores_bytes; the chunk's
  // rows when they fit).
  bool index_one_launch = false;
  std::vector<int64_t> score_rows;
  int64_t index_cols = 0, index_k = 0;
  std::vector<cuda::KvToken> tokens;  // [layer, T]; table and staging set by FillUpload
  // Per layer: the longest candidate list; in a decode step rounded up to kDecodeSizeStep (the
  // tail slots are masked, which changes no bit of the attention: paged_kv.h).
  std::vector<int64_t> n_cand;
  std::vector<int64_t> ebase;  // [layer, chunk]: the scratch row of its first new entry
  std::vector<uint64_t> dst_main, dst_key;  // [layer, T]: record / key address of scratch row
  size_t cb_stride = 0;                     // int64s per (layer, kind) compressor array
  std::vector<int64_t> params;              // [layer, kind: main, indexer] compressor arrays
  // The tables' room in the upload (int32s): table_off[nc], in a decode step rounded up to
  // kDecodeSizeStep.
  int64_t table_cap = 0;
  size_t tokens_at = 0, tables_at = 0, dst_at = 0, ids_at = 0, streams_at = 0;

  // The upload's bytes before the streams, into `host`, for the upload's device address `dev`
  // and the step's staging records (KvToken::table and ::staging are device addresses).
  void FillUpload(char* host, const char* dev, uint64_t staging, int64_t record_bytes,
                  std::span<const KvSeq* const> seq);
};
StepPlan PlanStep(std::span<const StageChunk> batch, const ModelConfig& c,
                  std::span<const DevBlock> blocks, const KvLayout& kvl,
                  std::span<const KvSeq* const> seq, const uint8_t* pool,
                  int64_t indexer_scores_bytes);

}  // namespace cuda_backend_internal

using namespace cuda_backend_internal;  // NOLINT: the backend's own source files only

struct CudaBackend::Impl {
  int device = 0;
  int tp = 1, rank = 0;
  int64_t indexer_scores_bytes = kIndexerScoresBytes;  // CudaBackendOptions'; PlanStep's cap
  NcclComm* comm = nullptr;
  Share vocab;            // this rank's LM-head rows
  int64_t vocab_max = 0;  // the largest rank's row count (the all-gather's block)
  cudaStream_t stream = nullptr;
  // The routed experts' side stream (host call, then the sum's upload), joined to `stream` by
  // routed_ready (the MoE input is normed) and routed_back (the routed sum is on the device).
  cudaStream_t side = nullptr;
  cudaEvent_t routed_ready = nullptr, routed_back = nullptr;
  // A layer's work off its critical path (branches.h).
  StepBranches branches;
  // Where the routed experts run (routed_experts_provider.h); set at creation.
  std::unique_ptr<RoutedExpertsProvider> routed;
  // The streamed path (streamed_routed_experts.h), null when off: the expert stores it copies
  // from (declared first, so they outlive it), the provider, and the policy that picks the steps
  // that stream (streamed_prefill.h). A streamed step runs its streamable layers through
  // `streamed` and the others through `routed`.
  std::unique_ptr<ExpertStoreSet> stores;
  std::unique_ptr<StreamedRoutedExperts> streamed;
  std::unique_ptr<StreamedPrefillPolicy> policy;
  // StageTimings from events (step_timings.h).
  StepMarks marks;
  std::vector<void*> allocations;  // weights, freed at destruction
  int64_t weight_bytes = 0;
  std::unique_ptr<LoadProgress> load_progress;  // while the weights upload (Create)
  std::vector<DevBlock> blocks;                 // index = layer − first_layer
  DevHc hc_head;
  const float* final_norm = nullptr;
  DevBf16 head;
  const float *freqs_plain = nullptr, *freqs_comp = nullptr;
  KvPool kv;  // the paged KV cache (cuda_backend_kv.h)
  // Scratch, grow-only.
  DevBuf arena, params, cand, scores, sel, logits, kvrows;
  // Scratch whose launches leave it zeroed (zeroed once, and again after a failed step):
  // HcPreDeferCombNormQuant's per-token counters (kHcSyncTokens of them: the split HcPre takes
  // at most that many tokens), then from byte kZeroedTopK IndexerTopK's for long decode rows.
  static constexpr int64_t kHcSyncTokens = 64, kZeroedTopK = 256;
  static_assert(kHcSyncTokens * 4 <= kZeroedTopK);
  DevBuf zeroed;
  // The step's upload (step_input.cc: parameters, ids, positions, input streams), staged in
  // pinned memory so the copy is one asynchronous DMA; a middle stage's output streams come back
  // through it.
  PinnedBuf up_host;
  // The greedy rows' argmax records, back from the device (step_output.cc).
  PinnedBuf greedy_host;
  // The step's layers under CUDA graphs (graph_cache.h).
  StepGraphCache graph;

  ~Impl() {
    graph.Reset();
    kv.ReleaseAll();
    for (void* p : allocations) cudaFree(p);
    if (routed_ready) cudaEventDestroy(routed_ready);
    if (routed_back) cudaEventDestroy(routed_back);
    if (side) cudaStreamDestroy(side);
    if (stream) cudaStreamDestroy(stream);
  }

  // Weight upload (cuda_backend_weights.cc): tensors copied to the device in the checkpoint's
  // formats, a TP rank's share sliced on the host.
  absl::StatusOr<void*> Upload(const void* src, size_t bytes);
  absl::StatusOr<const float*> F32(const std::vector<float>& v);
  absl::StatusOr<DevFp8> Fp8(const model::Fp8Weight& w);
  absl::StatusOr<DevFp8> Fp8Rows(const model::Fp8Weight& w, Share r);
  absl::StatusOr<DevFp8> Fp8Cols(const model::Fp8Weight& w, Share k);
  absl::StatusOr<DevBf16> Bf16(const model::Bf16Matrix& m);
  absl::StatusOr<DevBf16> Bf16Rows(const model::Bf16Matrix& m, Share r);
  absl::StatusOr<DevHc> Hc(const model::HcWeights& h);
  absl::StatusOr<DevCompressor> Compressor(const model::CompressorWeights& c);
  absl::StatusOr<DevBlock> Block(const ModelConfig& c, const model::BlockWeights& b);
};

}  // namespace ss::gpu
