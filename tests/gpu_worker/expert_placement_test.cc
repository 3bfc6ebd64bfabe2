// The resident-expert placement (gpu_worker/expert_placement.h): the best set for a budget, the
// hit rate, rebalancing toward it under a margin, and the saved profile.
#include "gpu_worker/expert_placement.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ss::gpu {
namespace {

LayerCounts Counts(int first_layer, int n_experts, std::vector<std::vector<uint64_t>> layers) {
  LayerCounts c{first_layer, static_cast<int>(layers.size()), n_experts, {}};
  for (const std::vector<uint64_t>& l : layers) c.at.insert(c.at.end(), l.begin(), l.end());
  return c;
}

TEST(ExpertPlacement, TheHottestPairsOverAllLayersWithDeterministicTies) {
  const LayerCounts c = Counts(3, 4, {{5, 0, 9, 1}, {7, 7, 2, 9}});  // layers 3 and 4
  ResidentSet s = PlaceByCounts(c, 3);
  ASSERT_EQ(s.layers.size(), 2u);
  EXPECT_EQ(s.layers[0], (std::vector<int32_t>{2}));     // 9 at layer 3
  EXPECT_EQ(s.layers[1], (std::vector<int32_t>{0, 3}));  // 9 at layer 4, then the first 7
  EXPECT_TRUE(s.contains(4, 3));
  EXPECT_FALSE(s.contains(4, 1));
  EXPECT_FALSE(s.contains(2, 2));  // not a stage layer
  EXPECT_EQ(s.size(), 3);
  EXPECT_DOUBLE_EQ(HitRate(s, c), (9.0 + 9 + 7) / 40);
  EXPECT_EQ(PlaceByCounts(c, 0).size(), 0);
  EXPECT_EQ(PlaceByCounts(c, 100).size(), 8);
  EXPECT_DOUBLE_EQ(HitRate(PlaceByCounts(c, 100), c), 1.0);
  EXPECT_DOUBLE_EQ(HitRate(s, Counts(3, 4, {{0, 0, 0, 0}, {0, 0, 0, 0}})), 0.0);
}

TEST(ExpertPlacement, WithoutCountsEachLayerAnEqualShareSpreadEvenly) {
  const ResidentSet s = SpreadEvenly(5, 3, 8, 7);  // 3 + 2 + 2
  ASSERT_EQ(s.layers.size(), 3u);
  EXPECT_EQ(s.layers[0], (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(s.layers[1], (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(s.layers[2], (std::vector<int32_t>{0, 4}));
  EXPECT_TRUE(s.contains(5, 5));
  EXPECT_EQ(SpreadEvenly(0, 2, 4, 100).size(), 8);  // at most every expert
  EXPECT_EQ(SpreadEvenly(0, 2, 4, 0).size(), 0);
}

TEST(ExpertPlacement, RebalanceFillsFreeSlotsThenSwapsOnlyPastTheMargin) {
  const LayerCounts c = Counts(0, 4, {{100, 10, 50, 0}, {0, 80, 5, 30}});
  ResidentSet s{0, {{1}, {}}};  // expert 1 of layer 0 (count 10)
  // A budget of 2: the free slot takes the hottest (100), then 80 replaces 10.
  std::vector<ExpertSwap> swaps = PlanRebalance(s, c, 2, 0.25, 8);
  ASSERT_EQ(swaps.size(), 2u);
  EXPECT_EQ(swaps[0].evict, -1);
  EXPECT_EQ(swaps[0].promote_layer, 0);
  EXPECT_EQ(swaps[0].promote, 0);
  EXPECT_EQ(swaps[1].evict_layer, 0);
  EXPECT_EQ(swaps[1].evict, 1);
  EXPECT_EQ(swaps[1].promote_layer, 1);
  EXPECT_EQ(swaps[1].promote, 1);
  ApplySwaps(swaps, &s);
  EXPECT_EQ(s.layers[0], (std::vector<int32_t>{0}));
  EXPECT_EQ(s.layers[1], (std::vector<int32_t>{1}));
  EXPECT_TRUE(PlanRebalance(s, c, 2, 0.25, 8).empty());  // the best set: nothing to do
  // 50 against 40 is within a 25 % margin: no swap; with a 10 % margin it swaps.
  const LayerCounts close = Counts(0, 2, {{40, 50}});
  const ResidentSet first{0, {{0}}};
  EXPECT_TRUE(PlanRebalance(first, close, 1, 0.25, 8).empty());
  EXPECT_EQ(PlanRebalance(first, close, 1, 0.10, 8).size(), 1u);
  // At most max_swaps.
  EXPECT_EQ(PlanRebalance(ResidentSet{0, {{}, {}}}, c, 8, 0.0, 3).size(), 3u);
}

// Routing skewed like a trained router (Zipf over each layer's experts, a different order per
// layer), sampled in rounds: rebalancing a few experts a round from an arbitrary start converges to
// the best set's hit rate for the true probabilities.
TEST(ExpertPlacement, RebalancingConvergesUnderSkewedRouting) {
  constexpr int kLayers = 6, kExperts = 64, kTopK = 6, kBudget = kLayers * kExperts / 4;
  std::mt19937 rng(7);
  std::vector<std::vector<double>> p(kLayers, std::vector<double>(kExperts));
  std::vector<std::discrete_distribution<int>> pick;
  for (int l = 0; l < kLayers; ++l) {
    std::vector<int> order(kExperts);
    for (int e = 0; e < kExperts; ++e) order[e] = e;
    std::shuffle(order.begin(), order.end(), rng);
    for (int r = 0; r < kExperts; ++r) p[l][order[r]] = 1.0 / std::pow(r + 1, 1.1);
    pick.emplace_back(p[l].begin(), p[l].end());
  }
  LayerCounts truth{0, kLayers, kExperts, {}};
  for (int l = 0; l < kLayers; ++l) {
    for (int e = 0; e < kExperts; ++e) truth.at.push_back(static_cast<uint64_t>(p[l][e] * 1e6));
  }
  const double best = HitRate(PlaceByCounts(truth, kBudget), truth);
  ResidentSet s =
      PlaceByCounts(LayerCounts{0, kLayers, kExperts, std::vector<uint64_t>(kLayers * kExperts, 0)},
                    kBudget);  // the lowest ids of the first layers: arbitrary
  const double start = HitRate(s, truth);
  LayerCounts seen{0, kLayers, kExperts, std::vector<uint64_t>(kLayers * kExperts, 0)};
  for (int round = 0; round < 40; ++round) {
    for (int token = 0; token < 200; ++token) {
      for (int l = 0; l < kLayers; ++l) {
        for (int k = 0; k < kTopK; ++k) ++seen.at[l * kExperts + pick[l](rng)];
      }
    }
    ApplySwaps(PlanRebalance(s, seen, kBudget, 0.2, 16), &s);
    EXPECT_EQ(s.size(), kBudget);
  }
  const double end = HitRate(s, truth);
  EXPECT_LT(start, 0.5 * best) << start << " " << best;
  EXPECT_GT(end, 0.97 * best) << end << " " << best;
}

TEST(ExpertPlacement, ProfileRoundTripAndRefusals) {
  const LayerCounts c = Counts(2, 3, {{1, 2, 3}, {40, 0, 7}});
  const std::string json = HeatProfileToJson(c);
  absl::StatusOr<LayerCounts> back = HeatProfileFromJson(json, 2, 2, 3);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->at, c.at);
  // Another stage: its layers in the profile are read, the others count 0.
  absl::StatusOr<LayerCounts> other = HeatProfileFromJson(json, 3, 2, 3);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->at, (std::vector<uint64_t>{40, 0, 7, 0, 0, 0}));
  for (const std::string& bad :
       {std::string("{}"), std::string("not json"),
        std::string(R"({"format": "splitserve-expert-heat", "version": 2, "n_experts": 3,
                        "layers": {}})"),
        std::string(R"({"format": "splitserve-expert-heat", "version": 1, "n_experts": 4,
                        "layers": {}})"),
        std::string(R"({"format": "splitserve-expert-heat", "version": 1, "n_experts": 3,
                        "layers": {"2": [1, 2]}})"),
        std::string(R"({"format": "splitserve-expert-heat", "version": 1, "n_experts": 3,
                        "layers": {"2": [1, -2, 3]}})")}) {
    absl::StatusOr<LayerCounts> r = HeatProfileFromJson(bad, 2, 2, 3);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// Under TP: with whole experts from host weights the ranks' ranges partition [0, E), so each
// resident expert lives on exactly one rank (the others send its choices to their host path,
// which computes only their own range: it adds zero); with the expert workers' stores every rank
// keeps its slices of every resident expert (range [0, E)).
TEST(ExpertPlacement, TpRanksShareTheResidentSetOnceEach) {
  for (int E : {16, 10, 256}) {
    for (int tp : {1, 2, 3, 4, 8}) {
      const ResidentSet set = SpreadEvenly(3, 4, E, 4 * E / 3);
      std::vector<std::vector<int>> held(4, std::vector<int>(E, 0));
      int32_t next = 0;
      for (int rank = 0; rank < tp; ++rank) {
        const auto range = HostWeightsRange(E, tp, rank);
        EXPECT_EQ(range.first, next) << E << " " << tp << " " << rank;  // contiguous, in order
        next = range.second;
        const ResidentSet mine = RankShare(set, [&](int) { return range; });
        ASSERT_EQ(mine.layers.size(), set.layers.size());
        for (size_t l = 0; l < mine.layers.size(); ++l) {
          EXPECT_TRUE(std::is_sorted(mine.layers[l].begin(), mine.layers[l].end()));
          for (int32_t e : mine.layers[l]) {
            EXPECT_GE(e, range.first);
            EXPECT_LT(e, range.second);
            ++held[l][e];
          }
        }
      }
      EXPECT_EQ(next, E);
      for (size_t l = 0; l < set.layers.size(); ++l) {
        for (int e = 0; e < E; ++e) {
          EXPECT_EQ(held[l][e], set.contains(3 + static_cast<int>(l), e) ? 1 : 0)
              << "E " << E << " tp " << tp << " layer " << l << " expert " << e;
        }
      }
      // Stores: every rank keeps the whole set (its slices of each expert).
      const ResidentSet all = RankShare(set, [&](int) {
        return std::pair<int32_t, int32_t>{0, E};
      });
      EXPECT_EQ(all.layers, set.layers);
    }
  }
  // A layer the rank cannot compute keeps nothing.
  const ResidentSet none = RankShare(SpreadEvenly(0, 2, 8, 4), [](int layer) {
    return layer == 1 ? std::pair<int32_t, int32_t>{0, 0} : std::pair<int32_t, int32_t>{0, 8};
  });
  EXPECT_EQ(none.layers[0].size(), 2u);
  EXPECT_TRUE(none.layers[1].empty());
}

}  // namespace
}  // namespace ss::gpu
