// --gpu-prefill-ring-mib auto (gpu_worker/ring_budget.h): the rule at its boundaries, and the
// memory plan's use of it at DeepSeek-V4-Flash sizes on 24 GiB cards (the ring shrinks as the KV
// it must leave grows, and the pool always keeps those tokens when the ring grew).
#include "gpu_worker/ring_budget.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gpu_prefill_flags.h"
#include "gpu_worker/memory_plan.h"
#include "gtest/gtest.h"
#include "tests/tools/test_configs.h"

namespace ss::gpu {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// free 20 GiB - reserve 4 - states 1 - streamed workspace 0.25 - KV 2 leaves 12.75 GiB.
RingBudgetInputs Roomy() {
  RingBudgetInputs in;
  in.free_bytes = 20 * kGiB;
  in.reserve_bytes = 4 * kGiB;
  in.state_bytes = 1 * kGiB;
  in.streamed_workspace_bytes = 256 * kMiB;
  in.kv_tokens = 1 << 20;
  in.kv_bytes = 2 * kGiB;
  return in;
}

TEST(RingBudgetTest, TakesTheLargestRingThatLeavesTheKv) {
  RingBudget b = ComputeRingBudget(Roomy());
  EXPECT_EQ(b.left_bytes, 12 * kGiB + 768 * kMiB);
  EXPECT_EQ(b.ring_bytes, 3072 * kMiB);
  EXPECT_EQ(b.Describe(),
            "3072 MiB: free 20.00 GiB - reserve 4.00 GiB - compressor states 1.00 GiB - streamed "
            "workspace 256.0 MiB - KV for 1048576 tokens 2.00 GiB leave 12.75 GiB");
  // At each boundary: exactly 3 GiB left takes 3 GiB, a byte less 2 GiB, then 1 GiB.
  RingBudgetInputs in = Roomy();
  const int64_t others = in.reserve_bytes + in.state_bytes + in.streamed_workspace_bytes;
  for (const auto& [left, ring] : std::vector<std::pair<int64_t, int64_t>>{
           {3 * kGiB, 3072},
           {3 * kGiB - 1, 2048},
           {2 * kGiB, 2048},
           {2 * kGiB - 1, 1024},
           {1 * kGiB, 1024},
           {0, 1024},  // nothing fits: the base ring, and the KV fit reports the shortfall
           {-5 * kGiB, 1024}}) {
    in.free_bytes = others + in.kv_bytes + left;
    b = ComputeRingBudget(in);
    EXPECT_EQ(b.left_bytes, left);
    EXPECT_EQ(b.ring_bytes, ring * kMiB) << left;
  }
}

TEST(RingBudgetTest, KeepsTheBaseRingBesideResidentExpertsOrASharedDevice) {
  RingBudgetInputs in = Roomy();
  in.resident_experts = true;
  EXPECT_EQ(ComputeRingBudget(in).ring_bytes, kBaseGpuPrefillRingMiB * kMiB);
  EXPECT_EQ(ComputeRingBudget(in).Describe(), "1024 MiB: routed experts are resident");
  in = Roomy();
  in.fills_device = false;
  EXPECT_EQ(ComputeRingBudget(in).ring_bytes, kBaseGpuPrefillRingMiB * kMiB);
  EXPECT_NE(ComputeRingBudget(in).Describe().find("a given size (--kv_tokens)"), std::string::npos);
}

TEST(RingBudgetTest, FlagSpellings) {
  absl::StatusOr<GpuPrefillRing> r = ParseGpuPrefillRing(" Auto ", "--x");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->is_auto);
  EXPECT_EQ(r->ToString(), "auto");
  r = ParseGpuPrefillRing("0", "--x");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->is_auto);
  EXPECT_EQ(r->mib, 0);
  r = ParseGpuPrefillRing("1048576", "--x");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ToString(), "1048576");
  for (const char* bad : {"-1", "1048577", "3g", "", "auto2"}) {
    r = ParseGpuPrefillRing(bad, "--gpu-prefill-ring-mib");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(absl::StrCat("--gpu-prefill-ring-mib '", bad,
                                                     "': expected auto or a size in MiB")),
              std::string::npos)
        << r.status();
  }
}

// The plan of one GPU holding Flash's 43 layers, the card shrinking from 24 GiB: the ring steps
// down 3 -> 2 -> 1 GiB, and wherever it is above the base the pool holds the model's 1M tokens.
// A given KV size (--plan_resident_kv_tokens, the worker's --kv_tokens) keeps the base ring.
TEST(RingBudgetTest, ThePlanShrinksTheRingWithTheCard) {
  absl::StatusOr<ModelConfig> m = ParseModelConfig(testing_util::kFlashConfig);
  ASSERT_TRUE(m.ok()) << m.status();
  const StageLayout whole{0, 43, 1, true, true, false};
  int64_t last_ring = 3072 * kMiB;
  bool saw[3] = {false, false, false};
  for (int64_t device = 24 * kGiB; device >= 16 * kGiB; device -= kGiB / 4) {
    absl::StatusOr<MemoryPlan> p = PlanStageMemory(*m, whole, device);
    if (!p.ok()) break;  // too small for the pool's minimum beside the base ring
    ASSERT_TRUE(p->ring.has_value());
    EXPECT_LE(p->ring_bytes, last_ring) << device;
    last_ring = p->ring_bytes;
    saw[p->ring_bytes / kGiB - 1] = true;
    if (p->ring_bytes > kBaseGpuPrefillRingMiB * kMiB) {
      EXPECT_GE(p->kv_tokens, 1 << 20) << p->Describe();
    }
    // The resident experts' figure is the base ring's whatever auto gave the pool.
    EXPECT_EQ(p->resident_ring_bytes, kBaseGpuPrefillRingMiB * kMiB);
  }
  EXPECT_TRUE(saw[0] && saw[1] && saw[2]);
  MemoryPlanOptions given;
  given.resident_kv_tokens = 65536;
  absl::StatusOr<MemoryPlan> p = PlanStageMemory(*m, whole, 24 * kGiB, given);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->ring_bytes, kBaseGpuPrefillRingMiB * kMiB);
  EXPECT_NE(p->Describe().find("ring 1024.0 MiB (auto)"), std::string::npos) << p->Describe();
}

}  // namespace
}  // namespace ss::gpu
