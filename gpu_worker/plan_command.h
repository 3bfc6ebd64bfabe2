// splitserve-gpu-worker --plan: the device-memory plan of every GPU of a TP x PP layout
// (memory_plan.h), printed without loading weights or touching a GPU, with the routed experts
// `--gpu-experts auto` would keep resident on each stage's GPUs and over the whole layout
// (resident_budget.h).
#pragma once

#include <cstdint>
#include <string>

#include "gpu_worker/memory_plan.h"

namespace ss::gpu {

// The --plan_* flags (worker_flags.cc) with their defaults.
struct PlanFlags {
  std::string model;         // --model: the checkpoint whose config.json is planned
  std::string hf_overrides;  // --hf_overrides: merged into that config.json (weight_source.h)
  int tp = 1;                // --plan_tp: tensor-parallel size
  int pp = 1;                // --plan_pp: pipeline stages, layers split evenly
  double gib = 24.0;         // --plan_gib: memory of each GPU
  int64_t sequences = MemoryPlanOptions{}.sequences;
  int64_t step_tokens = MemoryPlanOptions{}.step_tokens;
  std::string stage_transport = "grpc";  // or "nccl": set aside the stage links' buffers
  int64_t context = 0;                   // 0: the model's max_position_embeddings
  // --plan_gpu_prefill_ring_mib: auto | MIB, the streamed path's staging ring (0: off), counted
  // with its step workspace (memory_plan.h; auto: ring_budget.h).
  std::string gpu_prefill_ring_mib = "auto";
  // --plan_resident_kv_tokens: the KV tokens --gpu-experts auto keeps (the worker's --kv_tokens;
  // 0: the context).
  int64_t resident_kv_tokens = 0;
};

// Prints each stage's plan to stdout (its line ends with the resident experts auto places on each
// of its GPUs), then, when every GPU fits, the pipeline's KV and "resident experts with
// --gpu-experts auto: N of M (x %) over the layout's G GPUs" (M: the model's layers x routed
// experts; a stage's TP ranks hold slices of the same experts). Returns the exit status: 0 when
// every GPU fits, 1 when one does not (each says why) or the model cannot be read, 2 for invalid
// flags (on stderr).
int PrintPlan(const PlanFlags& flags);

}  // namespace ss::gpu
