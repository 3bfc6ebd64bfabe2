// Which routed experts each layer of a stage keeps resident on its GPU, chosen from
// measured routing counts (expert_heat.h) under a budget of experts, and how a running placement
// moves toward a better one a few experts at a time.
//
// The objective. Every resident expert costs the same device bytes (its slices on this rank), and
// every layer sees the same tokens, so count[l][e] / tokens estimates the probability that a token
// chooses expert e at layer l. A decode step of B tokens reads an expert from host memory when a
// token chooses it and it is not resident; the expected experts read a step, Σ (1 − (1 − p)^B)
// over the non-resident pairs, falls most when the resident pairs are those of largest p, for any
// B (the term is increasing in p and the pairs are independent terms). So the best placement of
// `budget` experts is the `budget` (layer, expert) pairs of largest count over all layers
// together; ties go to the lower layer, then the lower expert id (deterministic).
//
// Rebalancing swaps one resident expert for a hotter one only when the hotter one's count exceeds
// the evicted one's by a relative `margin` (noise in the counts must not move weights back and
// forth); a free slot (fewer residents than the budget) takes the hottest non-resident pair.
//
// A profile is the counts saved as JSON, so that a restart begins with a placement:
//   {"format": "splitserve-expert-heat", "version": 1, "n_experts": E,
//    "layers": {"<model layer>": [count of expert 0, 1, ..., E−1], ...}}
// Layers of the profile outside the stage are ignored; stage layers missing from it count 0.
//
// Threads: values and pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ss::gpu {

// The routing counts of layers [first_layer, first_layer + n_layers), layer-major:
// at[(layer − first_layer)·n_experts + expert] (ExpertHeat::Snapshot's layout).
struct LayerCounts {
  int first_layer = 0, n_layers = 0, n_experts = 0;
  std::vector<uint64_t> at;
  uint64_t count(int layer, int expert) const;
};

struct ResidentSet {
  int first_layer = 0;
  std::vector<std::vector<int32_t>> layers;  // per stage layer, the resident expert ids ascending
  int64_t size() const;
  bool contains(int layer, int32_t expert) const;
};

// The `budget` pairs of largest count (at most all of them; counts of 0 included when the budget
// exceeds the pairs ever chosen, lowest layer and id first).
ResidentSet PlaceByCounts(const LayerCounts& counts, int64_t budget);

// Without counts: `budget` experts shared equally by the layers (the first budget % n_layers
// layers one more), each layer's ids spread evenly over [0, n_experts) (i·E/share).
ResidentSet SpreadEvenly(int first_layer, int n_layers, int n_experts, int64_t budget);

// Σ of the resident pairs' counts / Σ of all counts: the share of choices the set serves on the
// GPU (0 without counts).
double HitRate(const ResidentSet& set, const LayerCounts& counts);

// One move: `evict` leaves layer evict_layer (evict −1: a free slot is used instead) and
// `promote` joins layer promote_layer (model layer ids; the two may differ).
struct ExpertSwap {
  int evict_layer = -1;
  int32_t evict = -1;
  int promote_layer = 0;
  int32_t promote = -1;
};

// At most `max_swaps` swaps from `current` toward PlaceByCounts(counts, budget), hottest
// promotion first: free slots first, then a promotion of count c_p for the coldest resident
// pair of count c_e while c_p > c_e·(1 + margin). A resident set larger than the budget is
// shrunk by nothing here (the caller evicts). Deterministic.
std::vector<ExpertSwap> PlanRebalance(const ResidentSet& current, const LayerCounts& counts,
                                      int64_t budget, double margin, int max_swaps);
// Swaps that keep each layer's number of residents (a running placement's device buffers are per
// layer): PlanRebalance's rule within each layer that has residents, less the swaps whose gain
// (promoted count c_p − evicted count c_e) is within the counts' noise, 2·sqrt(c_p + c_e) (two
// Poisson counts of one rate), at most `max_swaps` over all layers, the largest gains first, ties
// by layer then id.
std::vector<ExpertSwap> PlanLayerRebalance(const ResidentSet& current, const LayerCounts& counts,
                                           double margin, int max_swaps);
// Under TP: the experts rank `rank` of `tp` computes from whole experts in the model's host
// weights, [rank·E/tp, (rank+1)·E/tp) (with the expert workers' stores every rank computes its
// slices of every expert instead: [0, E)).
std::pair<int32_t, int32_t> HostWeightsRange(int n_experts, int tp, int rank);
// A rank's part of a resident set, which is all it keeps: per layer the ids within
// range(model layer) = [first, second).
ResidentSet RankShare(const ResidentSet& set,
                      const std::function<std::pair<int32_t, int32_t>(int layer)>& range);

// `set` after `swaps` (each layer's ids kept ascending).
void ApplySwaps(const std::vector<ExpertSwap>& swaps, ResidentSet* set);

std::string HeatProfileToJson(const LayerCounts& counts);
// The profile's counts for the stage's layers; InvalidArgument (naming what) for a profile that is
// not one, of another version, or of another expert count.
absl::StatusOr<LayerCounts> HeatProfileFromJson(absl::string_view json, int first_layer,
                                                int n_layers, int n_experts);

}  // namespace ss::gpu
