#include "gpu_worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

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
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(raw[i]) || raw[i] == INFINITY) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling: logit of token ", i, " is ", raw[i]));
    }
  }
  // The logits the draw uses: raw, or a processed copy.
  std::vector<float> processed;
  const float* logits = raw;
  if (!c.logit_bias.empty() || c.has_penalties() || !in.allowed.empty() || !in.banned.empty()) {
    processed.assign(raw, raw + vocab);
    if (absl::Status st = Process(c, in, processed); !st.ok()) return st;
    logits = processed.data();
  }
  int32_t argmax = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (logits[i] > logits[argmax]) argmax = static_cast<int32_t>(i);
  }
  if (logits[argmax] == -INFINITY) {
    return absl::FailedPreconditionError(
        "sampling: the allowed-token mask and the banned ids leave no token to draw");
  }
  SampledToken out;
  out.token = argmax;
  if (c.temperature > 0.0f) {
    // Candidates in ByLogit order when a cut needs the order; else all ids in id order.
    const bool cut_k = c.top_k > 0 && c.top_k < vocab;
    const bool cut_p = c.top_p > 0.0f && c.top_p < 1.0f;
    std::vector<int32_t> cand;
    if (cut_k || cut_p) {
      cand = TopIds(logits, vocab, cut_k ? c.top_k : vocab);
    } else {
      cand.resize(vocab);
      std::iota(cand.begin(), cand.end(), 0);
    }
    // Weights relative to the likeliest id (1), which every cut keeps; min_p zeroes the weights
    // below it.
    const double m = logits[argmax], inv_t = 1.0 / static_cast<double>(c.temperature);
    std::vector<double> p(cand.size());
    double total = 0.0;
    for (size_t i = 0; i < cand.size(); ++i) {
      p[i] = std::exp((static_cast<double>(logits[cand[i]]) - m) * inv_t);
      if (p[i] < c.min_p) p[i] = 0.0;
      total += p[i];
    }
    size_t kept = cand.size();
    if (cut_p) {
      double cum = 0.0;
      for (size_t i = 0; i < cand.size(); ++i) {
        cum += p[i];
        if (cum >= c.top_p * total) {
          kept = i + 1;
          total = cum;
          break;
        }
      }
    }
    const double target = UniformDraw(c.seed, position) * total;
    double cum = 0.0;
    for (size_t i = 0; i < kept; ++i) {
      cum += p[i];
      if (target < cum) {
        out.token = cand[i];
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
