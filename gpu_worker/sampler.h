// Token sampling on the host from one position's fp32 logits (proto/cluster.proto
// SamplingParams): greedy, temperature, top-k, top-p, min-p, logit bias, penalties, an allowed-id
// mask (constrained decoding), banned ids (min_tokens), seeded draws and logprobs.
//
// Order (as vLLM's sampler): logits + logit_bias; the penalties, with vLLM's formulas --
// repetition r on every id of the prompt or the output (a positive logit / r, any other x r),
// then frequency f and presence p on the output's ids (logit - f x count - p x [count > 0]); ids
// outside the allowed mask and banned ids removed; / temperature; keep the top_k largest, drop
// those less likely than min_p x the likeliest, then the smallest prefix of the rest (most likely
// first) whose probability reaches top_p, renormalise, draw. The weights are e^((logit - the
// largest) / temperature) by WeightExp, the vocabulary's total by SumWeights (sampler_math.h:
// vectorised, within 2 ulp of exp). Greedy (temperature 0) takes the
// argmax of the processed logits. Ties between equal logits are
// broken by the lower token id everywhere (greedy argmax, the top-k cut, the top-p order, the
// logprob list), so a result never depends on the vocabulary's memory order.
//
// Reproducibility. The uniform draw at `position` is a counter-based hash of (seed, position)
// (SplitMix64), not a stateful generator: a sequence that is preempted and recomputed, or
// batched differently, draws the same number at the same position. Without has_seed the worker
// supplies its own seed (a per-sequence value derived from a per-process random number), so
// unseeded requests differ between runs but still replay within one.
//
// Logprobs are the log-softmax of the RAW logits (before logit_bias, temperature and filtering),
// in fp64 and returned as fp32: the model's own distribution, as OpenAI reports it.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ss::gpu {

inline constexpr int kMaxTopLogprobs = 20;

struct SamplingConfig {
  float temperature = 0.0f;  // 0 = greedy; otherwise finite and > 0
  float top_p = 1.0f;        // (0, 1]; 0 (the proto default) means 1
  int top_k = 0;             // <= 0: disabled
  uint64_t seed = 0;         // used for every draw (the caller fills it when the request has none)
  int top_logprobs = -1;     // -1: none; 0..kMaxTopLogprobs: the sampled token's + this many
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id, finite bias), ids in the vocabulary
  float min_p = 0.0f;                                 // [0, 1]; 0: off
  float frequency_penalty = 0.0f;                     // finite; 0: off
  float presence_penalty = 0.0f;                      // finite; 0: off
  float repetition_penalty = 1.0f;                    // finite and > 0; 1: off

  bool has_penalties() const {
    return frequency_penalty != 0.0f || presence_penalty != 0.0f || repetition_penalty != 1.0f;
  }
};

// Whether SampleToken's token is the raw logits' argmax and nothing else is asked (greedy, no
// logit_bias, no penalties, no logprobs): with an empty allowed mask and no banned ids, the
// token is the lowest id of the largest logit, unless a logit is NaN or +inf or every logit is
// -inf (SampleToken's refusals). A backend may compute that token itself (StageChunk::greedy).
inline bool IsPlainGreedy(const SamplingConfig& c) {
  return c.temperature == 0.0f && c.logit_bias.empty() && !c.has_penalties() && c.top_logprobs < 0;
}

// A sequence's tokens as the penalties see them: the distinct ids of its prompt and how often
// each id occurs in its output.
struct TokenHistory {
  absl::flat_hash_set<int32_t> prompt;
  absl::flat_hash_map<int32_t, int32_t> output;
};

// What a draw takes besides the config, all borrowed for the call.
struct SamplingInputs {
  const TokenHistory* history = nullptr;  // required when config.has_penalties()
  // Empty: every id may be drawn. Else one bit per id, id i at bit i % 32 of word i / 32; a clear
  // bit (or an id past the mask) is never drawn.
  std::span<const uint32_t> allowed;
  std::span<const int32_t> banned;  // never drawn
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;                        // of `token` (when top_logprobs >= 0)
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

// InvalidArgument naming the field for a negative / non-finite temperature, top_p or min_p
// outside [0, 1], top_logprobs outside [-1, kMaxTopLogprobs], a non-finite or negative-id
// logit_bias (ids past the vocabulary: SampleToken), a non-finite penalty or a repetition
// penalty <= 0.
absl::Status ValidateSampling(const SamplingConfig& config);

// The uniform number in [0, 1) a sequence with `seed` draws at `position` (53 random bits).
double UniformDraw(uint64_t seed, int64_t position);

// The seed an unseeded sequence uses: a mix of the worker's random `process_seed` and `seq_id`.
uint64_t DefaultSeed(uint64_t process_seed, uint64_t seq_id);

// Samples one token from logits[vocab]. `position` is the position whose logits these are (the
// sequence's last input position); it selects the draw. Errors: ValidateSampling's, vocab < 1,
// a NaN or +inf logit (InvalidArgument naming its id), a logit_bias id >= vocab, penalties
// without a history, and FailedPrecondition when the mask and the bans leave no id.
absl::StatusOr<SampledToken> SampleToken(const float* logits, int64_t vocab,
                                         const SamplingConfig& config, int64_t position,
                                         const SamplingInputs& inputs = {});

}  // namespace ss::gpu
