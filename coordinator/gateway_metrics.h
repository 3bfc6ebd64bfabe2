// The gateway's vLLM-compatible series (names under `splitserve:`, every series labelled
// model_name; deploy/prometheus.yml renames them to `vllm:`) and the per-request timer that feeds
// them. Buckets are vLLM's: time to first token 1 ms .. 2,560 s, inter-token latency and time
// per output token 10 ms .. 80 s, the request phases 0.3 s .. 7,680 s, token counts 1-2-5 up to
// the model's context.
//
//   time_to_first_token_seconds          arrival -> first generated ids seen by the gateway
//   inter_token_latency_seconds          gap between successive token events, divided evenly over
//                                        the ids the later event carries (one observation per id
//                                        after the first event)
//   request_time_per_output_token_seconds  per request: decode time / (generated ids - 1)
//   e2e_request_latency_seconds          arrival -> the outcome
//   request_queue_time_seconds           arrival -> the engine first scheduled the request
//                                        (GenerationEvent::scheduled; an engine that does not
//                                        report it: arrival -> Submit() accepted, for requests
//                                        that generated)
//   request_prefill_time_seconds         scheduled -> first generated id
//   request_decode_time_seconds          first -> last generated id
//   request_inference_time_seconds       scheduled -> the outcome
//   request_prompt_tokens / request_generation_tokens  per finished request
//   request_params_n / request_params_max_tokens       per accepted request
//   prompt_tokens_total, generation_tokens_total       counters
//   request_success_total{finished_reason}  stop (EOS, stop ids or strings, tool calls), length,
//                                        abort (the client went away or the engine cancelled)
//   http_request_errors_total{status_code}  responses >= 400 (see openai_server.h)
//   num_requests_running, num_requests_waiting, kv_cache_usage_perc, num_preemptions_total,
//   prefix_cache_queries_total, prefix_cache_hits_total, prefix_cache_blocks: the engine's,
//                                        read at every scrape (Scrape)
// The phase and per-request token histograms are observed once per request, at its outcome; a
// request that ended before it was scheduled observes only e2e.
//
// Threading: the series are prometheus-cpp metrics (thread-safe); a RequestTimer belongs to one
// request and is used by one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "coordinator/engine.h"

namespace ss {

// The engine's state as a scrape reads it (any field the engine cannot give stays unset).
struct EngineGauges {
  std::optional<double> kv_usage;  // [0, 1]
  std::optional<int64_t> running, waiting;
  // Cumulative since start.
  std::optional<int64_t> preemptions;
  std::optional<int64_t> prefix_queries, prefix_hits, prefix_blocks;
};

class GatewayMetrics {
 public:
  using Clock = std::chrono::steady_clock;

  // `max_model_len` bounds the token-count buckets.
  GatewayMetrics(metrics::Metrics& m, const std::string& model, int64_t max_model_len);

  // Sets the engine's gauges and advances its counters (cumulative values become counter
  // increments; scrapes may overlap). Without an engine value, num_requests_running counts the
  // gateway's open requests.
  void Scrape(const EngineGauges& g);

  prometheus::Counter& Success(const std::string& reason);
  prometheus::Counter& Error(int status);
  void Finished(FinishReason reason);

  // Requests the gateway has open (accepted, outcome not yet rendered).
  int64_t open_requests() const { return open_.load(std::memory_order_relaxed); }
  void Opened() { open_.fetch_add(1, std::memory_order_relaxed); }
  void Closed() { open_.fetch_sub(1, std::memory_order_relaxed); }
  double prompt_tokens_total() const { return prompt_tokens->Value(); }
  double generation_tokens_total() const { return generation_tokens->Value(); }

  prometheus::Histogram *ttft, *itl, *tpot, *e2e, *queue, *prefill, *decode, *inference;
  prometheus::Histogram *request_prompt, *request_generation, *params_n, *params_max_tokens;
  prometheus::Counter *prompt_tokens, *generation_tokens;
  prometheus::Gauge *running, *waiting, *kv_usage, *prefix_blocks;
  prometheus::Counter *success_stop, *success_length, *success_abort;
  prometheus::Counter *prefix_queries, *prefix_hits, *preemptions;

 private:
  std::atomic<int64_t> open_{0};
  absl::Mutex mu_;
  EngineGauges seen_ ABSL_GUARDED_BY(mu_);  // counters' values at the last scrape
  metrics::Metrics& m_;
  std::string model_;
};

// What a finished request reports (the access log's fields).
struct RequestSummary {
  size_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  std::optional<double> ttft_s;
  double duration_s = 0;
  FinishReason finish = FinishReason::kNone;
};

// Timing of one accepted request, fed from the consumer thread as its events arrive.
class RequestTimer {
 public:
  using Clock = GatewayMetrics::Clock;

  RequestTimer(GatewayMetrics& gm, Clock::time_point arrival) : gm_(gm), arrival_(arrival) {}
  ~RequestTimer();
  RequestTimer(const RequestTimer&) = delete;
  RequestTimer& operator=(const RequestTimer&) = delete;

  // The engine accepted the request's choices.
  void Accepted(size_t prompt_tokens, int n, int64_t max_tokens, bool streaming);
  // `n` generated ids arrived (those the gateway took: none past a stop string) with the
  // engine's report of when it scheduled the request and the cached prompt tokens; `finish` is
  // the request's outcome once known.
  void Event(size_t n, FinishReason finish,
             std::optional<Clock::time_point> scheduled = std::nullopt, int64_t cached = 0);
  // The client went away before the outcome: counted as "abort" (as vLLM counts aborted
  // requests), once.
  void Abort();

  bool finished() const { return finished_; }
  RequestSummary Summary() const;

 private:
  void Outcome(FinishReason finish);

  GatewayMetrics& gm_;
  Clock::time_point arrival_;
  std::optional<Clock::time_point> accepted_, scheduled_, first_token_, last_token_, end_;
  size_t prompt_tokens_ = 0, generated_ = 0;
  int64_t cached_ = 0;
  FinishReason finish_ = FinishReason::kNone;
  bool finished_ = false;  // the outcome was counted
  bool open_ = false;
  bool streaming_ = false;  // a failure is then an in-band event after a 200, not an HTTP 500
};

}  // namespace ss
