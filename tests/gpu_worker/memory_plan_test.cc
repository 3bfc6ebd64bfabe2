// The GPU worker's memory plan at DeepSeek-V4-Flash sizes on 24 GB cards.
#include "gpu_worker/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "common/checkpoint_schema.h"
#include "gpu_worker/step_workspace.h"
#include "gpu_worker/streamed_prefill.h"
#include "gtest/gtest.h"
#include "tests/tools/test_configs.h"

namespace ss::gpu {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t k3090 = 24 * kGiB;

ModelConfig Flash() {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(testing_util::kFlashConfig);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

int64_t AllNonExpertBytes(const ModelConfig& m) {
  int64_t bytes = 0;
  for (const ExpectedTensor& t : ExpectedTensors(m)) {
    if (t.name.find(".experts.") != std::string::npos) continue;
    int64_t n = static_cast<int64_t>(DTypeSize(t.dtype));
    for (int64_t d : t.shape) n *= d;
    bytes += n;
  }
  return bytes;
}

TEST(MemoryPlanTest, ShardsSumToTheWholeNonExpertModel) {
  const ModelConfig m = Flash();
  const int n = static_cast<int>(m.n_layers);
  for (int tp : {1, 2, 4, 8}) {
    for (int pp : {1, 2, 5}) {
      int64_t total = 0, embed_copies = 0;
      for (int s = 0; s < pp; ++s) {
        StageLayout l{n * s / pp, n * (s + 1) / pp, tp, s == 0, s == pp - 1, true};
        total += tp * StageWeightBytes(m, l);
        embed_copies += s == 0 ? tp - 1 : 0;
      }
      // Sharded tensors sum back exactly (their sizes divide by tp); the embedding is on every
      // rank of the first stage, so tp - 1 extra copies; the replicated attention parts too.
      const int64_t embed = m.vocab_size * m.dim * 2;
      EXPECT_GE(total, AllNonExpertBytes(m) + embed_copies * embed) << tp << "x" << pp;
      if (tp == 1) {
        EXPECT_EQ(total, AllNonExpertBytes(m)) << pp;
      }
    }
  }
}

TEST(MemoryPlanTest, FlashFitsOn3090sAndReportsKvCapacity) {
  const ModelConfig m = Flash();
  // One card, whole model (no routed experts): the plan of issue 5's smallest layout.
  absl::StatusOr<MemoryPlan> one = PlanStageMemory(m, {0, 43, 1, true, true, true}, k3090);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_GT(one->weight_bytes, 5 * kGiB);
  EXPECT_LT(one->weight_bytes, 12 * kGiB);
  EXPECT_GT(one->kv_tokens, 1'000'000);  // ~3.5 KB per token of compressed KV
  // The compressor states of 64 sequences (the MTP block is SWA: no compressor) come off the
  // pool; the pool's blocks and window blocks are the cuda backend's (MXFP4 keys).
  EXPECT_EQ(one->sequences, 64);
  EXPECT_EQ(one->kv_cost.state_bytes, 12'206'080);
  EXPECT_EQ(one->state_bytes, 64 * 12'206'080);
  EXPECT_EQ(one->kv_pool_bytes, k3090 - one->weight_bytes - one->reserve_bytes - one->state_bytes);
  // The reserve: 1 GiB plus what the worker keeps free at start, a 2048-token step's workspace at
  // the model's 1M positions (step_workspace.h); a shorter planned context leaves more KV.
  EXPECT_EQ(one->workspace_bytes, StepWorkspaceBytes(m, 1, 0, 43, 2048, 1 << 20));
  // And the streamed path's staging ring, auto by default (ring_budget.h): 3 GiB, since the pool
  // beside it still holds the 1M tokens of the model's context; with a 2048-row streamed step's
  // workspace.
  ASSERT_TRUE(one->ring.has_value());
  EXPECT_EQ(one->ring_bytes, int64_t{3072} << 20);
  EXPECT_EQ(one->streamed_workspace_bytes, StreamedMoeWorkspaceBytes(m, 2048, 2048));
  EXPECT_EQ(one->reserve_bytes,
            kGiB + one->workspace_bytes + one->ring_bytes + one->streamed_workspace_bytes);
  EXPECT_NE(one->Describe().find("(step workspace 3.13 GiB, streamed experts: ring 3072.0 MiB "
                                 "(auto) + workspace 256.3 MiB)"),
            std::string::npos)
      << one->Describe();
  EXPECT_GE(one->kv_tokens, 1 << 20);
  MemoryPlanOptions short_context;
  short_context.context = 131072;
  absl::StatusOr<MemoryPlan> shorter =
      PlanStageMemory(m, {0, 43, 1, true, true, true}, k3090, short_context);
  ASSERT_TRUE(shorter.ok()) << shorter.status();
  EXPECT_EQ(shorter->workspace_bytes, StepWorkspaceBytes(m, 1, 0, 43, 2048, 131072));
  EXPECT_GT(shorter->kv_tokens, one->kv_tokens);
  EXPECT_EQ(one->kv_cost.block_bytes, 449'824);
  EXPECT_EQ(one->kv_cost.fixed_blocks, 8);
  EXPECT_EQ(one->kv_blocks, one->kv_pool_bytes / 449'824);
  EXPECT_EQ(one->kv_tokens, (one->kv_blocks - 8) * 128);
  EXPECT_NE(one->Describe().find("blocks of 128 tokens"), std::string::npos) << one->Describe();
  EXPECT_NE(one->Describe().find("compressor state 0.73 GiB (64 sequences x 11.6 MiB)"),
            std::string::npos)
      << one->Describe();
  // TP 2 x PP 2: every rank holds less, so more KV.
  absl::StatusOr<MemoryPlan> tp2pp2 = PlanStageMemory(m, {0, 21, 2, true, false, false}, k3090);
  ASSERT_TRUE(tp2pp2.ok()) << tp2pp2.status();
  EXPECT_LT(tp2pp2->weight_bytes, one->weight_bytes / 2);
  EXPECT_GT(tp2pp2->kv_pool_bytes, one->kv_pool_bytes);
}

// Two stages of layers [0, 21) and [21, 43) (--plan_pp 2): each holds its own layers' states and
// counts its own blocks (common/kv_cost_model.h's Flash figures).
TEST(MemoryPlanTest, FlashTwoStagesSetAsideTheirOwnStates) {
  const ModelConfig m = Flash();
  absl::StatusOr<MemoryPlan> s0 = PlanStageMemory(m, {0, 21, 1, true, false, false}, k3090);
  absl::StatusOr<MemoryPlan> s1 = PlanStageMemory(m, {21, 43, 1, false, true, false}, k3090);
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_EQ(s0->state_bytes, 64 * 5'537'792);
  EXPECT_EQ(s1->state_bytes, 64 * 6'668'288);
  EXPECT_EQ(s0->kv_cost.block_bytes, 213'896);
  EXPECT_EQ(s1->kv_cost.block_bytes, 235'928);
  EXPECT_EQ(s0->kv_cost.fixed_blocks, 8);
  EXPECT_EQ(s1->kv_cost.fixed_blocks, 7);
  for (const MemoryPlan* p : {&*s0, &*s1}) {
    EXPECT_EQ(p->kv_pool_bytes, k3090 - p->weight_bytes - p->reserve_bytes - p->state_bytes);
  }
}

TEST(MemoryPlanTest, NcclStageLinksSetAsideTheirBuffers) {
  const ModelConfig m = Flash();
  MemoryPlanOptions o;
  o.stage_links = true;
  const int64_t buffer = 2048 * 4 * 4096 * 2;  // step_tokens x hc x dim bf16: 64 MiB
  for (const auto& [layout, buffers] :
       std::vector<std::pair<StageLayout, int64_t>>{{{0, 14, 1, true, false, false}, 2},
                                                    {{14, 28, 1, false, false, false}, 3},
                                                    {{28, 43, 1, false, true, false}, 1},
                                                    {{0, 43, 1, true, true, false}, 0}}) {
    absl::StatusOr<MemoryPlan> linked = PlanStageMemory(m, layout, k3090, o);
    absl::StatusOr<MemoryPlan> plain = PlanStageMemory(m, layout, k3090);
    ASSERT_TRUE(linked.ok() && plain.ok());
    EXPECT_EQ(linked->link_bytes, buffers * buffer) << layout.first_layer;
    EXPECT_EQ(linked->reserve_bytes - plain->reserve_bytes, buffers * buffer);
    EXPECT_EQ(plain->kv_pool_bytes - linked->kv_pool_bytes, buffers * buffer);
    EXPECT_EQ(linked->Describe().find("stage links") != std::string::npos, buffers > 0);
  }
}

// The streamed path (streamed_prefill.h): its ring and a streamed step's workspace over the
// rank's intermediate share come out of the pool; ring 0 turns both off.
TEST(MemoryPlanTest, StreamedPathSetsAsideItsRingAndWorkspace) {
  const ModelConfig m = Flash();
  MemoryPlanOptions off, fixed;
  off.gpu_prefill_ring_auto = fixed.gpu_prefill_ring_auto = false;
  off.gpu_prefill_ring_bytes = 0;
  fixed.gpu_prefill_ring_bytes = int64_t{1024} << 20;
  for (const StageLayout& l :
       {StageLayout{0, 43, 1, true, true, false}, StageLayout{0, 43, 4, true, true, false},
        StageLayout{21, 43, 2, false, true, false}}) {
    absl::StatusOr<MemoryPlan> on = PlanStageMemory(m, l, k3090, fixed);
    absl::StatusOr<MemoryPlan> none = PlanStageMemory(m, l, k3090, off);
    ASSERT_TRUE(on.ok() && none.ok()) << on.status() << none.status();
    const int64_t ws = StreamedMoeWorkspaceBytes(m, 2048, m.moe_inter_dim / l.tp_size);
    EXPECT_EQ(on->ring_bytes, int64_t{1024} << 20);
    EXPECT_EQ(on->streamed_workspace_bytes, ws) << l.tp_size;
    EXPECT_EQ(none->ring_bytes, 0);
    EXPECT_EQ(none->streamed_workspace_bytes, 0);
    EXPECT_EQ(on->reserve_bytes - none->reserve_bytes, (int64_t{1024} << 20) + ws);
    EXPECT_EQ(none->kv_pool_bytes - on->kv_pool_bytes, (int64_t{1024} << 20) + ws);
    EXPECT_EQ(none->Describe().find("streamed experts"), std::string::npos);
    EXPECT_NE(on->Describe().find("streamed experts: ring 1024.0 MiB"), std::string::npos);
  }
  // The rank's share given explicitly (a slicing other than inter / tp).
  MemoryPlanOptions share;
  share.streamed_inter_rank = 512;
  absl::StatusOr<MemoryPlan> p = PlanStageMemory(m, {0, 43, 1, true, true, false}, k3090, share);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->streamed_workspace_bytes, StreamedMoeWorkspaceBytes(m, 2048, 512));
  MemoryPlanOptions bad;
  bad.gpu_prefill_ring_auto = false;
  bad.gpu_prefill_ring_bytes = -1;
  EXPECT_EQ(PlanStageMemory(m, {0, 43, 1, true, true, false}, k3090, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Issue 31's memory requirement: with the default ring (auto), every TP x PP layout that --plan
// accepts on 24 GiB without the streamed path still fits at the default 2048-token step, with a
// pool of at least the model's 1M positions; and at 8192-token steps (`splitserve up`'s step when
// the cuda backend may stream) too, one GPU holding all 43 layers included, since the indexer's
// scores of an 8192-token chunk at 1M positions take 2 GiB slices (kIndexerScoresBytes), not
// 8 GiB.
TEST(MemoryPlanTest, FlashFitsWithTheDefaultRingOn24GiB) {
  const ModelConfig m = Flash();
  const int n = static_cast<int>(m.n_layers);
  // The smallest stage's KV tokens of a TP x PP layout (-1 when a stage does not fit) and the
  // smallest stage ring; ring_mib -1: auto.
  struct Fit {
    int64_t kv_tokens = -1, ring_mib = 0;
  };
  auto fit = [&](int tp, int pp, int64_t step, int64_t ring_mib) -> Fit {
    MemoryPlanOptions o;
    o.step_tokens = step;
    o.gpu_prefill_ring_auto = ring_mib < 0;
    o.gpu_prefill_ring_bytes = std::max<int64_t>(ring_mib, 0) << 20;
    Fit f;
    for (int s = 0; s < pp; ++s) {
      StageLayout l{n * s / pp, n * (s + 1) / pp, tp, s == 0, s == pp - 1, false};
      absl::StatusOr<MemoryPlan> p = PlanStageMemory(m, l, k3090, o);
      if (!p.ok()) return Fit{};
      const int64_t ring = p->ring_bytes >> 20;
      f.ring_mib = s == 0 ? ring : std::min(f.ring_mib, ring);
      f.kv_tokens = s == 0 ? p->kv_tokens : std::min(f.kv_tokens, p->kv_tokens);
    }
    return f;
  };
  int accepted = 0;
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2, 4}) {
      const int64_t off = fit(tp, pp, 2048, 0).kv_tokens;
      if (off < 0) continue;
      ++accepted;
      const Fit on = fit(tp, pp, 2048, -1), on_8k = fit(tp, pp, 8192, -1);
      const Fit base = fit(tp, pp, 2048, kBaseGpuPrefillRingMiB);
      std::printf(
          "Flash TP %d x PP %d on 24 GiB, KV tokens of the smallest stage: %lld without the "
          "streamed path, %lld with a %lld MiB ring, %lld with the auto ring (%lld MiB) at "
          "2048-token steps, %lld at 8192 (%lld MiB; -1: does not fit)\n",
          tp, pp, static_cast<long long>(off), static_cast<long long>(base.kv_tokens),
          static_cast<long long>(kBaseGpuPrefillRingMiB), static_cast<long long>(on.kv_tokens),
          static_cast<long long>(on.ring_mib), static_cast<long long>(on_8k.kv_tokens),
          static_cast<long long>(on_8k.ring_mib));
      EXPECT_GE(on.kv_tokens, 1 << 20) << "TP " << tp << " x PP " << pp;
      EXPECT_LT(on.kv_tokens, base.kv_tokens);
      EXPECT_LT(base.kv_tokens, off);
      // The pool is far past 1M tokens at every layout that fits, so auto takes its largest.
      EXPECT_EQ(on.ring_mib, 3072) << "TP " << tp << " x PP " << pp;
      EXPECT_GE(on_8k.kv_tokens, 1 << 20) << "TP " << tp << " x PP " << pp;
    }
  }
  EXPECT_EQ(accepted, 9);
}

TEST(MemoryPlanTest, FewerSequencesLeaveMoreForThePool) {
  const ModelConfig m = Flash();
  const StageLayout whole{0, 43, 1, true, true, false};
  MemoryPlanOptions o;
  o.sequences = 1;
  absl::StatusOr<MemoryPlan> one_seq = PlanStageMemory(m, whole, k3090, o);
  absl::StatusOr<MemoryPlan> dflt = PlanStageMemory(m, whole, k3090);
  ASSERT_TRUE(one_seq.ok() && dflt.ok());
  EXPECT_EQ(one_seq->kv_pool_bytes - dflt->kv_pool_bytes, 63 * 12'206'080);
  EXPECT_GT(one_seq->kv_blocks, dflt->kv_blocks);
}

TEST(MemoryPlanTest, RefusesLayoutsThatDoNotFit) {
  const ModelConfig m = Flash();
  absl::StatusOr<MemoryPlan> small = PlanStageMemory(m, {0, 43, 1, true, true, true}, 6 * kGiB);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(small.status().message().find("does not fit"), std::string::npos)
      << small.status().message();
  // Fits the weights but leaves too little KV for the minimum.
  MemoryPlanOptions o;
  o.min_kv_tokens = 1'000'000'000;
  absl::StatusOr<MemoryPlan> tight = PlanStageMemory(m, {0, 43, 1, true, true, true}, k3090, o);
  ASSERT_FALSE(tight.ok());
  EXPECT_NE(tight.status().message().find("fewer than the minimum"), std::string::npos);
  // The weights fit, but not the compressor states of 1,300 sequences (14.8 GiB) beside them.
  MemoryPlanOptions many;
  many.sequences = 1300;
  absl::StatusOr<MemoryPlan> states = PlanStageMemory(m, {0, 43, 1, true, true, true}, k3090, many);
  ASSERT_FALSE(states.ok());
  EXPECT_EQ(states.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(states.status().message().find("does not fit the compressor state of 1300 sequences"),
            std::string::npos)
      << states.status().message();
  // Stage 0 of TP 2 x PP 2 holds less of both: its states (6.7 GiB for 1,300 sequences) fit.
  EXPECT_TRUE(PlanStageMemory(m, {0, 21, 2, true, false, false}, k3090, many).ok());
  MemoryPlanOptions none;
  none.sequences = 0;
  EXPECT_EQ(PlanStageMemory(m, {0, 43, 1, true, true, true}, k3090, none).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanStageMemory(m, {0, 43, 3, true, true, true}, k3090).status().code(),
            absl::StatusCode::kInvalidArgument);  // 3 does not divide 64 heads
  EXPECT_EQ(PlanStageMemory(m, {40, 50, 1, false, true, false}, k3090).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The workspace a step needs beside the pool (what Create keeps free): at Flash, TP 1, one stage
// of every layer, a 2048-token chunk at 1M positions is dominated by the indexer's scores
// (2048 x 262144 floats = 2 GiB); it shrinks with the context and the tokens, and with TP (the
// per-rank head buffers).
TEST(StepWorkspaceTest, GrowsWithTokensAndContext) {
  const ModelConfig c = Flash();
  const int n = static_cast<int>(c.n_layers);
  const int64_t mib = int64_t{1} << 20;
  const int64_t full = StepWorkspaceBytes(c, 1, 0, n, 2048, 1 << 20);
  const int64_t scores = int64_t{2048} * (1 << 18) * 4;
  std::printf(
      "Flash TP 1, 2048 tokens at 1M: %.0f MiB; at 8K: %.0f MiB; 1 token at 1M: %.0f MiB; "
      "TP 2: %.0f MiB\n",
      full / double(mib), StepWorkspaceBytes(c, 1, 0, n, 2048, 8192) / double(mib),
      StepWorkspaceBytes(c, 1, 0, n, 1, 1 << 20) / double(mib),
      StepWorkspaceBytes(c, 2, 0, n, 2048, 1 << 20) / double(mib));
  EXPECT_GT(full, scores);
  EXPECT_LT(full, scores + 2048 * mib);
  EXPECT_LT(StepWorkspaceBytes(c, 1, 0, n, 2048, 8192), full - scores);
  EXPECT_LT(StepWorkspaceBytes(c, 1, 0, n, 1, 1 << 20), 256 * mib);
  EXPECT_LT(StepWorkspaceBytes(c, 2, 0, n, 2048, 1 << 20), full);
  // A stage of SWA layers only (layer 0): no indexer scores at all.
  EXPECT_LT(StepWorkspaceBytes(c, 1, 0, 1, 2048, 1 << 20), full - scores);
  // An 8192-token chunk at 1M scores its rows in slices of 2048 (kIndexerScoresBytes): the same
  // 2 GiB of scores as a 2048-token chunk, not 8 GiB; the rest grows with its tokens.
  const int64_t big = StepWorkspaceBytes(c, 1, 0, n, 8192, 1 << 20);
  std::printf("Flash TP 1, 8192 tokens at 1M: %.0f MiB\n", big / double(mib));
  EXPECT_GT(big, full);
  EXPECT_LT(big, 4 * scores);                    // uncapped, the scores alone would be 8 GiB
  EXPECT_LE(big - scores, 4 * (full - scores));  // the rest grows with the tokens at most
}

}  // namespace
}  // namespace ss::gpu
