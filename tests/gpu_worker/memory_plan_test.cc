// The GPU worker's memory plan at DeepSeek-V4-Flash sizes on 24 GB cards.
#include "gpu_worker/memory_plan.h"

#include "common/checkpoint_schema.h"
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
  EXPECT_GT(one->kv_tokens, 1'000'000);  // ~3.85 KB per token of compressed KV
  EXPECT_EQ(one->kv_pool_bytes, k3090 - one->weight_bytes - one->reserve_bytes);
  EXPECT_NE(one->Describe().find("blocks of 128 tokens"), std::string::npos) << one->Describe();
  // TP 2 x PP 2: every rank holds less, so more KV.
  absl::StatusOr<MemoryPlan> tp2pp2 = PlanStageMemory(m, {0, 21, 2, true, false, false}, k3090);
  ASSERT_TRUE(tp2pp2.ok()) << tp2pp2.status();
  EXPECT_LT(tp2pp2->weight_bytes, one->weight_bytes / 2);
  EXPECT_GT(tp2pp2->kv_pool_bytes, one->kv_pool_bytes);
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
  EXPECT_EQ(PlanStageMemory(m, {0, 43, 3, true, true, true}, k3090).status().code(),
            absl::StatusCode::kInvalidArgument);  // 3 does not divide 64 heads
  EXPECT_EQ(PlanStageMemory(m, {40, 50, 1, false, true, false}, k3090).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ss::gpu
