// Token sampling on the host from one position's fp32 logits (proto/cluster.proto
// SamplingParams): greedy, temperature, top-k, top-p, seeded draws and logprobs.
//
// Order of the filters (as vLLM and the OpenAI API behave): logits + logit_bias, / temperature,
// then keep the top_k largest, drop those less likely than min_p x the likeliest, then the
// smallest prefix of the rest (most likely first) whose probability reaches top_p, renormalise,
// draw. Greedy (temperature 0) takes the argmax of the biased logits. Ties between equal logits are
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
#include <utility>
#include <vector>

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
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;                        // of `token` (when top_logprobs >= 0)
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

// InvalidArgument naming the field for a negative / non-finite temperature, top_p or min_p
// outside [0, 1], top_logprobs outside [-1, kMaxTopLogprobs], a non-finite or negative-id
// logit_bias (ids past the vocabulary: SampleToken).
absl::Status ValidateSampling(const SamplingConfig& config);

// The uniform number in [0, 1) a sequence with `seed` draws at `position` (53 random bits).
double UniformDraw(uint64_t seed, int64_t position);

// The seed an unseeded sequence uses: a mix of the worker's random `process_seed` and `seq_id`.
uint64_t DefaultSeed(uint64_t process_seed, uint64_t seq_id);

// Samples one token from logits[vocab]. `position` is the position whose logits these are (the
// sequence's last input position); it selects the draw. Errors: ValidateSampling's, vocab < 1,
// a NaN or +inf logit (InvalidArgument naming its id), a logit_bias id >= vocab.
absl::StatusOr<SampledToken> SampleToken(const float* logits, int64_t vocab,
                                         const SamplingConfig& config, int64_t position);

}  // namespace ss::gpu
