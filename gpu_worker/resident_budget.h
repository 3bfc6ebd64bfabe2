// How many routed experts `--gpu-experts auto` keeps resident on one GPU (resident experts:
// gpu_worker/cuda/resident_routed_experts.h), computed the same way by the memory plan
// (memory_plan.h, from config.json) and by the cuda backend at start (from cudaMemGetInfo once
// the trunk's weights and the streamed path are on the device). Plain C++, no CUDA.
//
// auto fills what is left of the device after everything else the worker keeps there:
//   left    = free - reserve - states - kv(K) - workspace
//   experts = min(max(left, 0) / expert_bytes, layers x n_routed_experts)
// where
//   free      the device bytes not taken by the trunk's weights (and, at run time, the streamed
//             path's ring and workspace, which the plan counts in `reserve` instead);
//   reserve   the margin kept beside the pool (kv_reserve_bytes / MemoryPlanOptions::
//             reserve_bytes), the largest step's workspace, and in the plan the stage links'
//             buffers and the streamed path;
//   states    the compressor states of the planned running sequences;
//   kv(K)     the KV pool of K tokens, K = ResidentKvTokens: the worker's --kv_tokens when > 0,
//             else the longest sequence served (--max-model-len; 0: the model's
//             max_position_embeddings), and at least min_kv_tokens;
//   workspace the resident path's own grouped-MoE workspace for steps of max_rows rows
//             (ResidentWorkspaceBytes) and the rebalance's staging buffer of kRebalanceSwaps
//             experts (expert_rebalancer.h; counted whether or not the rebalance is on);
//   expert_bytes  one expert's device bytes on this rank (ResidentExpertBytesPerRank).
// The KV pool is then fitted to what the experts leave, so it holds K tokens plus the remainder
// of the last expert. Nothing left places 0 experts (not an error: the pool still holds its
// minimum where the plan fits).
//
// Threads: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>

#include "common/model_config.h"

namespace ss::gpu {

// Experts one rebalance round moves at most: the resident path's staging buffer holds this many
// (ResidentExpertsOptions::max_swaps).
inline constexpr int kRebalanceSwaps = 8;

// The device bytes of one routed expert on one rank of TP tp_size, in the layout the resident
// and streamed paths give it (expert_copy_plan.h LayerStreamPlan::expert_bytes = parts x
// part.bytes): the MXFP4 e2m1 codes and ue8m0 scales of w1, w3 [inter, dim] and w2 [dim, inter]
// for the rank's ⌈moe_inter_dim / tp_size⌉ rows of the intermediate dimension, each of the six
// pieces 64-byte aligned (common/expert_store_format.h). At every shape whose pieces are already
// multiples of 64 bytes (DeepSeek-V4's) this equals the runtime's figure for any number of slices
// per rank; Flash (dim 4096, moe_inter_dim 2048) at TP 1: 13,369,344 bytes. A rank computing
// whole experts of its range from host weights (TP > 1 without expert workers) holds 1/tp of the
// experts at tp times the bytes: the same bytes per expert of the stage's budget on average.
int64_t ResidentExpertBytesPerRank(const ModelConfig& model, int tp_size);

// An upper bound of the resident path's workspace (expert_sources.h MoeWorkspaceBytes, as
// ResidentRoutedExperts reserves it) for steps of max_rows rows over n_routed_experts experts of
// inter_rank rows here: the streamed step's workspace of max_rows rows
// (streamed_prefill.h StreamedMoeWorkspaceBytes) plus 2·rows·K int32 values.
int64_t ResidentWorkspaceBytes(const ModelConfig& model, int64_t max_rows, int64_t inter_rank);

// K above: kv_tokens when > 0, else context (0: the model's max_position_embeddings); at least
// min_kv_tokens.
int64_t ResidentKvTokens(const ModelConfig& model, int64_t kv_tokens, int64_t context,
                         int64_t min_kv_tokens);

// The figures of the formula above, in bytes (kv_tokens is K, for the description).
struct ResidentBudgetInputs {
  int64_t free_bytes = 0;
  int64_t reserve_bytes = 0;
  int64_t state_bytes = 0;
  int64_t kv_tokens = 0;
  int64_t kv_bytes = 0;
  int64_t workspace_bytes = 0;
  int64_t expert_bytes = 0;
  int64_t max_experts = 0;  // layers x n_routed_experts
};

struct ResidentBudget {
  ResidentBudgetInputs in;
  int64_t left_bytes = 0;  // free - reserve - states - kv - workspace (negative: short)
  int64_t experts = 0;
  int64_t bytes() const { return experts * in.expert_bytes; }
  // "496 experts (6.18 GiB) = free 15.76 GiB - reserve 5.38 GiB - compressor states 0.73 GiB -
  // KV for 1048576 tokens 3.44 GiB - workspace 32.1 MiB, / 12.8 MiB per expert (of 11008)"
  // (the plan's figures at Flash, TP 1 x PP 1, 24 GiB)
  std::string Describe() const;
};

// The formula above. Negative or zero figures where bytes are expected give 0 experts.
ResidentBudget ComputeResidentBudget(const ResidentBudgetInputs& in);

}  // namespace ss::gpu
