// The `cuda` backend: one pipeline stage's blocks on one GPU (one tensor-parallel rank of them), on
// the device-tested kernels of gpu_worker/kernels/, behind the StageBackend interface (backend.h).
//
// Weights. The stage's tensors are copied from the checkpoint's mmap (the Model's views) to the
// device in the checkpoint's own formats: FP8 e4m3 bytes with their ue8m0 block scales, bf16
// matrices (compressors, indexer weights_proj, router gate, LM head), fp32 small parameters.
// The embedding stays in host memory: stage 0 gathers its rows on the host (one row per token,
// ~8 KB each in Flash; the 1 GB table need not take GPU memory). Routed experts are not uploaded.
//
// One block, as model::Model::RunBlock computes it (the operation order and roundings of the
// reference; each kernel's measured agreement is in its header):
//   HcPre + RmsNorm → query path (wq_a, q_norm, wq_b, per-head norm, RoPE), raw KV (wkv, kv_norm,
//   RoPE, FP8 sim) → compressors (CompressorStep, one launch for the batch's chunks) → indexer
//   (wq_b, IndexerPrepQ, weights, scores from the MXFP4 keys in place, top-k; CSA layers) →
//   KvSparseAttention over window + compressed entries (records decoded once per token) →
//   inverse RoPE, grouped wo_a, wo_b → HcPost → HcPre + RmsNorm → Route (GPU) → shared expert
//   (GPU) while the routed experts run on the host → combine → HcPost.
// Residual streams are bf16 on the device ([T, hc, dim]); the interface's fp32 streams hold the
// same (bf16-representable) values, so a PP split changes no bit.
//
// Host parts. A step uploads its inputs once (the streams as fp32, token ids, positions, and a
// per-(layer, token) table of sizes and block tables, kernels/paged_kv.h's KvToken) and reads its
// output once at the end (fp32 streams, or logits); in between the calling thread does not wait at
// all:
//  * the routed experts run inside the step's stream order: per MoE layer one D2H of the normed
//    MoE input rows, the router's ids and weights (pinned buffers), then, on a side stream, a host
//    function (cudaLaunchHostFunc) that gives them to the RoutedExperts provider of the layer (the
//    expert-worker client) or, where the provider is absent, sums them with model::RoutedSum on
//    the host's reference weights, and one H2D of the fp32 sum; the shared expert runs on the GPU
//    meanwhile, and the bf16(routed + shared) combine waits for the sum. A failed call fails the
//    step with its error (the step's later calls are skipped, its kernels run to the end); with
//    `exclude_routed_experts` nothing goes to the host;
//  * TP > 1: the collectives are enqueued, and waited for once after the layers (see below);
//  * StageTimings come from CUDA events recorded in the stream and the host calls' own clocks,
//    read after the step's final wait (no synchronisation per part);
//  * buffer growth (a new sequence, a longer chunk, a doubled compressed-entry region) may wait.
// Everything else is on the device: the fp32 ↔ bf16 stream conversions; the candidate lists of
// every layer (KvBuildCandidates: window positions from sizes, the indexer's top-k selections read
// where IndexerTopK left them); the raw-KV staging and ring writes; one KvSparseAttention launch
// for all sequences of a step (per 64 MiB of decoded rows in prefill). Stage 0's embedding gather
// stays on the host (its table is not uploaded). A step's layers, host calls and collectives
// included, run as a CUDA graph once its shape repeats (set_decode_graphs).
//
// KV state: the paged KV cache of cuda_backend_kv.h, one device pool of blocks allocated at
// start (kv_tokens / kv_block_tokens blocks plus the built-in allocator's window blocks), every
// window and compressed entry an fp8_ds_mla record (kernels/paged_kv.h), indexer keys MXFP4,
// addressed through the step plan's block tables (StageChunk::block_table), or, where a chunk
// brings none, through tables the pool allocates itself; compressor states fp32 per sequence. A
// step encodes its chunks' raw KV as records in scratch (a chunk longer than W needs all of it
// while the ring keeps only the last W), builds every token's candidate list as record addresses
// and reads the records in the attention (decoded in registers / shared memory; exact, as the
// reference FP8-rounds the nope dims: kv_fp8_sim_rounds). Capacity is accounted like the cpu
// backend: `kv_tokens` positions summed over the live sequences; info().kv_bytes is the pool's.
//
// Tensor parallelism (tp_size > 1; one CudaBackend per rank, each on its own GPU, joined by an
// NcclComm, nccl_comm.h). Attention is split over heads and the MoE's shared expert over its
// intermediate dimension; everything else is replicated and computed identically on every rank:
// hyper-connection pre/post, norms, the q low-rank path (wq_a, q_norm), the single MQA latent KV
// (wkv, kv_norm) and its cache, both compressors, the indexer, the router, the embedding. Rank r
// holds
//   * heads [r·H/TP, (r+1)·H/TP): those rows of wq_b, of the sink, and the o_groups/TP groups of
//     wo_a that read them (a group's heads never straddle ranks);
//   * wo_b's input columns of those groups: each rank's wo_b is the fp32 partial over its own
//     128-column blocks (Fp8Linear's fp32 output), and ONE all-reduce (fp32 sum) after it, rounded
//     to bf16 once, gives what TP = 1's wo_b gives up to fp32 summation order: the activation
//     quantisation blocks and the weight scales are the same ones, only the order in which the
//     per-block partials are added differs;
//   * the shared expert's intermediate 128-blocks [r·nb/TP, (r+1)·nb/TP) (nb = ⌈inter/128⌉, so a
//     rank may hold none: tiny-a's 128 at TP = 2 sits whole on rank 0): w1/w3 rows and w2 columns;
//     w2 gives an fp32 partial;
//   * its share of the routed experts: with the `experts` provider, whatever the provider returns
//     (the worker hands each rank a provider for the expert-worker slices assigned to it:
//     ARCHITECTURE.md "The MoE call"); without one, experts [r·E/TP, (r+1)·E/TP) of every token on
//     the host's reference weights (model::RoutedSum with the router's other choices masked), so
//     the ranks split the CPU work. ONE all-reduce after the MoE sums both partials, laid out
//     [shared | routed] ([2, T, dim] fp32: twice the bytes of one sum, so that the combine rounds
//     as the reference does, bf16(routed + bf16(shared)); adding them before the collective drops
//     the shared expert's own bf16 rounding, which on tiny-a cut the blocks' bit-identical
//     fraction from 0.98-1.00 to 0.76-0.89 and failed golden model.long). The result equals
//     TP = 1's up to fp32 summation order;
//   * the LM head's vocabulary rows [r·⌈V/TP⌉, ...) (vocab-parallel; each row's logit is the same
//     computation as TP = 1's, so logits are bit-identical for identical inputs), gathered with
//     one all-gather: every rank returns every logit.
// All-reduced values are the same bits on every rank, so the replicated state (streams, KV,
// compressor states) stays identical across ranks. A step waits for its collectives under
// `collective_timeout` (once after its layers, and after the LM head's all-gather): a rank whose
// peer stopped (failed, died) gets DeadlineExceeded and its communicator is aborted (the whole
// group must then be rebuilt), never a hang. A rank whose routed experts failed still runs the
// step's collectives to the end, so its peers finish the step; it returns the error and the
// coordinator fails the micro-batch. Every rank must run the same batches in the same order.
// Measured on two H200s (tests/gpu_worker/cuda_tp_test.cc, tiny-a): every block's figures against
// the reference equal TP = 1's, the whole model's logits are bit-identical to TP = 1's, and
// splitserve-golden --tp 2 prints the same figures as TP = 1 for all 47 checks; the whole-model
// test gives the same figures with NCCL_P2P_DISABLE=1 (PCIe boards without peer-to-peer).
// Shapes TP needs: n_heads and o_groups divisible by TP, (o_groups/TP)·o_lora_rank a multiple of
// 128 (Flash: TP 1, 2, 4, 8; tiny-a: 1, 2). TP = 1 runs exactly the single-GPU code path and
// arithmetic (no communicator, bf16 wo_b, the host's bf16(routed + shared) combine).
//
// Threads: the StageBackend methods from one thread at a time (the stage runner's); with TP, each
// rank's backend on its own thread (the ranks' Run calls meet in the collectives). Everything runs
// on one CUDA stream owned by the backend, on `device`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/fp64_sums.h"

namespace ss::gpu {

class NcclComm;  // nccl_comm.h

struct CudaBackendOptions {
  int stage = 0;
  int num_stages = 1;
  int first_layer = 0;  // [first_layer, end_layer)
  int end_layer = 0;
  // KV capacity in tokens; 0: as many as the device's free memory holds once the weights are
  // resident, beside kv_reserve_bytes and kv_sequences sequences' compressor states (FitKvPool in
  // cuda_backend_kv.h; info().kv_tokens reports the result). A given capacity that does not fit
  // is refused at Create with the figures, not by an allocation failure.
  int64_t kv_tokens = 0;
  // Kept free beside the pool: the workspace of a step of max_step_tokens tokens (the role's
  // max_batch_tokens) at the model's full context (step_workspace.h) plus kv_reserve_bytes
  // (the CUDA graphs, logits, allocation slack).
  int64_t max_step_tokens = 2048;
  int64_t max_context = 0;  // the longest sequence served; 0: the model's max_position_embeddings
  int64_t kv_reserve_bytes = int64_t{1} << 29;  // 0.5 GiB
  int64_t kv_sequences = 64;                    // the coordinator's default max_running
  // Paged KV (cuda_backend_kv.h): tokens per block (the coordinator's kv_block_tokens; a
  // multiple of every compress ratio of the stage), and the sequences whose window blocks the
  // pool holds beyond kv_tokens for the built-in allocator (standalone use).
  int64_t kv_block_tokens = 128;
  int64_t kv_extra_sequences = 8;
  int device = 0;         // CUDA device ordinal
  // The routed experts of a layer: experts(layer) when the function is set and returns non-null
  // (it must outlive the backend), otherwise model::RoutedSum on the host (the local reference).
  // With TP > 1 the provider gives this rank's share, and without one the rank computes its
  // range of experts (see the header comment).
  std::function<const model::RoutedExperts*(int64_t layer)> experts;
  // Benchmarks only (issue 5's layer figures exclude the routed experts): take every layer's
  // routed-expert sum as zero, so a step sends nothing to the host and `experts` is not called.
  bool exclude_routed_experts = false;
  // The reference's double sums (compressors, the indexer's Hadamard) in double or in fp32
  // (fp64_sums.h); auto: by the device's FP64 rate. fp64_sums() tells which runs.
  Fp64Sums fp64_sums = Fp64Sums::kAuto;
  // Tensor parallelism: this backend is rank tp_rank of tp_size. tp_size > 1 needs the group's
  // communicator (rank, size and device equal to these; it must outlive the backend) and a build
  // with NCCL; TP = 1 ignores `comm`.
  int tp_rank = 0;
  int tp_size = 1;
  NcclComm* comm = nullptr;
  // Deadline of each wait for a collective (TP > 1).
  absl::Duration collective_timeout = absl::Seconds(300);
};

class CudaBackend final : public StageBackend {
 public:
  // Validates the stage against the model, selects the device and uploads the stage's weights.
  // `model` supplies the config, the weight views (mmap) and the host-side reference parts.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      std::shared_ptr<const model::Model> model, const CudaBackendOptions& options);
  ~CudaBackend() override;

  const ModelConfig& config() const override { return model_->config(); }
  BackendInfo info() const override;
  KvUsage kv_usage() const override;
  // How the KV pool was sized against the device's free memory (KvFit::Describe), for the
  // start-up log.
  const std::string& kv_fit() const { return kv_fit_; }
  // Whether the reference's double sums run in double (options' fp64_sums resolved at Create).
  bool fp64_sums() const { return fp64_; }
  absl::Status Check(std::span<const StageChunk> batch) const override;
  absl::Status Run(std::span<const StageChunk> batch, const float* streams_in, StageOutput* out,
                   StageTimings* timings) override;
  // Streams in and out as bf16 in this device's memory (backend.h): the input is widened on the
  // device where Run uploads it, and the output is the last layer's bf16 streams, where Run copies
  // their fp32 form back to the host.
  absl::Status RunDevice(std::span<const StageChunk> batch, const void* streams_in,
                         StageOutput* out, StageTimings* timings) override;
  void Release(uint64_t seq_id) override;
  void ReleaseAll() override;

  // Benchmarks only: creates (or replaces) sequence `seq_id` as if `next_pos` tokens had been
  // run, so decode at long contexts can be timed without the prefill: the KV records as the pool
  // holds them (zero from the start), compressor states zeroed, and the indexer keys random
  // (valid MXFP4: random e2m1 codes under a scale of 1), so that the indexer's scores differ
  // from key to key as after a real prefill (all-zero keys would tie every score, the top-k's
  // worst case). The values are meaningless; only the sizes are real.
  absl::Status FillSequenceForBenchmark(uint64_t seq_id, int64_t next_pos);

  // Decode under CUDA graphs (on from creation): a step runs its layers as one captured graph
  // (routed-experts host calls, TP collectives and timing marks included) once its shape repeats,
  // re-captured when the shape changes (sizes, scratch and pinned addresses; see Run). Off: every
  // step launches its kernels one by one (the same kernels, the same bits). Call between steps,
  // from the thread that calls Run.
  void set_decode_graphs(bool on);
  // Graphs captured (instantiated, or updated in place), and steps run as a graph launch, since
  // creation.
  int64_t graph_captures() const;
  int64_t graph_replays() const;

  struct Impl;  // device weights, sequences and scratch (cuda_backend.cc)

 private:
  absl::Status RunImpl(std::span<const StageChunk> batch, const float* host_in,
                       const void* device_in, bool device_out, StageOutput* out,
                       StageTimings* timings);
  CudaBackend(std::shared_ptr<const model::Model> model, const CudaBackendOptions& options);
  // The host half of one MoE layer's routed experts for `rows` rows: the pinned MoE input, ids
  // and weights to the pinned fp32 sum (the provider, or model::RoutedSum on this rank's share).
  // Runs from the step's side stream (a host function: no CUDA calls).
  absl::Status HostExperts(int64_t layer, int64_t rows);

  std::shared_ptr<const model::Model> model_;
  CudaBackendOptions options_;  // kv_tokens as resolved by Create
  std::string kv_fit_;          // KvFit::Describe() of the pool Create allocated
  bool fp64_ = true;            // options_.fp64_sums resolved against the device
  std::unique_ptr<Impl> impl_;
};

}  // namespace ss::gpu
