// The OpenAI-compatible HTTP gateway (cpp-httplib): turns chat / completion requests into prompt
// ids (chat_encoding.h + tokenizer.h), hands them to a GenerationEngine (engine.h) and renders
// the generated ids back as OpenAI responses or SSE streams (completion_parser.h).
//
// Routes:
//   POST /v1/chat/completions   messages, tools, response_format, temperature, top_p, top_k,
//                               max_tokens | max_completion_tokens, seed, stop, logprobs,
//                               top_logprobs (0..20, needs logprobs: true), stream,
//                               stream_options.include_usage, chat_template_kwargs {thinking |
//                               enable_thinking | thinking_mode, reasoning_effort},
//                               reasoning_effort
//   POST /v1/completions        prompt (string or array of ids) -> text; logprobs (0..20)
//   GET  /v1/models, GET /health (live), GET /ready (engine->Ready()), GET|POST /ping (200 while
//                               live, SageMaker's probe, open like /health), GET /version
//                               {"version"}, GET /load {"server_load": requests in flight}
//   GET  /metrics               Prometheus text exposition (text/plain; version=0.0.4) of the
//                               gateway's registry (see "Metrics" below)
//   POST /tokenize              vLLM's shapes: {"prompt": string (or "text"), return_token_strs}
//                               or {"messages": [...], chat template controls} -> {"count",
//                               "max_model_len", "tokens", "token_strs" (null unless asked)};
//                               add_special_tokens: true is a 400 (prompts are taken as given)
//   POST /detokenize            {"tokens"|"ids": [int]} -> {"prompt"}
//   OPTIONS (any path)          a CORS preflight (GatewayConfig::allowed_origins), else 405
// Special tokens written in chat messages (content, reasoning, tool results, tool schemas,
// tool-call names and arguments) are text, never control ids (chat_encoding.h, Prompt): no client
// can forge a turn. A raw completion prompt or /tokenize "text" is the caller's own template, where
// they become their ids (as in vLLM). Bodies nest at most 64 levels deep (json_limits.h).
// Errors are OpenAI bodies {"error": {"message", "type", "param", "code"}}: 400 malformed JSON,
// invalid field (param names it) or prompt too long (code "context_length_exceeded"), 401 bad or
// missing `Authorization: Bearer` key when keys are configured (/health, /ready and /metrics stay
// open: scrapers and probes carry no key, and the series hold no request content),
// 404 unknown model or route, 405 a method other than GET, HEAD and POST, 413 body over
// max_body_bytes, 503 engine overloaded or not ready (with Retry-After), 500 engine or internal
// error. No input crashes the process: every handler is wrapped.
//
// Request ids: every response carries `X-Request-Id` (as vLLM with --enable-request-id-headers
// and OpenAI do): the client's own X-Request-Id when it is 1..128 characters of [A-Za-z0-9._:-]
// (so that it goes into the log verbatim; a proxy's id then follows the request through), else one
// the gateway makes (32 hex digits, unique across restarts and replicas: a per-process random
// 128-bit salt; completion ids are chatcmpl-/cmpl- and another such id). A 500 tells the client
// only "generation failed" or "internal error" and "see the server log for request <id>": engine
// errors name workers, PIDs and shared-memory segments, so the detail goes to the log (spdlog,
// error level) under the id. 4xx messages stay specific: they describe the client's own input.
//
// Request bodies: POST bodies are read by the gateway, not by httplib (whose limit covers only a
// Content-Length body), and counted as they arrive whatever the transfer or content encoding
// (chunked, gzip): past max_body_bytes the answer is 413 without reading further (a Content-Length
// over it is refused before any byte is read). A request whose body is not read (413, 401, 404 on
// an unknown POST route, 405) is answered and its connection closed, after discarding what the
// client still sends for up to 16 MiB or 1 s so that the close does not reset the response away.
// GET and HEAD requests with a body are refused (400).
//
// Connections (cpp-httplib 0.11 is thread-per-connection with no deadline on receiving a
// request): a connection thread per open connection, started on demand up to http_threads
// (connection_pool.h), so idle and slow connections take threads of their own rather than a
// fixed pool's; and deadlines on receiving each request (receive_deadline.h): line and headers
// within head_timeout_ms, body within body_timeout_ms, enforced by a watcher thread that shuts
// the connection's socket down, so a client sending partial headers, or a byte at a time, is
// dropped after head_timeout_ms instead of holding a thread indefinitely. Once a request is
// received the deadlines no longer apply: generation and streams last as long as they need.
// httplib 0.11 buffers a request line or a header line whole before it checks its length (8 KiB),
// so a connection waiting for headers is also dropped once it has received max_body_bytes + 1 MiB
// (counted by the kernel, TCP_INFO). Known limits that remain: such a connection can hold that
// much plus what it sends in one watcher period (50 ms); more than http_threads connections at
// once wait in the accept queue (a flood of them delays every client until the deadlines clear
// them). An event-driven server would remove both.
//
// Stop strings (`stop`, up to 4) are matched on the generated text before reasoning and tool
// calls are parsed (output_text.h): the text before the first one is returned, the engine's
// request is cancelled (freeing its KV) and finish_reason is "stop". A stream holds back text that
// may still become a stop string, so it never emits part of one.
//
// Logprobs (SamplingParams::top_logprobs, filled by the engine) in OpenAI's formats: chat
// choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob,
// bytes}]}]}; completions choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token:
// logprob}], text_offset}. A stream chunk carries the entries of the ids whose text it completes.
// Entries cover the ids whose text is returned: none for the ids that made a stop string. Usage
// counts every id taken, up to the one that completed a stop string.
//
// Cancellation: a client that disconnects mid-stream is detected when a write fails (httplib's
// content provider / releaser) and its request's CancellationToken is signalled. A non-streaming
// request looks at its connection's socket every 50 ms while it waits for the engine
// (connection_socket.h: peer closed or reset) and is cancelled the same way when the client hung
// up; its response then has status 499 (nobody reads it). A client that half-closes its sending
// side after the request counts as gone (as in uvicorn, which vLLM runs on). Writes to a
// closed socket must not raise SIGPIPE: the process should ignore SIGPIPE (the server does not
// change signal dispositions itself).
//
// Metrics: vLLM's series under `splitserve:` (gateway_metrics.h lists them), with the engine's
// gauges from GatewayConfig::engine_gauges, and the process_* series.
// Arrival is when the route handler starts (the body has been read).
//
// Threading: Start() and Stop() from one owner thread; requests run on the connection threads,
// one blocking thread per open connection (a streaming request holds its thread until done).
// The tokenizer and engine are not owned and must outlive the server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/engine.h"
#include "coordinator/gateway_metrics.h"
#include "coordinator/tokenizer.h"

namespace httplib {
class Server;
}

namespace ss {

namespace metrics {
class Metrics;
}  // namespace metrics

struct GatewayConfig {
  std::string model_name = "deepseek-v4";
  std::vector<std::string> api_keys;   // empty: no authentication
  int32_t max_context_tokens = 65536;  // prompt + max_tokens must fit
  // The model's logit count, which constraint masks cover (0: the tokenizer's ids).
  int32_t model_vocab_size = 0;
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  // Connection threads (connection_pool.h): each open connection holds one while it is served
  // (reading a request, generating, streaming); started on demand up to this many, connections
  // beyond wait for a free one.
  int http_threads = 1024;
  // Receiving a request (receive_deadline.h): its line and headers within head_timeout_ms of the
  // connection's accept or previous response, its body within body_timeout_ms after the headers;
  // otherwise the connection is closed. Idle keep-alive connections close after
  // keep_alive_timeout_s.
  int head_timeout_ms = 10000;
  int body_timeout_ms = 60000;
  int keep_alive_timeout_s = 5;
  // The registry the gateway's series go into and GET /metrics serves; not owned, must outlive
  // the server. Null: the server owns a private one.
  metrics::Metrics* metrics = nullptr;
  // Optional: the engine's gauges and cumulative counters (running / waiting requests, KV usage,
  // preemptions, prefix cache), read at every scrape and by the stats log (thread-safe).
  std::function<EngineGauges()> engine_gauges;
  // Optional: the largest prompt + max_tokens the engine can hold now (its KV cache), when less
  // than max_context_tokens; 0 = unknown. Requests past it are 400s (context_length_exceeded),
  // and /v1/messages lowers its max_tokens to fit.
  std::function<int64_t()> max_sequence_tokens;
  // Every this many seconds, one log line of the engine's throughput and state (vLLM's
  // "Avg prompt throughput ..."), while there is activity; 0: none.
  double log_stats_interval_s = 10;
  // The server's version string, answered by GET /version.
  std::string version = "unknown";
  // CORS (browser front-ends; vLLM's --allowed-origins, --allow-credentials, --allowed-methods,
  // --allowed-headers, with Starlette's semantics): no origin allowed by default (vLLM allows
  // "*", which lets any web page the user opens call a local server); "*" allows every origin.
  std::vector<std::string> allowed_origins;
  bool allow_credentials = false;
  std::vector<std::string> allowed_methods = {"*"};
  std::vector<std::string> allowed_headers = {"*"};
  // n > 1: submit choice 0 first and the other choices once it produced its first event (its
  // prompt is done), so that they resume from the engine's prefix cache instead of prefilling
  // the same prompt n times. Set where the engine caches prefixes.
  bool share_prompt_prefill = false;
};

class OpenAiServer {
 public:
  OpenAiServer(GatewayConfig config, const Tokenizer& tokenizer, GenerationEngine& engine);
  ~OpenAiServer();  // Stop()s
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds host:port (port 0: an ephemeral port) and serves on a background thread.
  // Returns the bound port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, waits for the listener thread. Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace ss
