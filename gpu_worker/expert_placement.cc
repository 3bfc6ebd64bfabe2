#include "gpu_worker/expert_placement.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ss::gpu {
namespace {

constexpr const char* kProfileFormat = "splitserve-expert-heat";
constexpr int kProfileVersion = 1;

struct Pair {
  uint64_t count = 0;
  int layer = 0;  // model layer id
  int32_t expert = 0;
};

// Hottest first; ties: lower layer, then lower id.
bool Hotter(const Pair& a, const Pair& b) {
  return std::make_tuple(b.count, a.layer, a.expert) < std::make_tuple(a.count, b.layer, b.expert);
}

std::vector<Pair> AllPairs(const LayerCounts& c) {
  std::vector<Pair> v;
  v.reserve(c.at.size());
  for (int l = 0; l < c.n_layers; ++l) {
    for (int e = 0; e < c.n_experts; ++e) {
      v.push_back({c.at[static_cast<size_t>(l) * c.n_experts + e], c.first_layer + l, e});
    }
  }
  return v;
}

}  // namespace

uint64_t LayerCounts::count(int layer, int expert) const {
  const int l = layer - first_layer;
  if (l < 0 || l >= n_layers || expert < 0 || expert >= n_experts) return 0;
  return at[static_cast<size_t>(l) * n_experts + expert];
}

int64_t ResidentSet::size() const {
  int64_t n = 0;
  for (const std::vector<int32_t>& l : layers) n += static_cast<int64_t>(l.size());
  return n;
}

bool ResidentSet::contains(int layer, int32_t expert) const {
  const int l = layer - first_layer;
  if (l < 0 || l >= static_cast<int>(layers.size())) return false;
  return std::binary_search(layers[l].begin(), layers[l].end(), expert);
}

ResidentSet PlaceByCounts(const LayerCounts& counts, int64_t budget) {
  ResidentSet set;
  set.first_layer = counts.first_layer;
  set.layers.resize(counts.n_layers);
  std::vector<Pair> pairs = AllPairs(counts);
  const size_t n = static_cast<size_t>(std::clamp<int64_t>(budget, 0, pairs.size()));
  std::partial_sort(pairs.begin(), pairs.begin() + n, pairs.end(), Hotter);
  for (size_t i = 0; i < n; ++i) {
    set.layers[pairs[i].layer - counts.first_layer].push_back(pairs[i].expert);
  }
  for (std::vector<int32_t>& l : set.layers) std::sort(l.begin(), l.end());
  return set;
}

ResidentSet SpreadEvenly(int first_layer, int n_layers, int n_experts, int64_t budget) {
  ResidentSet set;
  set.first_layer = first_layer;
  set.layers.resize(std::max(0, n_layers));
  budget = std::clamp<int64_t>(budget, 0, int64_t{std::max(0, n_layers)} * n_experts);
  for (int l = 0; l < n_layers; ++l) {
    const int64_t share = budget / n_layers + (l < budget % n_layers ? 1 : 0);
    for (int64_t i = 0; i < share; ++i) {
      set.layers[l].push_back(static_cast<int32_t>(i * n_experts / share));
    }
  }
  return set;
}

double HitRate(const ResidentSet& set, const LayerCounts& counts) {
  uint64_t all = 0, hit = 0;
  for (const Pair& p : AllPairs(counts)) {
    all += p.count;
    if (set.contains(p.layer, p.expert)) hit += p.count;
  }
  return all == 0 ? 0.0 : static_cast<double>(hit) / static_cast<double>(all);
}

std::vector<ExpertSwap> PlanRebalance(const ResidentSet& current, const LayerCounts& counts,
                                      int64_t budget, double margin, int max_swaps) {
  std::vector<Pair> in, out;
  for (const Pair& p : AllPairs(counts)) {
    (current.contains(p.layer, p.expert) ? in : out).push_back(p);
  }
  std::sort(out.begin(), out.end(), Hotter);  // promote
  std::sort(in.begin(), in.end(),
            [](const Pair& a, const Pair& b) { return Hotter(b, a); });  // evict
  int64_t free = budget - current.size();
  std::vector<ExpertSwap> swaps;
  size_t next_evict = 0;
  for (const Pair& p : out) {
    if (static_cast<int>(swaps.size()) >= max_swaps) break;
    if (free > 0) {
      swaps.push_back({-1, -1, p.layer, p.expert});
      --free;
      continue;
    }
    if (next_evict >= in.size()) break;
    const Pair& e = in[next_evict];
    if (static_cast<double>(p.count) <= static_cast<double>(e.count) * (1.0 + margin)) break;
    swaps.push_back({e.layer, e.expert, p.layer, p.expert});
    ++next_evict;
  }
  return swaps;
}

std::vector<ExpertSwap> PlanLayerRebalance(const ResidentSet& current, const LayerCounts& counts,
                                           double margin, int max_swaps) {
  struct Gain {
    int64_t gain = 0;
    ExpertSwap swap;
  };
  std::vector<Gain> all;
  for (int l = 0; l < counts.n_layers; ++l) {
    const int layer = counts.first_layer + l;
    const int cl = layer - current.first_layer;
    if (cl < 0 || cl >= static_cast<int>(current.layers.size()) || current.layers[cl].empty()) {
      continue;
    }
    LayerCounts one{layer, 1, counts.n_experts, {}};
    one.at.assign(counts.at.begin() + static_cast<ptrdiff_t>(l) * counts.n_experts,
                  counts.at.begin() + static_cast<ptrdiff_t>(l + 1) * counts.n_experts);
    ResidentSet mine{layer, {current.layers[cl]}};
    for (const ExpertSwap& s :
         PlanRebalance(mine, one, mine.size(), margin, std::max(0, max_swaps))) {
      const uint64_t cp = counts.count(layer, s.promote), ce = counts.count(layer, s.evict);
      const int64_t gain = static_cast<int64_t>(cp) - static_cast<int64_t>(ce);
      // Counting noise: two counts of one rate differ by ~sqrt(cp + ce).
      if (static_cast<double>(gain) <= 2.0 * std::sqrt(static_cast<double>(cp + ce))) continue;
      all.push_back({gain, s});
    }
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Gain& a, const Gain& b) { return a.gain > b.gain; });
  std::vector<ExpertSwap> swaps;
  for (size_t i = 0; i < all.size() && static_cast<int>(swaps.size()) < max_swaps; ++i) {
    swaps.push_back(all[i].swap);
  }
  return swaps;
}

std::pair<int32_t, int32_t> HostWeightsRange(int n_experts, int tp, int rank) {
  return {static_cast<int32_t>(int64_t{rank} * n_experts / tp),
          static_cast<int32_t>(int64_t{rank + 1} * n_experts / tp)};
}

ResidentSet RankShare(const ResidentSet& set,
                      const std::function<std::pair<int32_t, int32_t>(int layer)>& range) {
  ResidentSet mine = set;
  for (size_t l = 0; l < mine.layers.size(); ++l) {
    const auto [begin, end] = range(set.first_layer + static_cast<int>(l));
    std::erase_if(mine.layers[l], [&](int32_t e) { return e < begin || e >= end; });
  }
  return mine;
}

void ApplySwaps(const std::vector<ExpertSwap>& swaps, ResidentSet* set) {
  for (const ExpertSwap& s : swaps) {
    if (s.evict >= 0) {
      const int l = s.evict_layer - set->first_layer;
      if (l >= 0 && l < static_cast<int>(set->layers.size())) std::erase(set->layers[l], s.evict);
    }
    const int l = s.promote_layer - set->first_layer;
    if (l < 0 || l >= static_cast<int>(set->layers.size())) continue;
    std::vector<int32_t>& ids = set->layers[l];
    const auto at = std::lower_bound(ids.begin(), ids.end(), s.promote);
    if (at == ids.end() || *at != s.promote) ids.insert(at, s.promote);
  }
}

std::string HeatProfileToJson(const LayerCounts& counts) {
  nlohmann::json layers = nlohmann::json::object();
  for (int l = 0; l < counts.n_layers; ++l) {
    const auto begin = counts.at.begin() + static_cast<ptrdiff_t>(l) * counts.n_experts;
    layers[std::to_string(counts.first_layer + l)] =
        std::vector<uint64_t>(begin, begin + counts.n_experts);
  }
  return nlohmann::json{{"format", kProfileFormat},
                        {"version", kProfileVersion},
                        {"n_experts", counts.n_experts},
                        {"layers", layers}}
      .dump();
}

absl::StatusOr<LayerCounts> HeatProfileFromJson(absl::string_view json, int first_layer,
                                                int n_layers, int n_experts) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  const auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("expert heat profile: ", why));
  };
  if (!j.is_object() || j.value("format", nlohmann::json()) != kProfileFormat) {
    return bad(absl::StrCat("not a profile (\"format\": \"", kProfileFormat, "\" expected)"));
  }
  if (j.value("version", nlohmann::json()) != kProfileVersion) {
    return bad(absl::StrCat("version ", j.value("version", nlohmann::json()).dump(),
                            ", this build reads ", kProfileVersion));
  }
  if (j.value("n_experts", nlohmann::json()) != n_experts) {
    return bad(absl::StrCat("n_experts ", j.value("n_experts", nlohmann::json()).dump(),
                            ", the model has ", n_experts));
  }
  const nlohmann::json& layers = j.value("layers", nlohmann::json());
  if (!layers.is_object()) return bad("no \"layers\" object");
  LayerCounts c{first_layer, n_layers, n_experts,
                std::vector<uint64_t>(static_cast<size_t>(n_layers) * n_experts, 0)};
  for (int l = 0; l < n_layers; ++l) {
    const auto it = layers.find(std::to_string(first_layer + l));
    if (it == layers.end()) continue;
    if (!it->is_array() || it->size() != static_cast<size_t>(n_experts)) {
      return bad(absl::StrCat("layer ", first_layer + l, ": ", n_experts, " counts expected"));
    }
    for (int e = 0; e < n_experts; ++e) {
      if (!(*it)[e].is_number_unsigned()) {
        return bad(absl::StrCat("layer ", first_layer + l, ", expert ", e, ": not a count"));
      }
      c.at[static_cast<size_t>(l) * n_experts + e] = (*it)[e].get<uint64_t>();
    }
  }
  return c;
}

}  // namespace ss::gpu
