// The OpenAI-compatible HTTP gateway (cpp-httplib): turns chat / completion requests into prompt
// ids (chat_encoding.h + tokenizer.h), hands them to a GenerationEngine (engine.h) and renders
// the generated ids back as OpenAI responses or SSE streams (completion_parser.h).
//
// Routes:
//   POST /v1/chat/completions   messages, tools, response_format, temperature, top_p, top_k,
//                               max_tokens | max_completion_tokens, seed, stop (validated; stop
//                               strings are not applied yet), stream, stream_options.include_usage,
//                               chat_template_kwargs {thinking | enable_thinking | thinking_mode,
//                               reasoning_effort}, reasoning_effort
//   POST /v1/completions        prompt (string or array of ids) -> text
//   GET  /v1/models, GET /health (live), GET /ready (engine->Ready())
//   POST /tokenize              {"text"|"prompt": string} or {"messages": [...]} -> {"ids", "count"}
//   POST /detokenize            {"ids"|"tokens": [int]} -> {"text"}
// Errors are OpenAI bodies {"error": {"message", "type", "param", "code"}}: 400 malformed JSON,
// invalid field (param names it) or prompt too long (code "context_length_exceeded"), 401 bad or
// missing `Authorization: Bearer` key when keys are configured (/health and /ready stay open),
// 404 unknown model or route, 413 body over max_body_bytes, 503 engine overloaded or not ready
// (with Retry-After), 500 engine error. No input crashes the process: every handler is wrapped.
//
// Streaming: a client that disconnects mid-stream is detected when a write fails (httplib's
// content provider / releaser) and its request's CancellationToken is signalled. Writes to a
// closed socket must not raise SIGPIPE: the process should ignore SIGPIPE (the server does not
// change signal dispositions itself).
//
// Threading: Start() and Stop() from one owner thread; requests run on httplib's thread pool,
// one blocking thread per in-flight request (a streaming request holds its thread until done).
// The tokenizer and engine are not owned and must outlive the server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/engine.h"
#include "coordinator/tokenizer.h"

namespace httplib {
class Server;
}

namespace ss {

struct GatewayConfig {
  std::string model_name = "deepseek-v4";
  std::vector<std::string> api_keys;       // empty: no authentication
  int32_t max_context_tokens = 65536;      // prompt + max_tokens must fit
  size_t max_body_bytes = 8u << 20;        // larger bodies get 413
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
