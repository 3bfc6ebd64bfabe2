#include "coordinator/gateway_metrics.h"

#include <algorithm>
#include <vector>

namespace ss {
namespace {

double Seconds(GatewayMetrics::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

const std::vector<double>& TtftBuckets() {
  static const std::vector<double> b{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                     20.0,  40.0,  80.0, 160., 640., 2560.};
  return b;
}
const std::vector<double>& TokenLatencyBuckets() {
  static const std::vector<double> b{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                     0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
  return b;
}
const std::vector<double>& RequestBuckets() {
  static const std::vector<double> b{0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,
                                     5.0,  10.0, 15.0, 20.0, 30.0,  40.0,  50.0,
                                     60.0, 120., 240., 480., 960.0, 1920., 7680.};
  return b;
}

// Adds what `now` has beyond `seen` to `c` and remembers the larger of the two.
void Advance(prometheus::Counter* c, const std::optional<int64_t>& now,
             std::optional<int64_t>& seen) {
  if (!now) return;
  const int64_t before = seen.value_or(0);
  if (*now > before) c->Increment(static_cast<double>(*now - before));
  seen = std::max(before, *now);
}

}  // namespace

GatewayMetrics::GatewayMetrics(metrics::Metrics& m, const std::string& model, int64_t max_model_len)
    : m_(m), model_(model) {
  const metrics::Labels l{{"model_name", model}};
  const std::vector<double> tokens = metrics::Buckets125(static_cast<double>(max_model_len));
  ttft = &m.Histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                      l, TtftBuckets());
  itl = &m.Histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                     l, TokenLatencyBuckets());
  tpot = &m.Histogram("request_time_per_output_token_seconds",
                      "Histogram of time_per_output_token_seconds per request.", l,
                      TokenLatencyBuckets());
  e2e = &m.Histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                     l, RequestBuckets());
  queue =
      &m.Histogram("request_queue_time_seconds",
                   "Histogram of time spent in WAITING phase for request.", l, RequestBuckets());
  prefill =
      &m.Histogram("request_prefill_time_seconds",
                   "Histogram of time spent in PREFILL phase for request.", l, RequestBuckets());
  decode =
      &m.Histogram("request_decode_time_seconds",
                   "Histogram of time spent in DECODE phase for request.", l, RequestBuckets());
  inference =
      &m.Histogram("request_inference_time_seconds",
                   "Histogram of time spent in RUNNING phase for request.", l, RequestBuckets());
  request_prompt =
      &m.Histogram("request_prompt_tokens", "Number of prefill tokens processed.", l, tokens);
  request_generation = &m.Histogram("request_generation_tokens",
                                    "Number of generation tokens processed.", l, tokens);
  params_n = &m.Histogram("request_params_n", "Histogram of the n request parameter.", l,
                          {1, 2, 5, 10, 20});
  params_max_tokens = &m.Histogram("request_params_max_tokens",
                                   "Histogram of the max_tokens request parameter.", l, tokens);
  prompt_tokens = &m.Counter("prompt_tokens_total", "Number of prefill tokens processed.", l);
  generation_tokens =
      &m.Counter("generation_tokens_total", "Number of generation tokens processed.", l);
  running = &m.Gauge("num_requests_running", "Number of requests in model execution batches.", l);
  waiting = &m.Gauge("num_requests_waiting", "Number of requests waiting to be processed.", l);
  kv_usage = &m.Gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", l);
  preemptions =
      &m.Counter("num_preemptions_total", "Cumulative number of preemption from the engine.", l);
  prefix_queries = &m.Counter("prefix_cache_queries_total",
                              "Prefix cache queries, in terms of number of queried tokens.", l);
  prefix_hits = &m.Counter("prefix_cache_hits_total",
                           "Prefix cache hits, in terms of number of cached tokens.", l);
  prefix_blocks =
      &m.Gauge("prefix_cache_blocks", "KV blocks holding cached prefixes and snapshots.", l);
  success_stop = &Success("stop");
  success_length = &Success("length");
  success_abort = &Success("abort");
}

void GatewayMetrics::Scrape(const EngineGauges& g) {
  kv_usage->Set(g.kv_usage.value_or(0.0));
  waiting->Set(static_cast<double>(g.waiting.value_or(0)));
  running->Set(static_cast<double>(g.running.value_or(open_requests())));
  if (g.prefix_blocks) prefix_blocks->Set(static_cast<double>(*g.prefix_blocks));
  absl::MutexLock lock(&mu_);
  Advance(preemptions, g.preemptions, seen_.preemptions);
  Advance(prefix_queries, g.prefix_queries, seen_.prefix_queries);
  Advance(prefix_hits, g.prefix_hits, seen_.prefix_hits);
}

prometheus::Counter& GatewayMetrics::Success(const std::string& reason) {
  return m_.Counter("request_success_total", "Count of successfully processed requests.",
                    {{"model_name", model_}, {"finished_reason", reason}});
}

prometheus::Counter& GatewayMetrics::Error(int status) {
  return m_.Counter("http_request_errors_total",
                    "Count of responses with an HTTP error status (or a failed stream).",
                    {{"model_name", model_}, {"status_code", std::to_string(status)}});
}

void GatewayMetrics::Finished(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos:
    case FinishReason::kStop:
      success_stop->Increment();
      break;
    case FinishReason::kLength:
      success_length->Increment();
      break;
    case FinishReason::kCancelled:
      success_abort->Increment();
      break;
    case FinishReason::kNone:
    case FinishReason::kError:
      break;
  }
}

RequestTimer::~RequestTimer() {
  if (open_) gm_.Closed();
}

void RequestTimer::Accepted(size_t prompt_tokens, int n, int64_t max_tokens, bool streaming) {
  accepted_ = Clock::now();
  prompt_tokens_ = prompt_tokens;
  streaming_ = streaming;
  gm_.prompt_tokens->Increment(static_cast<double>(prompt_tokens));
  gm_.params_n->Observe(n);
  gm_.params_max_tokens->Observe(static_cast<double>(max_tokens));
  gm_.Opened();
  open_ = true;
}

void RequestTimer::Event(size_t n, FinishReason finish, std::optional<Clock::time_point> scheduled,
                         int64_t cached) {
  const auto now = Clock::now();
  if (scheduled && !scheduled_) scheduled_ = scheduled;
  cached_ = std::max(cached_, cached);
  if (n > 0) {
    gm_.generation_tokens->Increment(static_cast<double>(n));
    if (!first_token_) {
      gm_.ttft->Observe(Seconds(now - arrival_));
      first_token_ = now;
    } else {
      const double each = Seconds(now - *last_token_) / static_cast<double>(n);
      for (size_t i = 0; i < n; ++i) gm_.itl->Observe(each);
    }
    last_token_ = now;
    generated_ += n;
  }
  if (finish != FinishReason::kNone) Outcome(finish);
}

void RequestTimer::Abort() { Outcome(FinishReason::kCancelled); }

void RequestTimer::Outcome(FinishReason finish) {
  if (finished_) return;
  finished_ = true;
  finish_ = finish;
  end_ = Clock::now();
  gm_.e2e->Observe(Seconds(*end_ - arrival_));
  gm_.Finished(finish);
  // A non-streaming failure becomes an HTTP 500 that the server's logger counts.
  if (finish == FinishReason::kError && streaming_) gm_.Error(500).Increment();
  // An engine that does not report scheduling: the request ran from its acceptance.
  const std::optional<Clock::time_point> scheduled =
      scheduled_ ? scheduled_ : (first_token_ ? accepted_ : std::nullopt);
  if (!scheduled) return;
  gm_.queue->Observe(Seconds(*scheduled - arrival_));
  gm_.inference->Observe(Seconds(*end_ - *scheduled));
  gm_.request_prompt->Observe(static_cast<double>(prompt_tokens_));
  gm_.request_generation->Observe(static_cast<double>(generated_));
  if (!first_token_) return;
  gm_.prefill->Observe(Seconds(*first_token_ - *scheduled));
  gm_.decode->Observe(Seconds(*last_token_ - *first_token_));
  if (generated_ > 1) {
    gm_.tpot->Observe(Seconds(*last_token_ - *first_token_) / static_cast<double>(generated_ - 1));
  }
}

RequestSummary RequestTimer::Summary() const {
  RequestSummary s;
  s.prompt_tokens = prompt_tokens_;
  s.cached_tokens = static_cast<size_t>(cached_);
  s.generated_tokens = generated_;
  if (first_token_) s.ttft_s = Seconds(*first_token_ - arrival_);
  s.duration_s = Seconds(end_.value_or(Clock::now()) - arrival_);
  s.finish = finish_;
  return s;
}

}  // namespace ss
