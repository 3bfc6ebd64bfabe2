// The `cuda` backend: one pipeline stage's blocks on one GPU (one tensor-parallel rank of them), on
// the kernels of gpu_worker/kernels/, behind the StageBackend interface (backend.h).
//
// Weights. The stage's tensors are copied from the checkpoint's mmap (the Model's views) to the
// device in the checkpoint's own formats: FP8 e4m3 bytes with their ue8m0 block scales, bf16
// matrices (compressors, indexer weights_proj, router gate, LM head), fp32 small parameters. The
// embedding stays in host memory (stage 0 gathers its rows on the host); the routed experts are
// not uploaded.
//
// A step computes each block as model::Model::RunBlock does (the reference's operation order and
// roundings); its parts are listed in step.h. Residual streams are bf16 on the device
// ([T, hc, dim]); the interface's fp32 streams hold the same (bf16-representable) values, so a PP
// split changes no bit. A step uploads its inputs once and reads its output once at the end; in
// between the calling thread waits only where a buffer grows and for TP's collectives (once after
// the layers, once after the LM head's all-gather), never per layer:
//  * the routed experts run inside the step's stream order, on a side stream, through the
//    backend's RoutedExpertsProvider (routed_experts_provider.h): today on the host, with
//    `experts(layer)` (the expert-worker client) or, where that is absent, model::RoutedSum on the
//    host's reference weights (host_routed_experts.h); the shared expert runs on the GPU
//    meanwhile. A failed call fails the step with its error (the step's later calls are skipped,
//    its kernels run to the end). With `exclude_routed_experts` nothing goes to the host;
//  * StageTimings come from CUDA events recorded in the stream and the host calls' own clocks,
//    read after the step's final wait (step_timings.h).
// A step's layers, host calls and collectives included, run as a CUDA graph once its shape
// repeats (set_decode_graphs; graph_cache.h).
//
// KV state: the paged KV cache of cuda_backend_kv.h, one device pool of blocks allocated at Create
// (kv_tokens / kv_block_tokens blocks plus the built-in allocator's window blocks), every window
// and compressed entry an fp8_ds_mla record (kernels/paged_kv.h), indexer keys MXFP4, addressed
// through the step plan's block tables (StageChunk::block_table), or, where a chunk brings none,
// through tables the pool allocates itself; compressor states fp32 per sequence. Capacity is
// accounted like the cpu backend: `kv_tokens` positions summed over the live sequences, less
// the positions they resumed at from a snapshot; info().kv_bytes is the pool's. Resume snapshots
// (backend.h) live in the pool's blocks, written and read by device-to-device copies on the step
// stream (cuda_backend_kv.h "Resume snapshots").
//
// Tensor parallelism (tp_size > 1; one CudaBackend per rank, each on its own GPU, joined by an
// NcclComm, nccl_comm.h). Attention is split over heads and the MoE's shared expert over its
// intermediate dimension; everything else is replicated and computed identically on every rank:
// hyper-connection pre/post, norms, the q low-rank path (wq_a, q_norm), the single MQA latent KV
// (wkv, kv_norm) and its cache, both compressors, the indexer, the router, the embedding. Rank r
// holds
//   * heads [r·H/TP, (r+1)·H/TP): those rows of wq_b, of the sink, and the o_groups/TP groups of
//     wo_a that read them (a group's heads never straddle ranks);
//   * wo_b's input columns of those groups: each rank's wo_b gives the fp32 partial over its own
//     128-column blocks, and ONE all-reduce (fp32 sum) after it, rounded to bf16 once, gives what
//     TP = 1's wo_b gives up to fp32 summation order;
//   * the shared expert's intermediate 128-blocks [r·nb/TP, (r+1)·nb/TP) (nb = ⌈inter/128⌉, so a
//     rank may hold none): w1/w3 rows and w2 columns; w2 gives an fp32 partial;
//   * its share of the routed experts: with the `experts` provider, whatever the provider returns
//     (ARCHITECTURE.md "The MoE call"); without one, experts [r·E/TP, (r+1)·E/TP) of every token
//     on the host's reference weights. ONE all-reduce after the MoE sums both partials, laid out
//     [shared | routed], so that the combine rounds as the reference does,
//     bf16(routed + bf16(shared)) (moe_layer.h). The result equals TP = 1's up to fp32 summation
//     order;
//   * the LM head's vocabulary rows [r·⌈V/TP⌉, ...) (vocab-parallel: logits bit-identical to
//     TP = 1's for identical inputs), gathered with one all-gather: every rank returns every logit.
// All-reduced values are the same bits on every rank, so the replicated state (streams, KV,
// compressor states) stays identical across ranks. A step waits for its collectives under
// `collective_timeout`: a rank whose peer stopped gets DeadlineExceeded and its communicator is
// aborted (the whole group must then be rebuilt), never a hang. A rank whose routed experts failed
// still runs the step's collectives to the end, so its peers finish the step; it returns the
// error. Every rank must run the same batches in the same order. TP needs n_heads and o_groups
// divisible by TP and (o_groups/TP)·o_lora_rank a multiple of 128. TP = 1 runs the single-GPU
// code path and arithmetic (no communicator, bf16 wo_b, bf16(routed + shared) in one kernel).
//
// Errors: a failed Run / RunDevice drops the batch's sequences (backend.h); the backend stays
// usable for the next step.
//
// Threads: the StageBackend methods from one thread at a time (the stage runner's); with TP, each
// rank's backend on its own thread (the ranks' Run calls meet in the collectives). The step runs
// on streams owned by the backend, on `device`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/fp64_sums.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/expert_heat.h"
#include "gpu_worker/expert_rebalancer.h"
#include "gpu_worker/expert_store_map.h"
#include "gpu_worker/step_workspace.h"
#include "gpu_worker/streamed_prefill.h"

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
  // A prefill chunk's indexer scores (fp32, rows x the chunk's end / 4 columns) at most this many
  // bytes at once: longer chunks score and select their rows in slices (step_workspace.h
  // IndexerScoreRows; the same selections). Smaller values are for tests; StepWorkspaceBytes
  // counts the default.
  int64_t indexer_scores_bytes = kIndexerScoresBytes;
  int device = 0;  // CUDA device ordinal
  // The routed experts of a layer: experts(layer) when the function is set and returns non-null
  // (it must outlive the backend), otherwise model::RoutedSum on the host (the local reference).
  // With TP > 1 the provider gives this rank's share, and without one the rank computes its
  // range of experts (see the header comment).
  std::function<const model::RoutedExperts*(int64_t layer)> experts;
  // The streamed path of the routed experts (streamed_prefill.h): when a step streams, and the
  // staging ring's device bytes (counted beside the step workspace; 0: no streamed path). The
  // experts are read from the expert stores of `expert_stores` (per layer served by expert
  // workers: this rank's slices, expert_store_map.h ExpertStoreSet), mapped read-only and
  // registered with CUDA; layers whose slices are not all in stores on this host keep the CPU
  // path. Layers without an entry stream from the model's host weights (golden tests,
  // standalone use).
  // Off unless asked: the GPU worker passes its --gpu_prefill_threshold (auto by default).
  GpuPrefillThreshold gpu_prefill_threshold{GpuPrefillThreshold::Mode::kOff, 0};
  // The ring: auto (ring_budget.h, from the free memory once the trunk's weights are resident),
  // else gpu_prefill_ring_bytes.
  bool gpu_prefill_ring_auto = false;
  int64_t gpu_prefill_ring_bytes = kBaseGpuPrefillRingMiB << 20;
  int64_t gpu_prefill_slot_bytes = kGpuPrefillSlotBytes;  // the ring's slots (PlanRing)
  std::map<int64_t, ExpertLayerStores> expert_stores;
  // Routed experts resident on this GPU (resident_routed_experts.h): per stage layer, the expert
  // ids whose weights stay on the device, computed here for steps of at most resident_max_rows
  // rows (the other choices: `experts` / the host). Empty: none.
  std::vector<std::vector<int32_t>> resident_experts;
  int64_t resident_max_rows = 256;
  // --gpu_experts auto (resident_budget.h): when place_resident is set (resident_experts is then
  // ignored), Create computes the budget once the trunk's weights and the streamed path are on
  // the device: cudaMemGetInfo's free bytes less the KV pool of K tokens (K = kv_tokens when > 0,
  // else max_context or the model's max_position_embeddings, at least resident_min_kv_tokens),
  // kv_sequences sequences' compressor states, the step workspace, kv_reserve_bytes and the
  // resident path's workspace, divided by one expert's bytes on this rank and capped at the
  // stage's layers x n_routed_experts; then calls place_resident(budget) for the per-layer sets
  // (budget 0: none, not called) and logs the figures. The KV pool is fitted to what is left.
  std::function<absl::StatusOr<std::vector<std::vector<int32_t>>>(int64_t budget)> place_resident;
  int64_t resident_min_kv_tokens = 8192;
  // Optional: the expert path's statistics, where the resident experts add the choices they
  // served (ResidentExpertsOptions::heat); and the resident set's rebalance while serving
  // (expert_rebalancer.h), on when the interval is positive and the statistics are given.
  std::shared_ptr<ExpertHeat> expert_heat;
  RebalanceOptions resident_rebalance;
  // Benchmarks only (layer figures without the routed experts): take every layer's routed-expert
  // sum as zero, so a step sends nothing to the host and `experts` is not called.
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
  // Copies the sequence's resume state into `blocks` of the pool (cuda_backend_kv.h "Resume
  // snapshots"), enqueued on the step stream after the step that left the sequence at `position`
  // (no host wait). InvalidArgument for an unknown sequence, a position other than its next one
  // or not a positive multiple of kv_block_tokens, a sequence on the pool's own allocator (no
  // step-plan tables), fewer blocks than the snapshot takes or a block outside the pool.
  // Snapshots live in the coordinator's blocks: DropSnapshot has nothing to do.
  absl::Status SaveSnapshot(uint64_t seq_id, int64_t position, uint64_t snapshot_id,
                            std::span<const int32_t> blocks) override;
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
  // re-captured when the shape changes (the key and the rules: graph_cache.h). Off: every step
  // launches its kernels one by one (the same kernels, the same bits). Call between steps, from
  // the thread that calls Run.
  void set_decode_graphs(bool on);
  // Graphs captured (instantiated, or updated in place), and steps run as a graph launch, since
  // creation.
  int64_t graph_captures() const;
  int64_t graph_replays() const;

  struct Impl;  // device weights, sequences, scratch and the step's parts (cuda_backend_internal.h)

 private:
  // One step (step.cc): Run with host_in, RunDevice with device_in and device_out.
  absl::Status RunImpl(std::span<const StageChunk> batch, const float* host_in,
                       const void* device_in, bool device_out, StageOutput* out,
                       StageTimings* timings);
  CudaBackend(std::shared_ptr<const model::Model> model, const CudaBackendOptions& options);

  std::shared_ptr<const model::Model> model_;
  CudaBackendOptions options_;  // kv_tokens as resolved by Create
  std::string kv_fit_;          // KvFit::Describe() of the pool Create allocated
  bool fp64_ = true;            // options_.fp64_sums resolved against the device
  std::unique_ptr<Impl> impl_;
};

}  // namespace ss::gpu
