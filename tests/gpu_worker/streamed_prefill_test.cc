// The streamed-prefill policy: the threshold from the measured rates, the overrides, the rate
// updates, and the streamed path's device-memory figures.
#include "gpu_worker/streamed_prefill.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace ss::gpu {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
using Mode = GpuPrefillThreshold::Mode;
using Rates = StreamedPrefillPolicy::Rates;

GpuPrefillThreshold Auto() { return {}; }

TEST(StreamedPrefillTest, ThresholdFromTheRates) {
  // The H200 machine: PCIe 5.0 at 55 GB/s pinned, 2.1 GB of a layer's experts, the prior CPU
  // rate of 1/1500 s per token-layer: the copy takes 38.2 ms, the CPU 0.667 ms per token, so
  // streaming wins from 2.1/55·1500 = 57.3 -> 58 rows.
  StreamedPrefillPolicy h200(Auto(), 2'100'000'000, {.h2d_bytes_per_second = 55e9});
  EXPECT_EQ(h200.Threshold(), 58);
  EXPECT_FALSE(h200.UseStreamed(57));
  EXPECT_TRUE(h200.UseStreamed(58));
  EXPECT_TRUE(h200.UseStreamed(32768));
  EXPECT_FALSE(h200.cpu_rate_measured());
  EXPECT_DOUBLE_EQ(h200.rates().cpu_seconds_per_token_layer, kPriorCpuSecondsPerTokenLayer);
  // One RTX 3090 on PCIe 4.0 (24 GB/s pinned) copying a whole Flash layer (3.43 GB):
  // 3.43/24·1500 = 214.4 -> 215 rows. Under TP 4 each rank copies a quarter: 53.6 -> 54.
  StreamedPrefillPolicy one_3090(Auto(), 3'430'000'000, {.h2d_bytes_per_second = 24e9});
  EXPECT_EQ(one_3090.Threshold(), 215);
  StreamedPrefillPolicy tp4_3090(Auto(), 3'430'000'000 / 4, {.h2d_bytes_per_second = 24e9});
  EXPECT_EQ(tp4_3090.Threshold(), 54);
  // A slower CPU (AVX2, 1/750 s) halves it: 107.2 -> 108.
  StreamedPrefillPolicy avx2(
      Auto(), 3'430'000'000,
      {.h2d_bytes_per_second = 24e9, .cpu_seconds_per_token_layer = 1.0 / 750});
  EXPECT_EQ(avx2.Threshold(), 108);
  EXPECT_TRUE(avx2.cpu_rate_measured());
  // No bandwidth measured, or nothing to stream: never.
  EXPECT_EQ(StreamedPrefillPolicy(Auto(), 2'100'000'000, {}).Threshold(), kNever);
  EXPECT_EQ(StreamedPrefillPolicy(Auto(), 0, {.h2d_bytes_per_second = 55e9}).Threshold(), kNever);
  EXPECT_FALSE(
      StreamedPrefillPolicy(Auto(), 0, {.h2d_bytes_per_second = 55e9}).UseStreamed(1 << 20));
}

// Resident experts serving part of a step's choices (host_share < 1) scale the CPU side of the
// rule: the H200 case above with half of the choices on the GPU streams from 2·57.3 -> 115
// rows, with every expert resident (share 0) never; an override ignores the share.
TEST(StreamedPrefillTest, ResidentExpertsRaiseTheAutoThreshold) {
  StreamedPrefillPolicy h200(Auto(), 2'100'000'000, {.h2d_bytes_per_second = 55e9});
  EXPECT_TRUE(h200.UseStreamed(58, 1.0));
  EXPECT_FALSE(h200.UseStreamed(114, 0.5));
  EXPECT_TRUE(h200.UseStreamed(115, 0.5));
  EXPECT_FALSE(h200.UseStreamed(int64_t{1} << 40, 0.0));
  EXPECT_FALSE(h200.UseStreamed(int64_t{1} << 40, -1.0));  // clamped to 0
  EXPECT_TRUE(h200.UseStreamed(58, 7.0));                  // clamped to 1
  EXPECT_EQ(h200.Threshold(), 58);  // the threshold reported is the whole-host one
  StreamedPrefillPolicy forced({.mode = Mode::kRows, .rows = 1}, 2'100'000'000,
                               {.h2d_bytes_per_second = 55e9});
  EXPECT_TRUE(forced.UseStreamed(1, 0.0));
  StreamedPrefillPolicy off({.mode = Mode::kOff}, 2'100'000'000, {.h2d_bytes_per_second = 55e9});
  EXPECT_FALSE(off.UseStreamed(1 << 20, 1.0));
}

TEST(StreamedPrefillTest, OffAndRowOverrides) {
  const Rates rates{.h2d_bytes_per_second = 55e9};
  StreamedPrefillPolicy off({.mode = Mode::kOff}, 2'100'000'000, rates);
  EXPECT_EQ(off.Threshold(), kNever);
  EXPECT_FALSE(off.UseStreamed(int64_t{1} << 40));
  // N: every step of at least N rows, whatever the rates say.
  StreamedPrefillPolicy forced({.mode = Mode::kRows, .rows = 1}, 2'100'000'000, rates);
  EXPECT_EQ(forced.Threshold(), 1);
  EXPECT_TRUE(forced.UseStreamed(1));
  EXPECT_FALSE(forced.UseStreamed(0));
  StreamedPrefillPolicy n512({.mode = Mode::kRows, .rows = 512}, 2'100'000'000, {});
  EXPECT_EQ(n512.Threshold(), 512);
  EXPECT_FALSE(n512.UseStreamed(511));
  EXPECT_TRUE(n512.UseStreamed(512));
  n512.ObserveCpu(1024, 100.0);  // the rates do not move an override
  EXPECT_EQ(n512.Threshold(), 512);
}

TEST(StreamedPrefillTest, ParsesTheFlag) {
  absl::StatusOr<GpuPrefillThreshold> t = ParseGpuPrefillThreshold("auto");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->mode, Mode::kAuto);
  EXPECT_EQ(t->ToString(), "auto");
  t = ParseGpuPrefillThreshold("OFF");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->mode, Mode::kOff);
  EXPECT_EQ(t->ToString(), "off");
  t = ParseGpuPrefillThreshold("512");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->mode, Mode::kRows);
  EXPECT_EQ(t->rows, 512);
  EXPECT_EQ(t->ToString(), "512");
  EXPECT_EQ(ParseGpuPrefillThreshold("1")->rows, 1);
  for (const char* bad : {"0", "-3", "abc", "", "12x", "1.5", "on"}) {
    absl::StatusOr<GpuPrefillThreshold> e = ParseGpuPrefillThreshold(bad);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string m(e.status().message());
    EXPECT_NE(m.find(std::string("'") + bad + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("auto, off"), std::string::npos) << m;
  }
}

TEST(StreamedPrefillTest, CpuRateIsAnAverageOfPrefillSizedCalls) {
  StreamedPrefillPolicy p(Auto(), 2'100'000'000, {.h2d_bytes_per_second = 55e9});
  // Decode-sized calls (memory-bound) do not count.
  p.ObserveCpu(kMinRowsForCpuRate - 1, 1.0);
  p.ObserveCpu(1024, 0.0);
  EXPECT_FALSE(p.cpu_rate_measured());
  EXPECT_EQ(p.Threshold(), 58);
  // The first measurement replaces the prior: 256 rows in 0.256 s = 1 ms per token-layer, so
  // 38.2 ms of copy / 1 ms -> 39 rows.
  p.ObserveCpu(256, 0.256);
  EXPECT_TRUE(p.cpu_rate_measured());
  EXPECT_DOUBLE_EQ(p.rates().cpu_seconds_per_token_layer, 1e-3);
  EXPECT_EQ(p.Threshold(), 39);
  // Then an exponential average: 0.25·2 ms + 0.75·1 ms = 1.25 ms -> 30.5 -> 31 rows.
  p.ObserveCpu(kMinRowsForCpuRate, kMinRowsForCpuRate * 2e-3);
  EXPECT_DOUBLE_EQ(p.rates().cpu_seconds_per_token_layer, 1.25e-3);
  EXPECT_EQ(p.Threshold(), 31);
}

TEST(StreamedPrefillTest, GpuRateSlowerThanTheCpuStopsStreaming) {
  StreamedPrefillPolicy p(Auto(), 2'100'000'000, {.h2d_bytes_per_second = 55e9});
  // 8192 rows through 43 layers in 3.5 s: 9.9 us per token-layer, far below the CPU's 667 us:
  // the threshold stays where the copies put it.
  p.ObserveStreamed(8192, 43, 3.5);
  EXPECT_DOUBLE_EQ(p.rates().gpu_seconds_per_token_layer, 3.5 / (8192.0 * 43));
  EXPECT_EQ(p.Threshold(), 58);
  EXPECT_NE(p.Describe().find("(measured)"), std::string::npos) << p.Describe();
  // A GPU that computes slower than the CPU (1 ms per token-layer after averaging) never wins.
  StreamedPrefillPolicy slow(Auto(), 2'100'000'000, {.h2d_bytes_per_second = 55e9});
  slow.ObserveStreamed(100, 10, 1.0);
  EXPECT_DOUBLE_EQ(slow.rates().gpu_seconds_per_token_layer, 1e-3);
  EXPECT_EQ(slow.Threshold(), kNever);
  EXPECT_FALSE(slow.UseStreamed(1 << 20));
  EXPECT_NE(slow.Describe().find("never streams"), std::string::npos) << slow.Describe();
  // Degenerate observations are ignored.
  slow.ObserveStreamed(0, 10, 1.0);
  slow.ObserveStreamed(100, 0, 1.0);
  EXPECT_DOUBLE_EQ(slow.rates().gpu_seconds_per_token_layer, 1e-3);
}

TEST(StreamedPrefillTest, DescribeSaysTheModeThresholdAndWhereTheRatesCameFrom) {
  StreamedPrefillPolicy p(Auto(), 2'100'000'000, {.h2d_bytes_per_second = 55e9});
  EXPECT_EQ(p.Describe(),
            "gpu prefill threshold auto: streams steps of >= 58 rows; layer 2.100 GB at H2D 55.0 "
            "GB/s (measured), CPU 0.667 ms per token-layer (prior), GPU compute assumed hidden by "
            "the copies");
  p.ObserveCpu(256, 0.256);
  EXPECT_NE(p.Describe().find("CPU 1.000 ms per token-layer (measured)"), std::string::npos)
      << p.Describe();
  EXPECT_NE(p.Describe().find(">= 39 rows"), std::string::npos) << p.Describe();
  StreamedPrefillPolicy off({.mode = Mode::kOff}, 2'100'000'000, {});
  EXPECT_NE(off.Describe().find("threshold off"), std::string::npos) << off.Describe();
  StreamedPrefillPolicy n({.mode = Mode::kRows, .rows = 1}, 2'100'000'000, {});
  EXPECT_NE(n.Describe().find("threshold 1 (--gpu-prefill-threshold): streams steps of >= 1 rows"),
            std::string::npos)
      << n.Describe();
  StreamedPrefillPolicy none(Auto(), 2'100'000'000, {});
  EXPECT_NE(none.Describe().find("never streams (no H2D bandwidth)"), std::string::npos)
      << none.Describe();
}

TEST(StreamedPrefillTest, WorkspaceBytes) {
  ModelConfig tiny;
  tiny.dim = 128;
  tiny.n_routed_experts = 5;
  tiny.n_activated_experts = 2;
  // T = 3, K = 2: 6 routes. scratch 64·6 + 8·6 = 432 -> 512; routes 3 x 24 -> 3 x 256; offsets
  // 2 x 24 -> 2 x 256; xq 3·128·2 = 768; h 6·256·2 = 3072; y 6·128·4 = 3072.
  EXPECT_EQ(StreamedMoeWorkspaceBytes(tiny, 3, 256), 512 + 768 + 512 + 768 + 3072 + 3072);
  // Flash at T = 2048, TP 1 (inter 2048): 12288 routes; scratch 114752 -> 114944, routes
  // 3 x 49152, offsets 2 x 1280, xq 16 MiB, h 48 MiB, y 192 MiB.
  ModelConfig flash;
  flash.dim = 4096;
  flash.n_routed_experts = 256;
  flash.n_activated_experts = 6;
  EXPECT_EQ(StreamedMoeWorkspaceBytes(flash, 2048, 2048),
            114944 + 3 * 49152 + 2 * 1280 + 16777216 + 50331648 + 201326592);
  // Linear in T beyond the fixed parts; h divides under TP.
  EXPECT_GT(StreamedMoeWorkspaceBytes(flash, 8192, 2048),
            4 * StreamedMoeWorkspaceBytes(flash, 2048, 2048) - 4 * 114944);
  EXPECT_EQ(
      StreamedMoeWorkspaceBytes(flash, 2048, 2048) - StreamedMoeWorkspaceBytes(flash, 2048, 512),
      50331648 - 12582912);
}

TEST(StreamedPrefillTest, PlanRing) {
  // A Flash expert: w1, w3 [2048, 2048] and w2 [4096, 1024] e2m1 bytes plus their ue8m0 scales.
  const int64_t flash_expert = 3 * 4194304 + 3 * 262144;
  const auto plan = [](int64_t ring, int64_t expert) {
    const RingPlan p = PlanRing(ring, expert, 256);
    return std::make_pair(p.experts_per_slot, p.slots);
  };
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(plan(kBaseGpuPrefillRingMiB << 20, flash_expert), std::make_pair(int64_t{20}, 4));
  // A larger ring: more slots of the same ~256 MiB, so copies run further ahead in small groups.
  EXPECT_EQ(plan(4 * gib, flash_expert), std::make_pair(int64_t{20}, 16));
  EXPECT_EQ(plan(gib + 3 * flash_expert, flash_expert), std::make_pair(int64_t{20}, 4));
  EXPECT_EQ(plan(gib, flash_expert / 4), std::make_pair(int64_t{80}, 4));  // a TP-4 slice
  EXPECT_EQ(plan(gib / 2, flash_expert), std::make_pair(int64_t{10}, 4));  // at least 4 slots
  EXPECT_EQ(plan(4 * flash_expert, flash_expert), std::make_pair(int64_t{1}, 4));
  EXPECT_EQ(plan(4 * flash_expert - 1, flash_expert), std::make_pair(int64_t{0}, 0));  // off
  EXPECT_EQ(plan(gib, 400 << 20), std::make_pair(int64_t{0}, 0));      // off: 4 do not fit
  EXPECT_EQ(plan(2 * gib, 400 << 20), std::make_pair(int64_t{1}, 5));  // experts over a slot
  EXPECT_EQ(plan(0, flash_expert), std::make_pair(int64_t{0}, 0));
  EXPECT_EQ(plan(gib, 0), std::make_pair(int64_t{0}, 0));
  // A slot holds at most a layer, and the ring at most two layers' groups.
  EXPECT_EQ(PlanRing(gib, flash_expert, 16).experts_per_slot, 16);
  EXPECT_EQ(PlanRing(gib, flash_expert, 16).slots, 4);
  EXPECT_EQ(PlanRing(16 * gib, flash_expert, 256).slots, 26);  // 13 groups of 20 a layer
  EXPECT_EQ(PlanRing(gib, flash_expert, 0).slots, 0);
  // Smaller slots (--gpu_prefill_slot_kib): a tiny model's 16 experts of 64 KiB in slots of 2.
  EXPECT_EQ(PlanRing(gib, 64 << 10, 16, 128 << 10).experts_per_slot, 2);
  EXPECT_EQ(PlanRing(gib, 64 << 10, 16, 128 << 10).slots, 16);
  EXPECT_EQ(PlanRing(gib, flash_expert, 256, 1).experts_per_slot, 1);  // at least one expert
}

}  // namespace
}  // namespace ss::gpu
