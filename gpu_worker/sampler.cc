#include "gpu_worker/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "gpu_worker/sampler_math.h"

namespace ss::gpu {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Most likely first, the lower id on ties.
struct ByLogit {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  }
};

// The `n` most likely ids in ByLogit order.
std::vector<int32_t> TopIds(const float* logits, int64_t vocab, int64_t n) {
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  n = std::min(n, vocab);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), ByLogit{logits});
  ids.resize(n);
  return ids;
}

// A float's order as an integer: a < b (neither NaN) iff OrderKey(a) < OrderKey(b), and -0 has
// +0's key (they compare equal as floats).
int32_t OrderKey(float f) {
  uint32_t b = std::bit_cast<uint32_t>(f);
  b = b == 0x80000000u ? 0u : b;
  const int32_t k = static_cast<int32_t>(b);
  return k ^ ((k >> 31) & 0x7fffffff);
}

// The first id whose logit is NaN or +inf, or -1. One branch-free pass the compiler vectorises
// (an AVX2 clone where the CPU has it), then a search only when one is there.
__attribute__((target_clones("avx2", "default"))) int64_t FirstNonFinite(const float* logits,
                                                                         int64_t vocab) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(logits[i]) & 0x7fffffffu;
    bad |= static_cast<uint32_t>(b > 0x7f800000u) |
           static_cast<uint32_t>(std::bit_cast<uint32_t>(logits[i]) == 0x7f800000u);
  }
  if (bad == 0) return -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i]) || logits[i] == INFINITY) return i;
  }
  return -1;
}

// The lowest id of the largest logit (no NaN among them): the largest key in one vectorised
// pass (an AVX2 clone where the CPU has it), then its first id.
__attribute__((target_clones("avx2", "default"))) int32_t Argmax(const float* logits,
                                                                 int64_t vocab) {
  int32_t best = OrderKey(logits[0]);
  for (int64_t i = 1; i < vocab; ++i) best = std::max(best, OrderKey(logits[i]));
  int64_t i = 0;
  while (OrderKey(logits[i]) != best) ++i;
  return static_cast<int32_t>(i);
}

// The draw's candidates, their weights (relative to the likeliest id's 1; min_p zeroes those
// below it) and `total`, what the draw is scaled to.
struct Candidates {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double total = 0.0;
};

// Keeps the smallest prefix of `c` whose weight, summed in order, reaches `target` (all of it
// when the sum never does), and sets its total to that sum.
void CutPrefix(double target, Candidates& c) {
  double cum = 0.0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    cum += c.weights[i];
    if (cum >= target) {
      c.ids.resize(i + 1);
      c.weights.resize(i + 1);
      break;
    }
  }
  c.total = cum;
}

// A weight's band: 0 for 1, b for [2^-b, 2^-b+1) (a weight is at most 1), the subnormals in the
// last band.
int WeightBand(double w) {
  return 1023 - static_cast<int>((std::bit_cast<uint64_t>(w) >> 52) & 0x7ff);
}

// Ids per block of IdsAtLeast's scan, and the bands TopPPrefix first sums over the ids of weight
// >= 2^-kTopBands alone.
constexpr int64_t kScanBlock = 32;
constexpr int kTopBands = 16;

// counts[j] = how many of w[32j .. 32j + 31] are >= tau, for `blocks` whole blocks: branch-free,
// vectorised (an AVX2 clone where the CPU has it).
__attribute__((target_clones("avx2", "default"))) void CountAtLeast(const double* w, int64_t blocks,
                                                                    double tau, int32_t* counts) {
  for (int64_t j = 0; j < blocks; ++j) {
    int64_t c = 0;
    for (int64_t k = 0; k < kScanBlock; ++k) c += w[j * kScanBlock + k] >= tau ? 1 : 0;
    counts[j] = static_cast<int32_t>(c);
  }
}

// The ids i with w[i] >= tau, in id order: only the blocks CountAtLeast finds one in are read
// again, each without a branch per id.
std::vector<int32_t> IdsAtLeast(const std::vector<double>& w, double tau) {
  const int64_t n = static_cast<int64_t>(w.size()), blocks = n / kScanBlock;
  std::vector<int32_t> counts(blocks);
  CountAtLeast(w.data(), blocks, tau, counts.data());
  std::vector<int32_t> ids;
  auto scan = [&](int64_t from, int64_t to) {
    int32_t found[kScanBlock];
    int k = 0;
    for (int64_t i = from; i < to; ++i) {
      found[k] = static_cast<int32_t>(i);
      k += w[i] >= tau ? 1 : 0;
    }
    ids.insert(ids.end(), found, found + k);
  };
  for (int64_t j = 0; j < blocks; ++j) {
    if (counts[j] > 0) scan(j * kScanBlock, (j + 1) * kScanBlock);
  }
  scan(blocks * kScanBlock, n);
  return ids;
}

// The lowest band whose weight, with the heavier bands', reaches `threshold`, each band summed in
// id order over `ids` (every id when null), or -1 when none does.
int LastBand(const std::vector<double>& w, const std::vector<int32_t>* ids, double threshold) {
  std::vector<double> band_weight(1024, 0.0);
  auto add = [&](size_t i) {
    if (w[i] > 0.0) band_weight[WeightBand(w[i])] += w[i];
  };
  if (ids != nullptr) {
    for (const int32_t i : *ids) add(static_cast<size_t>(i));
  } else {
    for (size_t i = 0; i < w.size(); ++i) add(i);
  }
  double sum = 0.0;
  for (int b = 0; b < 1024; ++b) {
    sum += band_weight[b];
    if (sum >= threshold) return b;
  }
  return -1;
}

// `ids`, in id order, into ByLogit order. Past a few hundred ids, an LSD radix sort of (the
// logit's order key, descending; the id) on the key's 32 bits, 8 a pass: each pass is stable, so
// equal logits keep their id order, ByLogit's tie rule.
void SortByLogit(const float* logits, std::vector<int32_t>& ids) {
  if (ids.size() < 512) {
    std::sort(ids.begin(), ids.end(), ByLogit{logits});
    return;
  }
  const size_t n = ids.size();
  std::vector<uint64_t> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t up = static_cast<uint32_t>(OrderKey(logits[ids[i]])) ^ 0x80000000u;
    a[i] = (static_cast<uint64_t>(~up) << 32) | static_cast<uint32_t>(ids[i]);
  }
  for (int shift = 32; shift < 64; shift += 8) {
    size_t start[257] = {};
    for (const uint64_t v : a) ++start[((v >> shift) & 0xff) + 1];
    for (int d = 0; d < 256; ++d) start[d + 1] += start[d];
    for (const uint64_t v : a) b[start[(v >> shift) & 0xff]++] = v;
    a.swap(b);
  }
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(a[i] & 0xffffffffu);
}

// top_p over the whole vocabulary without sorting it. The weight of each band (a power of two)
// gives the lowest band whose heavier ids reach `target`; those ids lead the ByLogit order (a
// weight is monotone in the logit), so they are sorted alone. Then CutPrefix. Ids of weight 0
// are left out: they can be neither where the prefix ends nor drawn. The bands up to kTopBands
// are summed over the ids a vectorised scan finds at or above 2^-kTopBands; those sums are the
// whole vocabulary's, so where they reach `target` that band is the answer, and only where they
// do not are all ids summed.
Candidates TopPPrefix(const float* logits, const std::vector<double>& w, double target) {
  const double threshold = target * (1.0 + 0x1.0p-40);  // margin: the sorted sum must reach it too
  Candidates c;
  const std::vector<int32_t> top = IdsAtLeast(w, std::ldexp(1.0, -kTopBands));
  int last = LastBand(w, &top, threshold);
  if (last >= 0) {
    for (const int32_t id : top) {
      if (WeightBand(w[id]) <= last) c.ids.push_back(id);
    }
  } else {
    last = LastBand(w, nullptr, threshold);
    // Every id of weight > 0 when no band reaches it, or the last band (the subnormals) does.
    c.ids = IdsAtLeast(w, last < 0 || last >= 1023 ? 0x1p-1074 : std::ldexp(1.0, -last));
  }
  SortByLogit(logits, c.ids);
  for (const int32_t id : c.ids) c.weights.push_back(w[id]);
  CutPrefix(target, c);
  return c;
}

// The weight of a logit: WeightExp of its tempered distance to the largest logit m, 0 below
// min_p.
inline double Weight(float logit, double m, double inv_t, double min_p) {
  const double w = WeightExp((static_cast<double>(logit) - m) * inv_t);
  return w < min_p ? 0.0 : w;
}

// w[i] = Weight of id i, vectorised: 4 lanes where the CPU has AVX2 (a clone the loader picks), 2
// elsewhere, the same bits from either (no FMA: the build contracts nothing).
__attribute__((target_clones("avx2", "default"))) void FillWeights(const float* logits,
                                                                   int64_t vocab, double m,
                                                                   double inv_t, double min_p,
                                                                   double* w) {
  for (int64_t i = 0; i < vocab; ++i) w[i] = Weight(logits[i], m, inv_t, min_p);
}

// With top_k, the k most likely ids in ByLogit order (then top_p's prefix of them); else with
// top_p, the prefix of the whole vocabulary's ByLogit order whose weight reaches top_p of the
// vocabulary's; else every id in id order.
Candidates DrawCandidates(const float* logits, int64_t vocab, int32_t argmax,
                          const SamplingConfig& c) {
  const double m = logits[argmax], inv_t = 1.0 / static_cast<double>(c.temperature);
  const double min_p = c.min_p;
  const bool cut_p = c.top_p > 0.0f && c.top_p < 1.0f;
  Candidates out;
  if (c.top_k > 0 && c.top_k < vocab) {
    out.ids = TopIds(logits, vocab, c.top_k);
    for (const int32_t id : out.ids) out.weights.push_back(Weight(logits[id], m, inv_t, min_p));
    double total = 0.0;
    for (const double w : out.weights) total += w;
    CutPrefix(cut_p ? c.top_p * total : INFINITY, out);
    return out;
  }
  std::vector<double> w(vocab);
  FillWeights(logits, vocab, m, inv_t, min_p, w.data());
  const double total = SumWeights(w);
  if (cut_p) return TopPPrefix(logits, w, c.top_p * total);
  out.ids.resize(vocab);
  std::iota(out.ids.begin(), out.ids.end(), 0);
  out.weights = std::move(w);
  out.total = total;
  return out;
}

// Applies logit_bias, the penalties, the mask and the bans to `out` (a copy of the raw logits).
absl::Status Process(const SamplingConfig& c, const SamplingInputs& in, std::span<float> out) {
  const int64_t vocab = static_cast<int64_t>(out.size());
  for (const auto& [id, bias] : c.logit_bias) {
    if (id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling: logit_bias token ", id, " is outside the vocabulary"));
    }
    out[id] += bias;
  }
  if (c.has_penalties()) {
    if (in.history == nullptr) {
      return absl::InvalidArgumentError("sampling: penalties without the sequence's tokens");
    }
    auto repeat = [&](int32_t id) {
      if (id < 0 || id >= vocab) return;
      out[id] = out[id] > 0.0f ? out[id] / c.repetition_penalty : out[id] * c.repetition_penalty;
    };
    if (c.repetition_penalty != 1.0f) {
      for (const int32_t id : in.history->prompt) repeat(id);
      for (const auto& [id, n] : in.history->output) {
        if (!in.history->prompt.contains(id)) repeat(id);
      }
    }
    for (const auto& [id, n] : in.history->output) {
      if (id < 0 || id >= vocab || n <= 0) continue;
      out[id] -= c.frequency_penalty * static_cast<float>(n) + c.presence_penalty;
    }
  }
  if (!in.allowed.empty()) {
    for (int64_t i = 0; i < vocab; ++i) {
      const size_t w = static_cast<size_t>(i / 32);
      if (w >= in.allowed.size() || !((in.allowed[w] >> (i % 32)) & 1u)) out[i] = -INFINITY;
    }
  }
  for (const int32_t id : in.banned) {
    if (id >= 0 && id < vocab) out[id] = -INFINITY;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSampling(const SamplingConfig& c) {
  if (!std::isfinite(c.temperature) || c.temperature < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: temperature ", c.temperature, " must be finite and >= 0"));
  }
  if (!(c.top_p >= 0.0f && c.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: top_p ", c.top_p, " outside (0, 1] (0 means 1)"));
  }
  if (c.top_logprobs < -1 || c.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: top_logprobs ", c.top_logprobs,
                                                   " outside [-1, ", kMaxTopLogprobs, "]"));
  }
  if (!(c.min_p >= 0.0f && c.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: min_p ", c.min_p, " outside [0, 1]"));
  }
  for (const auto& [id, bias] : c.logit_bias) {
    if (id < 0 || !std::isfinite(bias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling: logit_bias of token ", id, " (", bias, ") is invalid"));
    }
  }
  if (!std::isfinite(c.frequency_penalty) || !std::isfinite(c.presence_penalty)) {
    return absl::InvalidArgumentError("sampling: frequency and presence penalties must be finite");
  }
  if (!(std::isfinite(c.repetition_penalty) && c.repetition_penalty > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling: repetition_penalty ", c.repetition_penalty, " must be finite and > 0"));
  }
  return absl::OkStatus();
}

double UniformDraw(uint64_t seed, int64_t position) {
  const uint64_t h = SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(position));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

uint64_t DefaultSeed(uint64_t process_seed, uint64_t seq_id) {
  return SplitMix64(process_seed ^ SplitMix64(seq_id));
}

absl::StatusOr<SampledToken> SampleToken(const float* raw, int64_t vocab, const SamplingConfig& c,
                                         int64_t position, const SamplingInputs& in) {
  if (absl::Status st = ValidateSampling(c); !st.ok()) return st;
  if (vocab < 1) return absl::InvalidArgumentError("sampling: empty vocabulary");
  if (const int64_t bad = FirstNonFinite(raw, vocab); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: logit of token ", bad, " is ", raw[bad]));
  }
  // The logits the draw uses: raw, or a processed copy.
  std::vector<float> processed;
  const float* logits = raw;
  if (!c.logit_bias.empty() || c.has_penalties() || !in.allowed.empty() || !in.banned.empty()) {
    processed.assign(raw, raw + vocab);
    if (absl::Status st = Process(c, in, processed); !st.ok()) return st;
    logits = processed.data();
  }
  const int32_t argmax = Argmax(logits, vocab);
  if (logits[argmax] == -INFINITY) {
    return absl::FailedPreconditionError(
        "sampling: the allowed-token mask and the banned ids leave no token to draw");
  }
  SampledToken out;
  out.token = argmax;
  if (c.temperature > 0.0f) {
    const Candidates cand = DrawCandidates(logits, vocab, argmax, c);
    const double target = UniformDraw(c.seed, position) * cand.total;
    double cum = 0.0;
    for (size_t i = 0; i < cand.ids.size(); ++i) {
      cum += cand.weights[i];
      if (target < cum) {
        out.token = cand.ids[i];
        break;
      }
    }
  }
  if (c.top_logprobs >= 0) {
    double m = raw[0];
    for (int64_t i = 1; i < vocab; ++i) m = std::max(m, static_cast<double>(raw[i]));
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(raw[i]) - m);
    const double lse = m + std::log(sum);
    out.logprob = static_cast<float>(raw[out.token] - lse);
    for (const int32_t id : TopIds(raw, vocab, c.top_logprobs)) {
      out.top.emplace_back(id, static_cast<float>(raw[id] - lse));
    }
  }
  return out;
}

}  // namespace ss::gpu
