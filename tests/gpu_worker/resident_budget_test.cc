// --gpu-experts auto's budget (gpu_worker/resident_budget.h) and the memory plan's report of it
// (gpu_worker/memory_plan.h) at DeepSeek-V4-Flash sizes on 24 GiB cards: one expert's bytes per
// rank are the copy plan's device layout, the count is the hand formula (what the plan leaves
// beyond K tokens of KV and the resident workspace, over one expert's bytes), it grows with TP,
// and a K the card cannot hold places none while the plan still fits.
#include "gpu_worker/resident_budget.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/gpu_prefill_flags.h"
#include "gpu_worker/expert_copy_plan.h"
#include "gpu_worker/memory_plan.h"
#include "gpu_worker/streamed_prefill.h"
#include "gtest/gtest.h"
#include "tests/tools/test_configs.h"

namespace ss::gpu {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t k24GiB = 24 * kGiB;

ModelConfig Flash() {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(testing_util::kFlashConfig);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(ResidentBudgetTest, ExpertBytesPerRankAreTheCopyPlansLayout) {
  ModelConfig m = Flash();
  // By hand at Flash (dim 4096, moe_inter_dim 2048), TP 1: w1, w3 and w2 of 2048 x 4096 e2m1
  // codes (4 MiB each) and their ue8m0 scales (256 KiB each).
  EXPECT_EQ(ResidentExpertBytesPerRank(m, 1), 13'369'344);
  EXPECT_EQ(ResidentExpertBytesPerRank(m, 2), 13'369'344 / 2);
  EXPECT_EQ(ResidentExpertBytesPerRank(m, 4), 13'369'344 / 4);
  // The runtime's layout (expert_copy_plan.h): a rank of TP tp holds n / tp of the expert
  // workers' n slices (parts x part.bytes); from host weights, whole experts of 1/tp of the range.
  for (const int64_t inter : {int64_t{2048}, int64_t{512}}) {
    m.moe_inter_dim = inter;
    for (const int tp : {1, 2, 4}) {
      for (const int n : {tp, 2 * tp, 4 * tp}) {
        if (inter % n != 0 || (inter / n) % 128 != 0) continue;
        absl::StatusOr<PartBlockLayout> part = CompactPartBlockLayout(m.dim, inter / n);
        ASSERT_TRUE(part.ok()) << part.status();
        EXPECT_EQ(ResidentExpertBytesPerRank(m, tp), (n / tp) * part->bytes)
            << "inter " << inter << ", tp " << tp << ", " << n << " slices";
      }
      absl::StatusOr<PartBlockLayout> whole = CompactPartBlockLayout(m.dim, inter);
      ASSERT_TRUE(whole.ok());
      EXPECT_EQ(tp * ResidentExpertBytesPerRank(m, tp), whole->bytes) << inter << " " << tp;
    }
  }
}

TEST(ResidentBudgetTest, KvTokensAndTheFormula) {
  const ModelConfig m = Flash();
  EXPECT_EQ(ResidentKvTokens(m, 0, 0, 8192), m.max_position_embeddings);
  EXPECT_EQ(ResidentKvTokens(m, 0, 65536, 8192), 65536);
  EXPECT_EQ(ResidentKvTokens(m, 100000, 65536, 8192), 100000);  // the worker's --kv_tokens first
  EXPECT_EQ(ResidentKvTokens(m, 1000, 0, 8192), 8192);          // at least the minimum
  ResidentBudgetInputs in;
  in.free_bytes = 10'000;
  in.reserve_bytes = 1'000;
  in.state_bytes = 500;
  in.kv_bytes = 2'000;
  in.workspace_bytes = 400;
  in.expert_bytes = 1'000;
  in.max_experts = 100;
  ResidentBudget b = ComputeResidentBudget(in);
  EXPECT_EQ(b.left_bytes, 6'100);
  EXPECT_EQ(b.experts, 6);
  EXPECT_EQ(b.bytes(), 6'000);
  in.max_experts = 4;  // capped at the stage's layers x experts
  EXPECT_EQ(ComputeResidentBudget(in).experts, 4);
  in.kv_bytes = 20'000;  // nothing left: none, not an error
  b = ComputeResidentBudget(in);
  EXPECT_LT(b.left_bytes, 0);
  EXPECT_EQ(b.experts, 0);
  EXPECT_NE(b.Describe().find("0 experts (0.00 GiB) = free "), std::string::npos) << b.Describe();
  EXPECT_NE(b.Describe().find(" - KV for 0 tokens "), std::string::npos) << b.Describe();
  // The resident workspace: the streamed step's bound plus 2·rows·K int32.
  EXPECT_EQ(ResidentWorkspaceBytes(m, 256, 2048),
            StreamedMoeWorkspaceBytes(m, 256, 2048) + 2 * 256 * m.n_activated_experts * 4);
  EXPECT_LT(ResidentWorkspaceBytes(m, 256, 2048), 64 << 20);
}

// What auto places at Flash on 24 GiB: the plan's figures, by hand.
TEST(ResidentBudgetTest, FlashPlanCountsTheExpertsAutoPlaces) {
  const ModelConfig m = Flash();
  const int n = static_cast<int>(m.n_layers);
  for (const int pp : {1, 2}) {
    int64_t previous = -1;  // the stage 0 count at the previous TP
    for (const int tp : {1, 2, 4}) {
      for (int s = 0; s < pp; ++s) {
        const StageLayout l{n * s / pp, n * (s + 1) / pp, tp, s == 0, s == pp - 1, false};
        absl::StatusOr<MemoryPlan> p = PlanStageMemory(m, l, k24GiB);
        ASSERT_TRUE(p.ok()) << p.status();
        const std::string at = absl::StrCat("TP ", tp, " PP ", pp, " stage ", s);
        const int64_t k = m.max_position_embeddings;  // no --kv_tokens, no context: 1M
        EXPECT_EQ(p->resident_kv_tokens, k) << at;
        EXPECT_EQ(p->resident_kv_bytes, p->kv_cost.BlocksForTokens(k) * p->kv_cost.block_bytes);
        EXPECT_EQ(p->resident_expert_bytes, 13'369'344 / tp) << at;
        EXPECT_EQ(p->stage_experts, (l.end_layer - l.first_layer) * m.n_routed_experts) << at;
        EXPECT_EQ(p->resident_workspace_bytes,
                  ResidentWorkspaceBytes(m, 256, StreamedInterRank(m, tp)) +
                      kRebalanceSwaps * p->resident_expert_bytes);
        // The pool the plan leaves beside auto's base ring (the plan's own pool is beside the
        // ring auto gives without resident experts, ring_budget.h), less K tokens' KV and the
        // workspace, in whole experts.
        EXPECT_EQ(p->ring_bytes, int64_t{3072} << 20) << at;
        EXPECT_EQ(p->resident_ring_bytes, kBaseGpuPrefillRingMiB << 20) << at;
        const int64_t pool = p->kv_pool_bytes + p->ring_bytes - p->resident_ring_bytes;
        const int64_t left = pool - p->resident_kv_bytes - p->resident_workspace_bytes;
        EXPECT_EQ(p->resident_experts_fit,
                  std::min(left / p->resident_expert_bytes, p->stage_experts))
            << at;
        EXPECT_GT(p->resident_experts_fit, 0) << at;
        // The same figure through the function the cuda backend calls with cudaMemGetInfo's.
        ResidentBudgetInputs in;
        in.free_bytes = k24GiB - p->weight_bytes;
        in.reserve_bytes = p->reserve_bytes - p->ring_bytes + p->resident_ring_bytes;
        in.state_bytes = p->state_bytes;
        in.kv_tokens = k;
        in.kv_bytes = p->resident_kv_bytes;
        in.workspace_bytes = p->resident_workspace_bytes;
        in.expert_bytes = p->resident_expert_bytes;
        in.max_experts = p->stage_experts;
        const ResidentBudget b = ComputeResidentBudget(in);
        EXPECT_EQ(b.experts, p->resident_experts_fit) << at;
        if (tp == 1 && pp == 1) std::printf("Flash TP 1 on 24 GiB: %s\n", b.Describe().c_str());
        // What the experts leave still holds K tokens.
        EXPECT_GE(
            pool - p->resident_experts_fit * p->resident_expert_bytes - p->resident_workspace_bytes,
            p->resident_kv_bytes)
            << at;
        if (s == 0) {
          EXPECT_GT(p->resident_experts_fit, previous) << at;  // grows with TP
          previous = p->resident_experts_fit;
        }
        EXPECT_NE(p->Describe().find(absl::StrCat(
                      "; resident experts (--gpu-experts auto, beside a 1024 MiB ring, KV kept "
                      "for 1048576 tokens): ",
                      p->resident_experts_fit, " of ", p->stage_experts, " (")),
                  std::string::npos)
            << p->Describe();
      }
    }
  }
}

TEST(ResidentBudgetTest, KeptKvTokensTradeAgainstExperts) {
  const ModelConfig m = Flash();
  const StageLayout whole{0, 43, 1, true, true, false};
  MemoryPlanOptions o, base_ring;
  o.gpu_prefill_ring_auto = base_ring.gpu_prefill_ring_auto = false;  // the pools compared
  o.resident_kv_tokens = 65536;
  absl::StatusOr<MemoryPlan> short_kv = PlanStageMemory(m, whole, k24GiB, o);
  absl::StatusOr<MemoryPlan> dflt = PlanStageMemory(m, whole, k24GiB, base_ring);
  ASSERT_TRUE(short_kv.ok() && dflt.ok());
  EXPECT_EQ(short_kv->resident_kv_tokens, 65536);
  EXPECT_GT(short_kv->resident_experts_fit, dflt->resident_experts_fit);
  EXPECT_EQ(short_kv->kv_pool_bytes, dflt->kv_pool_bytes);  // the plan's own pool is unchanged
  // A planned context stands for K when no KV tokens are given.
  o.resident_kv_tokens = 0;
  o.context = 65536;
  absl::StatusOr<MemoryPlan> ctx = PlanStageMemory(m, whole, k24GiB, o);
  ASSERT_TRUE(ctx.ok());
  EXPECT_EQ(ctx->resident_kv_tokens, 65536);
  // A K beyond what the card holds: the plan fits (its minimum pool does), auto places none.
  o.resident_kv_tokens = 100'000'000;
  absl::StatusOr<MemoryPlan> huge = PlanStageMemory(m, whole, k24GiB, o);
  ASSERT_TRUE(huge.ok()) << huge.status();
  EXPECT_EQ(huge->resident_experts_fit, 0);
  EXPECT_NE(huge->Describe().find("KV kept for 100000000 tokens): 0 of 11008 (0.0 %), 0.00 GiB"),
            std::string::npos)
      << huge->Describe();
  // The whole stage's experts at most.
  absl::StatusOr<MemoryPlan> big = PlanStageMemory(m, whole, 2000 * kGiB);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->resident_experts_fit, 11008);
}

}  // namespace
}  // namespace ss::gpu
