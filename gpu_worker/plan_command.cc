#include "gpu_worker/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/gpu_prefill_flags.h"
#include "common/model_config.h"
#include "common/weight_source.h"
#include "gpu_worker/memory_plan.h"

namespace ss::gpu {
namespace {

constexpr char kPlanName[] = "splitserve-gpu-worker";

}  // namespace

int PrintPlan(const PlanFlags& f) {
  const std::string& model_dir = f.model;
  const int tp = f.tp, pp = f.pp;
  const double gib = f.gib;
  MemoryPlanOptions options;
  options.sequences = f.sequences;
  options.step_tokens = f.step_tokens;
  options.context = f.context;
  options.resident_kv_tokens = f.resident_kv_tokens;
  const std::string& transport = f.stage_transport;
  options.stage_links = transport == "nccl";
  if (model_dir.empty() || tp < 1 || pp < 1 || gib <= 0 || options.sequences < 1 ||
      options.step_tokens < 1 || options.context < 0 || options.resident_kv_tokens < 0 ||
      (transport != "grpc" && transport != "nccl")) {
    std::fprintf(stderr,
                 "%s: --plan needs --model DIR, --plan_tp >= 1, --plan_pp >= 1, "
                 "--plan_gib > 0, --plan_sequences >= 1, --plan_step_tokens >= 1, "
                 "--plan_context >= 0, --plan_resident_kv_tokens >= 0 and --plan_stage_transport "
                 "grpc or nccl\n",
                 kPlanName);
    return 2;
  }
  const absl::StatusOr<GpuPrefillRing> ring =
      ParseGpuPrefillRing(f.gpu_prefill_ring_mib, "--plan_gpu_prefill_ring_mib");
  if (!ring.ok()) {
    std::fprintf(stderr, "%s: %s\n", kPlanName, std::string(ring.status().message()).c_str());
    return 2;
  }
  if (absl::Status s = ValidateHfOverrides(f.hf_overrides); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", kPlanName, std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<ModelConfig> model =
      LoadModelConfig(WeightSource{.model_dir = model_dir, .hf_overrides = f.hf_overrides});
  if (!model.ok()) {
    std::fprintf(stderr, "%s: %s\n", kPlanName, std::string(model.status().message()).c_str());
    return 1;
  }
  const int n = static_cast<int>(model->n_layers);
  if (pp > n) {
    std::fprintf(stderr, "%s: --plan_pp %d exceeds the model's %d layers\n", kPlanName, pp, n);
    return 2;
  }
  const int64_t device_bytes = static_cast<int64_t>(gib * 1073741824.0);
  options.gpu_prefill_ring_auto = ring->is_auto;
  options.gpu_prefill_ring_bytes = ring->mib << 20;
  const std::string streamed =
      ring->is_auto ? std::string(
                          "streamed to the GPU for large prefill steps through a staging "
                          "ring sized by auto")
      : ring->mib > 0 ? absl::StrCat("streamed to the GPU for large prefill steps through a ",
                                     ring->mib, " MiB staging ring")
                      : std::string("never streamed: --plan_gpu_prefill_ring_mib 0");
  std::printf(
      "%s x TP %d x PP %d on %.1f GiB GPUs (routed experts on CPU expert workers, %s), "
      "steps of %lld tokens, compressor state of %lld sequences:\n",
      model_dir.c_str(), tp, pp, gib, streamed.c_str(), static_cast<long long>(options.step_tokens),
      static_cast<long long>(options.sequences));
  int failures = 0;
  // The pipeline holds its smallest pool's blocks, and a sequence needs the most window blocks
  // of any stage (common/kv_cost_model.h, KvCostModel::Pipeline).
  int64_t min_blocks = -1, max_fixed = 0, block_tokens = 0;
  int64_t resident = 0, resident_kv_tokens = 0;
  for (int s = 0; s < pp; ++s) {
    StageLayout l{n * s / pp, n * (s + 1) / pp, tp, s == 0, s == pp - 1, false};
    absl::StatusOr<MemoryPlan> plan = PlanStageMemory(*model, l, device_bytes, options);
    if (!plan.ok()) {
      ++failures;
      std::printf("  stage %d (layers %d-%d), each of %d GPU(s): DOES NOT FIT: %s\n", s,
                  l.first_layer, l.end_layer - 1, tp, std::string(plan.status().message()).c_str());
      continue;
    }
    min_blocks = min_blocks < 0 ? plan->kv_blocks : std::min(min_blocks, plan->kv_blocks);
    max_fixed = std::max(max_fixed, plan->kv_cost.fixed_blocks);
    block_tokens = plan->kv_cost.block_tokens;
    resident += plan->resident_experts_fit;
    resident_kv_tokens = plan->resident_kv_tokens;
    std::printf("  stage %d (layers %d-%d), each of %d GPU(s): %s\n", s, l.first_layer,
                l.end_layer - 1, tp, plan->Describe().c_str());
  }
  if (failures > 0) {
    std::printf("refused: %d stage(s) do not fit\n", failures);
    return 1;
  }
  std::printf(
      "fits: the pipeline holds %lld tokens of KV (its smallest stage pool, less the most window "
      "blocks a stage needs per sequence)\n",
      static_cast<long long>(std::max<int64_t>(0, min_blocks - max_fixed) * block_tokens));
  const int64_t all = model->n_layers * model->n_routed_experts;
  std::printf(
      "resident experts with --gpu-experts auto: %lld of %lld (%.1f %%) over the layout's %d "
      "GPUs (each keeping KV for %lld tokens)\n",
      static_cast<long long>(resident), static_cast<long long>(all),
      all > 0 ? 100.0 * static_cast<double>(resident) / static_cast<double>(all) : 0.0, tp * pp,
      static_cast<long long>(resident_kv_tokens));
  return 0;
}

}  // namespace ss::gpu
