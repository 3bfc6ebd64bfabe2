// One streamed OpenAI /v1/completions request of `splitserve bench serve`, timed from the client.
//
// The request carries the prompt (token ids or text), max_tokens, temperature, stream: true and
// stream_options.include_usage: true (plus ignore_eos when asked). Timing: TTFT is the time to the
// first chunk whose text is non-empty (when none has text, the first chunk with a choice, else
// the end); every later text-bearing chunk adds one inter-chunk gap to `itl`. Token counts come
// only from the stream's `usage` chunk, never from the requested length. `cached_tokens` (a
// splitserve addition, not in vLLM's client) is the usage's prompt_tokens_details.cached_tokens,
// 0 when the server leaves it out or sends null (vLLM without --enable-prompt-tokens-details).
//
// Failures end the request with `success` false and `error` saying why: no connection, an HTTP
// status other than 200 (with the body), an `error` object in the stream, a malformed event, a
// stream that ends before [DONE] or without usage, or no end within the request timeout. No
// failure throws or hangs.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/bench/bench_dataset.h"

namespace httplib {
class Client;
}

namespace ss::bench {

struct RequestOutput {
  bool success = false;
  std::string error;
  double start_s = 0;  // when it was sent, seconds from the run's start
  double ttft_s = 0;
  double latency_s = 0;       // end to end
  std::vector<double> itl_s;  // gaps between text-bearing chunks after the first
  int64_t prompt_len = 0;     // usage.prompt_tokens (the ids sent, when the request failed)
  int64_t output_tokens = 0;  // usage.completion_tokens (0 when the request failed)
  // usage.prompt_tokens_details.cached_tokens: prompt tokens the server took from its prefix
  // cache (0 when absent or the request failed).
  int64_t cached_tokens = 0;
  int64_t turn = 0;  // 0-based index within its conversation (set by RunLoad, not by Send)
};

struct ClientTarget {
  std::string base_url;  // http://host:port[/prefix]
  std::string endpoint;  // /v1/completions
  std::string model;
  std::string api_key;  // "" = no Authorization header
  double temperature = 0;
  bool ignore_eos = false;
  double timeout_s = 3600;
};

// One connection (kept alive between requests); one thread at a time.
class CompletionClient {
 public:
  explicit CompletionClient(ClientTarget target);
  ~CompletionClient();

  // Sends `turn` and waits for its end; `run_start` is the zero of start_s.
  RequestOutput Send(const Turn& turn, std::chrono::steady_clock::time_point run_start);

 private:
  ClientTarget target_;
  std::string path_;  // prefix of base_url + endpoint
  std::unique_ptr<httplib::Client> http_;
};

// The first model id of GET /v1/models, or an error naming the URL (Unavailable when nothing
// answers there).
absl::StatusOr<std::string> FirstModelId(const std::string& base_url, const std::string& api_key,
                                         double timeout_s);

}  // namespace ss::bench
