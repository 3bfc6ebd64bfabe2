#include "gpu_worker/memory_plan.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/checkpoint_schema.h"
#include "common/int_math.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor_parallel.h"
#include "gpu_worker/resident_budget.h"
#include "gpu_worker/step_workspace.h"

namespace ss::gpu {
namespace {

enum class Placement { kNone, kReplicated, kSharded };

// Where tensor `name` lives for `layout`.
Placement Place(absl::string_view name, const StageLayout& layout) {
  auto in = [&](absl::string_view part) { return absl::StrContains(name, part); };
  if (in(".experts.")) return Placement::kNone;  // routed experts: CPU expert workers
  int64_t layer = -1;
  if (absl::StartsWith(name, "layers.")) {
    absl::string_view rest = name.substr(7);
    absl::SimpleAtoi(rest.substr(0, rest.find('.')), &layer);
    if (layer < layout.first_layer || layer >= layout.end_layer) return Placement::kNone;
  } else if (absl::StartsWith(name, "mtp.")) {
    if (!layout.last_stage || !layout.runs_mtp) return Placement::kNone;
  } else if (absl::StartsWith(name, "embed.")) {
    return layout.first_stage ? Placement::kReplicated : Placement::kNone;
  } else if (absl::StartsWith(name, "head.")) {
    return layout.last_stage ? Placement::kSharded : Placement::kNone;
  } else {
    return layout.last_stage ? Placement::kReplicated : Placement::kNone;  // norm, hc_head
  }
  if (in(".attn.wq_b.") || in(".attn.wo_a.") || in(".attn.wo_b.") || in(".attn_sink") ||
      in(".shared_experts.")) {
    return Placement::kSharded;
  }
  return Placement::kReplicated;
}

absl::Status CheckLayout(const ModelConfig& model, const StageLayout& l) {
  if (l.first_layer < 0 || l.end_layer > model.n_layers || l.first_layer >= l.end_layer) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", l.first_layer, ", ", l.end_layer,
                                                   ") are not a range of the model's ",
                                                   model.n_layers));
  }
  return CheckTensorParallelSplit(model, l.tp_size);
}

}  // namespace

std::string GiB(int64_t bytes) { return absl::StrFormat("%.2f GiB", bytes / 1073741824.0); }
std::string MiB(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

int64_t StageWeightBytes(const ModelConfig& model, const StageLayout& layout) {
  int64_t bytes = 0;
  for (const ExpectedTensor& t : ExpectedTensors(model)) {
    const Placement p = Place(t.name, layout);
    if (p == Placement::kNone) continue;
    int64_t n = static_cast<int64_t>(DTypeSize(t.dtype));
    for (int64_t d : t.shape) n *= d;
    bytes += p == Placement::kSharded ? CeilDiv(n, layout.tp_size) : n;
  }
  return bytes;
}

int64_t StreamedInterRank(const ModelConfig& model, int tp_size) {
  return CeilDiv(model.moe_inter_dim, int64_t{tp_size});
}

absl::StatusOr<MemoryPlan> PlanStageMemory(const ModelConfig& model, const StageLayout& layout,
                                           int64_t device_bytes, const MemoryPlanOptions& options) {
  RETURN_IF_ERROR(CheckLayout(model, layout));
  if (options.sequences < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: sequences = ", options.sequences, " must be at least 1"));
  }
  MemoryPlan plan;
  plan.weight_bytes = StageWeightBytes(model, layout);
  plan.workspace_bytes = StepWorkspaceBytes(model, layout.tp_size, layout.first_layer,
                                            layout.end_layer, options.step_tokens, options.context);
  if (options.stage_links) {
    const int64_t buffers = (layout.first_stage ? 0 : 1) + (layout.last_stage ? 0 : 2);
    plan.link_bytes = buffers * options.step_tokens * model.hc_mult * model.dim * 2;
  }
  if ((!options.gpu_prefill_ring_auto && options.gpu_prefill_ring_bytes < 0) ||
      options.streamed_inter_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: gpu_prefill_ring_bytes = ", options.gpu_prefill_ring_bytes,
                     " and streamed_inter_rank = ", options.streamed_inter_rank, " must be >= 0"));
  }
  sched::KvCostOptions ko;
  ko.block_tokens = options.block_tokens;
  ko.first_layer = layout.first_layer;
  ko.end_layer = layout.end_layer;
  ko.include_mtp = layout.last_stage && layout.runs_mtp;
  ko.indexer_keys = options.indexer_keys;
  ASSIGN_OR_RETURN(plan.kv_cost, sched::KvCostModel::FromModelConfig(model, ko));
  plan.sequences = options.sequences;
  plan.state_bytes = options.sequences * plan.kv_cost.state_bytes;
  plan.resident_kv_tokens =
      ResidentKvTokens(model, options.resident_kv_tokens, options.context, options.min_kv_tokens);
  plan.resident_kv_bytes =
      plan.kv_cost.BlocksForTokens(plan.resident_kv_tokens) * plan.kv_cost.block_bytes;
  const int64_t base_reserve = options.reserve_bytes + plan.workspace_bytes + plan.link_bytes;
  if (options.gpu_prefill_ring_auto || options.gpu_prefill_ring_bytes > 0) {
    const int64_t inter_rank = options.streamed_inter_rank > 0
                                   ? options.streamed_inter_rank
                                   : StreamedInterRank(model, layout.tp_size);
    plan.streamed_workspace_bytes =
        StreamedMoeWorkspaceBytes(model, options.step_tokens, inter_rank);
  }
  if (!options.gpu_prefill_ring_auto) {
    plan.ring_bytes = options.gpu_prefill_ring_bytes;
  } else {
    // As a worker without resident experts (up's --gpu-experts 0) sizes it; one given its KV
    // tokens (--plan_resident_kv_tokens for --kv_tokens) keeps the base ring.
    RingBudgetInputs in;
    in.fills_device = options.resident_kv_tokens == 0;
    in.free_bytes = device_bytes - plan.weight_bytes;
    in.reserve_bytes = base_reserve;
    in.state_bytes = plan.state_bytes;
    in.kv_tokens = plan.resident_kv_tokens;
    in.kv_bytes = plan.resident_kv_bytes;
    in.streamed_workspace_bytes = plan.streamed_workspace_bytes;
    plan.ring = ComputeRingBudget(in);
    plan.ring_bytes = plan.ring->ring_bytes;
  }
  plan.reserve_bytes = base_reserve + plan.ring_bytes + plan.streamed_workspace_bytes;
  const std::string where =
      absl::StrCat("layers ", layout.first_layer, "-", layout.end_layer - 1, " at TP ",
                   layout.tp_size, " on a ", GiB(device_bytes), " device");
  const int64_t free_bytes = device_bytes - plan.weight_bytes - plan.reserve_bytes;
  if (free_bytes <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, " does not fit: weights ", GiB(plan.weight_bytes), " + reserve ",
                     GiB(plan.reserve_bytes),
                     " exceed the device; use more pipeline stages or "
                     "a larger TP size"));
  }
  plan.kv_pool_bytes = free_bytes - plan.state_bytes;
  if (plan.kv_pool_bytes <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, " does not fit the compressor state of ", options.sequences,
                     " sequences: ", options.sequences, " x ", MiB(plan.kv_cost.state_bytes), " = ",
                     GiB(plan.state_bytes), ", and weights ", GiB(plan.weight_bytes), " + reserve ",
                     GiB(plan.reserve_bytes), " leave ", GiB(free_bytes),
                     "; plan fewer running sequences, more pipeline stages or a larger TP size"));
  }
  plan.kv_blocks = plan.kv_cost.BlocksInPool(plan.kv_pool_bytes);
  plan.kv_tokens = plan.kv_cost.TokensInBlocks(plan.kv_blocks);
  if (plan.kv_tokens < options.min_kv_tokens) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, " leaves ", GiB(plan.kv_pool_bytes),
                     " for the KV cache: ", plan.kv_tokens, " tokens, fewer than the minimum of ",
                     options.min_kv_tokens, "; use more pipeline stages or a larger TP size"));
  }
  plan.stage_experts = int64_t{layout.end_layer - layout.first_layer} * model.n_routed_experts;
  plan.resident_expert_bytes = ResidentExpertBytesPerRank(model, layout.tp_size);
  plan.resident_workspace_bytes = ResidentWorkspaceBytes(model, options.resident_max_rows,
                                                         StreamedInterRank(model, layout.tp_size)) +
                                  kRebalanceSwaps * plan.resident_expert_bytes;
  ResidentBudgetInputs in;
  in.free_bytes = device_bytes - plan.weight_bytes;
  // With resident experts auto keeps its base ring.
  plan.resident_ring_bytes =
      options.gpu_prefill_ring_auto ? kBaseGpuPrefillRingMiB << 20 : plan.ring_bytes;
  in.reserve_bytes = base_reserve + plan.resident_ring_bytes + plan.streamed_workspace_bytes;
  in.state_bytes = plan.state_bytes;
  in.kv_tokens = plan.resident_kv_tokens;
  in.kv_bytes = plan.resident_kv_bytes;
  in.workspace_bytes = plan.resident_workspace_bytes;
  in.expert_bytes = plan.resident_expert_bytes;
  in.max_experts = plan.stage_experts;
  plan.resident_experts_fit = ComputeResidentBudget(in).experts;
  return plan;
}

std::string MemoryPlan::Describe() const {
  return absl::StrFormat(
      "weights %s + reserve %s (step workspace %s%s) + compressor state %s (%d sequences x %s), "
      "KV pool %s = %d blocks of %d tokens (%d tokens; %d window blocks per sequence)%s",
      GiB(weight_bytes), GiB(reserve_bytes), GiB(workspace_bytes),
      absl::StrCat(link_bytes > 0 ? absl::StrCat(", stage links ", MiB(link_bytes)) : "",
                   ring_bytes > 0 ? absl::StrCat(", streamed experts: ring ", MiB(ring_bytes),
                                                 ring ? " (auto)" : "", " + workspace ",
                                                 MiB(streamed_workspace_bytes))
                                  : ""),
      GiB(state_bytes), sequences, MiB(kv_cost.state_bytes), GiB(kv_pool_bytes), kv_blocks,
      kv_cost.block_tokens, kv_tokens, kv_cost.fixed_blocks,
      absl::StrFormat("; resident experts (--gpu-experts auto%s, KV kept for %d tokens): %d of "
                      "%d (%.1f %%), %s",
                      resident_ring_bytes != ring_bytes
                          ? absl::StrCat(", beside a ", resident_ring_bytes >> 20, " MiB ring")
                          : "",
                      resident_kv_tokens, resident_experts_fit, stage_experts,
                      stage_experts > 0 ? 100.0 * resident_experts_fit / stage_experts : 0.0,
                      GiB(resident_experts_fit * resident_expert_bytes)));
}

}  // namespace ss::gpu
