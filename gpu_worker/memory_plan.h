// Device-memory plan of one GPU worker, which keeps it within its card's memory: the
// bytes of the weights its role keeps on the device, what is left for the KV pool after a
// reserve for the CUDA context and the largest step's workspace, and the pool's capacity in blocks
// and tokens — computed from config.json alone, before any weight is read, so a layout that does
// not fit is refused at start with the numbers, not by an out-of-memory error mid-load.
//
// Weights on a GPU worker are the checkpoint's own bytes (FP8 e4m3 with ue8m0 block scales, bf16
// norms, fp32 small tensors), minus the routed experts (CPU expert workers hold them):
//   every stage:  its layers' attention (q/kv path, compressors, indexer, output projection),
//                 hyper-connection mixers, norms, router, shared expert
//   first stage:  the embedding (replicated on every TP rank)
//   last stage:   final norm, hc head, LM head; the MTP blocks when the role runs them
// Sharded by TP (each rank holds 1/tp): wq_b, wo_a, wo_b and attn_sink (heads and o-groups),
// the shared expert (its intermediate dimension), the LM head (vocabulary-parallel). The single
// MQA latent KV path (wkv), wq_a, the compressors and the indexer are replicated
// (ARCHITECTURE.md "One step").
//
// KV: the stage's layers under the cost model of common/kv_cost_model.h (block_tokens per block;
// every TP rank holds the whole KV of its stage: the latent is replicated). Each running sequence
// also keeps its compressor state (kv_cost.state_bytes, 11.6 MiB at Flash for a whole-model
// stage) on the device outside the pool (gpu_worker/cuda/cuda_backend_kv.h), so the plan sets aside
// the states of `sequences` sequences before sizing the pool:
//   kv_pool_bytes = device - weights - reserve - sequences x state_bytes,
//   reserve = options.reserve_bytes + StepWorkspaceBytes(step_tokens, context) + link_bytes
//             + streamed_bytes
// where link_bytes, under the nccl stage transport (options.stage_links), are the stage links'
// streams buffers (gpu_worker/nccl_stage_link.h): step_tokens x hc·dim bf16 values, once for the
// link in (stage > 0) and twice for the link out (non-last stage); and streamed_bytes, when the
// streamed path of the routed experts is on (options.gpu_prefill_ring_bytes > 0,
// streamed_prefill.h), are its staging ring plus the workspace of a streamed step of step_tokens
// rows over this rank's share of each expert's intermediate dimension.
//
// Resident experts: the plan also reports how many routed experts `--gpu-experts auto` would keep
// resident on this GPU (resident_budget.h): what the pool leaves beyond the KV of
// options.resident_kv_tokens tokens (0: the context), after the resident path's workspace for
// steps of options.resident_max_rows rows, divided by one expert's bytes on this rank. The pool
// figures above are those without resident experts; with auto the pool shrinks to that K.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_defaults.h"
#include "common/kv_cost_model.h"
#include "common/model_config.h"
#include "gpu_worker/ring_budget.h"
#include "gpu_worker/streamed_prefill.h"

namespace ss::gpu {

struct StageLayout {
  int first_layer = 0;  // [first_layer, end_layer)
  int end_layer = 0;
  int tp_size = 1;
  bool first_stage = true;
  bool last_stage = true;
  bool runs_mtp = false;  // the last stage holds the MTP blocks' weights and KV
};

struct MemoryPlanOptions {
  // The CUDA context, the CUDA graphs and allocation slack (the worker's own 0.5 GiB beside the
  // context), on top of the workspace of a step of step_tokens tokens (the coordinator's
  // max_batch_tokens) at position `context` (0: the model's max_position_embeddings), which the
  // worker keeps free beside its pool (step_workspace.h).
  int64_t reserve_bytes = int64_t{1} << 30;  // 1 GiB
  int64_t step_tokens = 2048;
  int64_t context = 0;
  int64_t block_tokens = kDefaultKvBlockTokens;
  // The pool must hold at least this many tokens of one sequence (plus its fixed state),
  // else the layout is refused.
  int64_t min_kv_tokens = 8192;
  sched::IndexerKeyFormat indexer_keys = sched::IndexerKeyFormat::kMxfp4;
  // Sequences running at once whose compressor state must fit beside the pool: the
  // coordinator's default max_running (coordinator/cluster_config.h). A cluster that runs more
  // sequences must plan for them.
  int64_t sequences = 64;
  // The nccl stage transport: the stage links' buffers are set aside too.
  bool stage_links = false;
  // The streamed path of the routed experts (streamed_prefill.h; the cuda backend's
  // --gpu_prefill_ring_mib): auto (ring_budget.h, as a worker without resident experts sizes it,
  // with its KV pool filling the GPU unless resident_kv_tokens stands for a given --kv_tokens),
  // else the staging ring's bytes, 0 when the path is off;
  // and this rank's rows of each expert's intermediate dimension for its workspace (0:
  // moe_inter_dim / tp, the expert workers' slices divided over the TP ranks).
  bool gpu_prefill_ring_auto = true;
  int64_t gpu_prefill_ring_bytes = kBaseGpuPrefillRingMiB << 20;  // !gpu_prefill_ring_auto
  int64_t streamed_inter_rank = 0;
  // --gpu-experts auto (resident_budget.h): the KV tokens it keeps (the worker's --kv_tokens;
  // 0: `context`, i.e. the model's max_position_embeddings where that is 0 too; at least
  // min_kv_tokens), and the resident path's rows per step (CudaBackendOptions::
  // resident_max_rows).
  int64_t resident_kv_tokens = 0;
  int64_t resident_max_rows = 256;
};

struct MemoryPlan {
  int64_t weight_bytes = 0;        // resident on this GPU
  int64_t reserve_bytes = 0;       // options.reserve_bytes + workspace_bytes + link_bytes
                                   // + ring_bytes + streamed_workspace_bytes
  int64_t workspace_bytes = 0;     // StepWorkspaceBytes of options.step_tokens at options.context
  int64_t link_bytes = 0;          // the stage links' buffers (options.stage_links)
  int64_t ring_bytes = 0;          // the streamed path's staging ring (0: off)
  std::optional<RingBudget> ring;  // how auto sized it (options.gpu_prefill_ring_auto)
  int64_t streamed_workspace_bytes = 0;  // StreamedMoeWorkspaceBytes of step_tokens (ring on)
  int64_t sequences = 0;                 // options.sequences
  int64_t state_bytes = 0;               // their compressor states: sequences x kv_cost.state_bytes
  int64_t kv_pool_bytes = 0;             // what is left for the KV pool
  sched::KvCostModel kv_cost;
  int64_t kv_blocks = 0;
  int64_t kv_tokens = 0;  // tokens of ONE sequence the whole pool holds (fixed part excluded)
  // --gpu-experts auto on this GPU (resident_budget.h): one expert's bytes on this rank, the
  // experts auto would place (of stage_experts = layers x n_routed_experts), the KV tokens it
  // keeps and its figures.
  int64_t resident_expert_bytes = 0;
  int64_t resident_experts_fit = 0;
  int64_t stage_experts = 0;
  int64_t resident_kv_tokens = 0;
  int64_t resident_kv_bytes = 0;         // the pool of resident_kv_tokens tokens
  int64_t resident_workspace_bytes = 0;  // ResidentWorkspaceBytes of resident_max_rows rows
                                         // + the rebalance staging of kRebalanceSwaps experts
  int64_t resident_ring_bytes = 0;       // the ring beside them (auto's base ring with auto)
  // "weights 8.24 GiB + reserve 5.38 GiB (step workspace 3.13 GiB, streamed experts: ring
  // 1024.0 MiB + workspace 256.3 MiB) + compressor state 0.73 GiB (64 sequences x 11.6 MiB), KV
  // pool 9.65 GiB = 23040 blocks of 128 tokens (2948096 tokens; 8 window blocks per sequence)"
  // (Flash, TP 1 x PP 1, 24 GiB), then "; resident experts (--gpu-experts auto, KV kept for
  // 1048576 tokens): 496 of 11008 (4.5 %), 6.18 GiB"
  std::string Describe() const;
};

// Byte counts as the plan and the worker's start-up log print them: "8.24 GiB", "11.6 MiB".
std::string GiB(int64_t bytes);
std::string MiB(int64_t bytes);

// The bytes of the weights `layout` keeps on one GPU (a TP rank's share).
int64_t StageWeightBytes(const ModelConfig& model, const StageLayout& layout);

// The streamed path's rows of each expert's intermediate dimension on one rank of TP tp_size: the
// expert workers' slices divided over the ranks, ⌈moe_inter_dim / tp_size⌉.
int64_t StreamedInterRank(const ModelConfig& model, int tp_size);

// The plan for a device of `device_bytes`. FailedPrecondition, with every figure, when the
// weights and reserve do not fit, the compressor states of options.sequences sequences do not
// fit in what is left, or the pool would hold fewer than min_kv_tokens tokens; InvalidArgument
// for a layout the model does not allow (layer range, a TP that CheckTensorParallelSplit in
// common/tensor_parallel.h refuses) or options.sequences < 1.
absl::StatusOr<MemoryPlan> PlanStageMemory(const ModelConfig& model, const StageLayout& layout,
                                           int64_t device_bytes,
                                           const MemoryPlanOptions& options = {});

}  // namespace ss::gpu
