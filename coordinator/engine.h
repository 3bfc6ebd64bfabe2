// The gateway's view of the model: a GenerationEngine takes a tokenised prompt with sampling
// parameters and streams generated token ids back. The OpenAI gateway (openai_server.h) depends
// only on this interface, so it is tested against FakeEngine (tests/coordinator/fake_engine.h)
// and served by the cluster (cluster_engine.h) without change.
//
// Contract:
//   * Submit() never blocks on generation. It either refuses at once (kOverloaded / kNotReady:
//     expected outcomes, not errors) or returns a GenerationStream that the engine fills from its
//     own threads.
//   * The engine delivers generated ids in order, in one or more Push() calls, then exactly one
//     Finish(). The token that ended generation (EOS or a stop token id) is NOT delivered and not
//     counted; a kLength finish means max_tokens ids were delivered.
//   * Cancellation: the gateway calls request.cancel->Cancel() when its client went away or the
//     text matched one of the request's stop strings (applied in the gateway, on text). The
//     engine polls cancelled() between steps, frees the sequence's resources (KV) and finishes
//     the stream with kCancelled. Finishing with another reason after a cancel is allowed (a race
//     with the last step); the gateway ignores the outcome either way.
//
// Threading: GenerationStream is a single-producer (the engine) single-consumer (one gateway
// request thread) queue; every method is thread-safe. CancellationToken is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ss {

// Set by the gateway (client disconnected, stop string matched), read by the engine. Never reset.
class CancellationToken {
 public:
  void Cancel() { cancelled_.store(true, std::memory_order_release); }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> cancelled_{false};
};

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = -1;        // -1 or 0 = disabled
  int32_t max_tokens = 16;   // >= 1; generation stops with kLength after this many ids
  std::optional<uint64_t> seed;
  std::vector<int32_t> stop_token_ids;  // besides EOS; finish kStop
  // EOS is an ordinary id, delivered like the others: generation runs to max_tokens, a stop id or
  // a stop string (vLLM's ignore_eos).
  bool ignore_eos = false;
  // (id, bias) added to the logits before sampling (OpenAI's logit_bias; ids inside the
  // vocabulary, which ClusterEngine::Submit checks). Logprobs stay those of the raw logits.
  std::vector<std::pair<int32_t, float>> logit_bias;
  float min_p = 0.0f;  // [0, 1]: ids less likely than min_p x the likeliest one are not drawn
  // vLLM's penalties (gpu_worker/sampler.h has the formulas): frequency and presence in [-2, 2]
  // on the output's ids, repetition > 0 on the prompt's and the output's (1: off).
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  // EOS (unless ignore_eos) and the stop ids cannot be drawn before this many ids were generated
  // (vLLM's min_tokens; <= max_tokens).
  int32_t min_tokens = 0;
  // Log-probabilities to return with every generated id: -1 none; k >= 0 the sampled id's
  // logprob plus the k most likely ids (k <= 20, the gateway's limit). They are the log-softmax
  // of the model's logits before temperature, top_p and top_k (vLLM's default "raw_logprobs").
  int32_t top_logprobs = -1;
};

// The log-probabilities of one generated id (SamplingParams::top_logprobs >= 0).
struct TokenLogprobs {
  float logprob = 0.0f;                        // of the sampled id
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first; size k
};

enum class FinishReason { kNone, kEos, kLength, kStop, kCancelled, kError };

// "stop" | "length" | "cancelled" | "error" ("" for kNone): OpenAI spells EOS as "stop".
const char* FinishReasonName(FinishReason reason);

// What may be generated next, e.g. a grammar (constrained decoding: response_format, forced tool
// calls). The engine asks for the allowed ids before every draw of the request and reports every
// generated id, in order, from one thread at a time; the constraint lives as long as the request.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets bit (id % 32) of mask[id / 32] for every id that may come next and clears the others
  // (mask holds (vocab + 31) / 32 words; ids past the constraint's vocabulary stay clear). An
  // end-of-sequence id is allowed only where the constraint may end.
  virtual void FillAllowed(std::span<uint32_t> mask) = 0;
  // Advances past a generated id. False when the id was not allowed (the engine then ends the
  // request with an error).
  virtual bool Accept(int32_t id) = 0;
};

struct GenerationRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::shared_ptr<CancellationToken> cancel;    // never null once submitted
  std::shared_ptr<TokenConstraint> constraint;  // null: any id may be generated
};

// What the consumer receives: newly generated ids and, on the last event, the finish reason.
struct GenerationEvent {
  std::vector<int32_t> tokens;
  // Parallel to `tokens` when the request asked for logprobs (top_logprobs >= 0), else empty.
  std::vector<TokenLogprobs> logprobs;
  FinishReason finish = FinishReason::kNone;  // != kNone: this is the last event
  std::string error;                          // with kError
  // Prompt tokens served from the prefix cache (usage.prompt_tokens_details.cached_tokens), as
  // the engine reported them so far: set before the first generated id.
  int64_t cached_tokens = 0;
  // When the engine first scheduled the request (its queue time ends there: vLLM's
  // request_queue_time_seconds); unset until then, or when the engine does not report it.
  std::optional<std::chrono::steady_clock::time_point> scheduled;
};

class GenerationStream {
 public:
  // Producer side (the engine).
  void Push(std::vector<int32_t> tokens);
  // The same with one TokenLogprobs per id (for requests with top_logprobs >= 0; an engine asked
  // for logprobs uses this overload for every push). Once logprobs were pushed, the stream keeps
  // them parallel to the ids: a short `logprobs` (or a plain Push) is padded with empty entries.
  void Push(std::vector<int32_t> tokens, std::vector<TokenLogprobs> logprobs);
  void Finish(FinishReason reason, std::string error = {});
  // The prompt tokens the engine took from its prefix cache (every later event carries it).
  void SetCachedTokens(int64_t tokens);
  // The engine scheduled the request (admitted it to a step) now; only the first call counts.
  void MarkScheduled();

  // Consumer side: waits up to `timeout` and returns everything queued since the last call
  // (tokens and logprobs concatenated; finish set once the engine finished). nullopt: nothing
  // new yet.
  std::optional<GenerationEvent> Next(std::chrono::milliseconds timeout);

 private:
  bool HasNews() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<int32_t> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<TokenLogprobs> pending_logprobs_ ABSL_GUARDED_BY(mu_);
  bool has_logprobs_ ABSL_GUARDED_BY(mu_) = false;
  FinishReason finish_ ABSL_GUARDED_BY(mu_) = FinishReason::kNone;
  std::string error_ ABSL_GUARDED_BY(mu_);
  bool finish_delivered_ ABSL_GUARDED_BY(mu_) = false;
  int64_t cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<std::chrono::steady_clock::time_point> scheduled_ ABSL_GUARDED_BY(mu_);
};

// kRejected: the request can never be served as asked (e.g. prompt + max_tokens is more than
// the KV cache holds): a client error, `error` says why.
enum class SubmitStatus { kAccepted, kOverloaded, kNotReady, kRejected };

struct SubmitOutcome {
  SubmitStatus status = SubmitStatus::kAccepted;
  std::shared_ptr<GenerationStream> stream;  // set iff kAccepted
  int retry_after_s = 1;                     // a hint for kOverloaded
  std::string error;                         // with kRejected
};

class GenerationEngine {
 public:
  virtual ~GenerationEngine() = default;
  // True once every worker is registered and warmed (GET /ready). Thread-safe.
  virtual bool Ready() const = 0;
  // Thread-safe; called concurrently from gateway request threads.
  virtual SubmitOutcome Submit(GenerationRequest request) = 0;
};

}  // namespace ss
