// The resident set's rebalance while serving (gpu_worker/expert_rebalancer.h) against a mover that
// records what it is asked (the CUDA one is resident_routed_experts.h): swaps stay within their
// layer and within the experts the rank may hold (a TP rank's range), a staged batch blocks the
// next, the decayed counts follow a change of workload, and the set converges to the per-layer
// best under skewed routing.
#include "gpu_worker/expert_rebalancer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ss::gpu {
namespace {

// Holds a set; Stage applies the swaps at once unless `hold` (then the batch stays staged until
// Release).
class FakeMover : public ResidentExpertMover {
 public:
  FakeMover(ResidentSet set, std::pair<int32_t, int32_t> range, int max_swaps)
      : set_(std::move(set)), range_(range), max_swaps_(max_swaps) {}
  ResidentSet Current() const override { return set_; }
  std::pair<int32_t, int32_t> Range(int) const override { return range_; }
  int max_swaps() const override { return max_swaps_; }
  absl::StatusOr<bool> Stage(const std::vector<ExpertSwap>& swaps) override {
    if (!staged_.empty()) return false;
    for (const ExpertSwap& s : swaps) {
      EXPECT_EQ(s.evict_layer, s.promote_layer);
      EXPECT_TRUE(set_.contains(s.evict_layer, s.evict));
      EXPECT_FALSE(set_.contains(s.promote_layer, s.promote));
      EXPECT_GE(s.promote, range_.first);
      EXPECT_LT(s.promote, range_.second);
    }
    EXPECT_LE(static_cast<int>(swaps.size()), max_swaps_);
    staged_ = swaps;
    ++batches;
    if (!hold) Release();
    return true;
  }
  void Release() {
    ApplySwaps(staged_, &set_);
    staged_.clear();
  }
  bool hold = false;
  int batches = 0;

 private:
  ResidentSet set_;
  std::pair<int32_t, int32_t> range_;
  int max_swaps_;
  std::vector<ExpertSwap> staged_;
};

void CountTimes(ExpertHeat& heat, int layer, int32_t expert, int times) {
  for (int i = 0; i < times; ++i) heat.Count(layer, &expert, 1);
}

TEST(ExpertRebalancer, SwapsWithinLayersAndTheRanksRange) {
  auto heat = std::make_shared<ExpertHeat>(3, 5, 16);
  // Layer 3 resident {0, 1}, layer 4 {2}; the rank may hold experts [0, 8) only.
  FakeMover mover({3, {{0, 1}, {2}}}, {0, 8}, 8);
  ExpertRebalancer r(heat, &mover, {});
  CountTimes(*heat, 3, 5, 50);   // hot, in range
  CountTimes(*heat, 3, 12, 90);  // hotter, outside the rank's range
  CountTimes(*heat, 3, 0, 10);
  CountTimes(*heat, 4, 7, 30);
  CountTimes(*heat, 4, 2, 29);  // within the margin of 7's count: stays
  absl::StatusOr<std::vector<ExpertSwap>> swaps = r.RunOnce();
  ASSERT_TRUE(swaps.ok()) << swaps.status();
  ASSERT_EQ(swaps->size(), 1u);
  EXPECT_EQ((*swaps)[0].promote_layer, 3);
  EXPECT_EQ((*swaps)[0].promote, 5);
  EXPECT_EQ((*swaps)[0].evict, 1);  // count 0, the coldest
  const ResidentSet now = mover.Current();
  EXPECT_EQ(now.layers[0], (std::vector<int32_t>{0, 5}));
  EXPECT_EQ(now.layers[1], (std::vector<int32_t>{2}));
}

TEST(ExpertRebalancer, AStagedBatchBlocksTheNextAndCountsDecay) {
  auto heat = std::make_shared<ExpertHeat>(0, 1, 8);
  FakeMover mover({0, {{0}}}, {0, 8}, 2);
  RebalanceOptions o;
  o.decay = 0.5;
  CountTimes(*heat, 0, 3, 100);
  ExpertRebalancer r(heat, &mover, o);  // counts from before it count too
  mover.hold = true;
  ASSERT_EQ(r.RunOnce()->size(), 1u);  // 0 -> 3, staged
  CountTimes(*heat, 0, 4, 300);
  EXPECT_TRUE(r.RunOnce()->empty());  // 3 -> 4 planned, but the batch is still staged
  EXPECT_EQ(mover.batches, 1);
  mover.Release();
  mover.hold = false;
  EXPECT_EQ(mover.Current().layers[0], (std::vector<int32_t>{3}));
  // Decayed: expert 3 counted 100 in the first round, then nothing (50, 25); expert 4 counted 300
  // in the second round (300, 150): the workload moved on.
  ASSERT_EQ(r.RunOnce()->size(), 1u);
  EXPECT_EQ(mover.Current().layers[0], (std::vector<int32_t>{4}));
  const LayerCounts d = r.decayed();
  EXPECT_EQ(d.count(0, 3), 25u);
  EXPECT_EQ(d.count(0, 4), 150u);
}

// Zipf-skewed routing with a different hot order per layer, a quarter of each layer resident from
// an even spread: rounds of decode-sized batches bring the hit rate to the per-layer best.
TEST(ExpertRebalancer, ConvergesToTheLayersHottestUnderSkewedRouting) {
  constexpr int kLayers = 4, kExperts = 64, kTopK = 6, kShare = kExperts / 4;
  std::mt19937 rng(11);
  auto heat = std::make_shared<ExpertHeat>(0, kLayers, kExperts);
  std::vector<std::discrete_distribution<int>> pick;
  LayerCounts truth{0, kLayers, kExperts, {}};
  for (int l = 0; l < kLayers; ++l) {
    std::vector<int> order(kExperts);
    for (int e = 0; e < kExperts; ++e) order[e] = e;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<double> p(kExperts);
    for (int r = 0; r < kExperts; ++r) p[order[r]] = 1.0 / std::pow(r + 1, 1.0);
    for (double v : p) truth.at.push_back(static_cast<uint64_t>(v * 1e6));
    pick.emplace_back(p.begin(), p.end());
  }
  ResidentSet best{0, {}};
  for (int l = 0; l < kLayers; ++l) {
    LayerCounts one{l, 1, kExperts, {}};
    one.at.assign(truth.at.begin() + l * kExperts, truth.at.begin() + (l + 1) * kExperts);
    best.layers.push_back(PlaceByCounts(one, kShare).layers[0]);
  }
  FakeMover mover(SpreadEvenly(0, kLayers, kExperts, kLayers * kShare), {0, kExperts}, 8);
  const double start = HitRate(mover.Current(), truth);
  ExpertRebalancer r(heat, &mover, {});
  for (int round = 0; round < 30; ++round) {
    for (int token = 0; token < 400; ++token) {
      for (int l = 0; l < kLayers; ++l) {
        for (int k = 0; k < kTopK; ++k) {
          const int32_t e = pick[l](rng);
          heat->Count(l, &e, 1);
        }
      }
    }
    ASSERT_TRUE(r.RunOnce().ok());
    EXPECT_EQ(mover.Current().size(), kLayers * kShare);
  }
  const double end = HitRate(mover.Current(), truth), top = HitRate(best, truth);
  EXPECT_LT(start, 0.5 * top) << start << " " << top;
  EXPECT_GT(end, 0.95 * top) << end << " " << top;
}

// The thread runs rounds by itself and stops at destruction.
TEST(ExpertRebalancer, TheThreadRunsRoundsAndStops) {
  auto heat = std::make_shared<ExpertHeat>(0, 1, 8);
  FakeMover mover({0, {{0}}}, {0, 8}, 1);
  CountTimes(*heat, 0, 6, 10);
  {
    RebalanceOptions o;
    o.interval = absl::Milliseconds(5);
    ExpertRebalancer r(heat, &mover, o);
    r.Start();
    for (int i = 0; i < 400 && mover.batches == 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(mover.Current().layers[0], (std::vector<int32_t>{6}));
}

}  // namespace
}  // namespace ss::gpu
