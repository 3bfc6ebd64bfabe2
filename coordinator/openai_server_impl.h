// PRIVATE to the gateway: the definition of OpenAiServer::Impl, shared by the source files that
// implement OpenAiServer and included by nothing else (not by tests, not by other libraries; the
// interface is openai_server.h). Its names carry no compatibility promise.
//
// What each source file defines:
//   openai_server.cc             construction, the httplib hooks (request ids, CORS, methods, API
//                                keys, reading POST bodies, error bodies, access log), the routes,
//                                Start and Stop
//   openai_server_jobs.cc        chat completions, completions, /v1/messages and /v1/responses
//                                requests validated into a Job
//   openai_server_endpoints.cc   /tokenize, /detokenize, /ping, /version, /load, /v1/models,
//                                /metrics
//   response_generation.cc       a Job's choices on the engine (submit, poll, finish) and its whole
//                                (non-streaming) response
//   response_stream.cc           a Job's response as server-sent events
//
// Threading: the route handlers and everything they call run on connection threads, many at once;
// the members set at construction (config, tokenizer, engine, structured, registry, gm, cors,
// deadline) are read-only afterwards, and the others are thread-safe (atomic, AccessLog,
// ResponseStore) or owned by one request (Job, Choice, StreamState). Ownership: the tokenizer, the
// engine and a GatewayConfig::metrics registry are not owned (they outlive the server); a stream's
// StreamState is shared by httplib's content provider and releaser and dies with the response.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"
#include "coordinator/access_log.h"
#include "coordinator/completion_parser.h"
#include "coordinator/connection_socket.h"
#include "coordinator/cors.h"
#include "coordinator/dsv4_format.h"
#include "coordinator/engine.h"
#include "coordinator/gateway_metrics.h"
#include "coordinator/openai_request.h"
#include "coordinator/openai_server.h"
#include "coordinator/output_text.h"
#include "coordinator/receive_deadline.h"
#include "coordinator/responses_api.h"
#include "coordinator/stats_log.h"
#include "coordinator/structured_output.h"
#include "coordinator/tokenizer.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace ss {

// Constants and helpers of the gateway's source files (defined in openai_server.cc).
namespace gateway {

// How often a request waiting for the engine polls its choices and its client's socket.
inline constexpr auto kPollInterval = std::chrono::milliseconds(50);
inline constexpr char kRequestIdHeader[] = "X-Request-Id";
// Status of a non-streaming request whose client went away (nginx's "client closed request"):
// nobody reads the response; it is not counted in http_request_errors_total.
inline constexpr int kClientClosed = 499;

// The connection a request came on (connection_socket.h, receive_deadline.h).
ConnectionEndpoints Endpoints(const httplib::Request& req);
// A 200 with `j` as its JSON body.
void SendJson(httplib::Response& res, const openai::Json& j);
// Now, in seconds since the epoch ("created" fields).
int64_t NowSeconds();

}  // namespace gateway

struct OpenAiServer::Impl {
  using Clock = std::chrono::steady_clock;
  using Json = openai::Json;
  // A route handler: renders a response, or returns the error to render (writing nothing).
  using Handler = absl::Status (Impl::*)(const httplib::Request&, httplib::Response&);

  static constexpr size_t kStoredResponses = 1024;

  GatewayConfig config;
  const Tokenizer* tokenizer;
  GenerationEngine* engine;
  std::unique_ptr<openai::StructuredOutput> structured;
  std::atomic<uint64_t> next_request_id{0};
  const std::array<uint64_t, 2> request_id_salt = RandomSalt();
  std::unique_ptr<ReceiveDeadline> deadline;
  std::unique_ptr<metrics::Metrics> owned_metrics;  // when config.metrics is null
  metrics::Metrics* registry = nullptr;
  std::unique_ptr<GatewayMetrics> gm;
  AccessLog access;
  CorsPolicy cors;
  std::unique_ptr<StatsLogger> stats_log;
  responses::ResponseStore response_store{kStoredResponses, size_t{256} << 20};

  enum class Kind { kChat, kCompletion };

  // One prompt of a request: /v1/completions takes a batch of them (vLLM's list of prompts),
  // every other route one.
  struct Prompt {
    std::vector<int32_t> tokens;
    std::string echo;        // completions' echo: the prompt's text, returned first
    int32_t max_tokens = 0;  // the request's max_tokens, or what the context leaves (FitContext)
  };

  // A request that passed validation, ready to submit.
  struct Job {
    Kind kind;
    chat::ThinkingMode mode = chat::ThinkingMode::kChat;
    // How the output is parsed: starting in the reasoning (thinking mode) or in the content (chat
    // mode, or continuing a final assistant message), with or without tool calls.
    chat::ThinkingMode parse_mode = chat::ThinkingMode::kChat;
    bool parse_tool_calls = true;
    bool parallel_tool_calls = true;                  // false: only the first tool call is returned
    std::optional<openai::RequestedGrammar> grammar;  // structured output (structured_output.h)
    std::shared_ptr<TokenConstraint> constraint;      // its constraint, made by Constrain
    bool anthropic = false;  // /v1/messages: rendered as Anthropic's message or events
    // /v1/responses: rendered as a response object or its events; its conversation (messages,
    // then the reply) is stored under its id unless `store` is false.
    std::optional<responses::ResponseMeta> response;
    Json conversation;
    bool store = true;
    std::vector<Prompt> prompts;  // at least one; n choices each, prompt p's are p*n .. p*n+n-1
    openai::GenerationParams params;
    std::string id;
    Clock::time_point arrival;

    size_t PromptTokens() const {  // usage's prompt_tokens: every prompt once
      size_t n = 0;
      for (const Prompt& p : prompts) n += p.tokens.size();
      return n;
    }
  };

  // One choice of a request: its own engine sequence (n > 1: several per prompt, seeds seed + its
  // place among its prompt's choices).
  struct Choice {
    int index = 0;
    size_t prompt = 0;  // its prompt in Job::prompts
    size_t leader = 0;  // the first choice of its prompt: its first event releases `pending`
    std::shared_ptr<GenerationStream> stream;
    std::shared_ptr<CancellationToken> cancel;
    std::unique_ptr<OutputText> output;
    std::unique_ptr<chat::CompletionStreamParser> parser;  // streaming chat
    OutputText::Piece all;                                 // non-streaming: everything released
    FinishReason finish = FinishReason::kNone;
    std::string error;
    size_t tool_calls = 0;      // streamed so far
    bool started = false;       // a chunk was streamed
    int64_t cached_tokens = 0;  // the engine's prefix-cache hit for this choice
    // Not submitted yet (GatewayConfig::share_prompt_prefill): no stream until SubmitPending.
    std::optional<GenerationRequest> pending;
  };

  // Per-stream state shared by httplib's content provider and releaser (response_stream.cc).
  struct StreamState;

  // ---- openai_server.cc: the server's plumbing ----

  StatsSample Stats() const;
  // A fresh id: 32 hex digits, distinct for every request of this process (a bijective mix of a
  // counter) and, with a 128-bit random salt per process, across restarts and replicas.
  std::string NewRequestId();
  static std::array<uint64_t, 2> RandomSalt();
  // A 500 for the client: a generic message naming the request id; `detail` (engine errors,
  // worker names, anything internal) goes to the log only.
  static absl::Status ServerError(const httplib::Response& res, const std::string& what,
                                  const std::string& detail);
  // Runs a handler and renders the error it returns (a handler that fails writes nothing).
  void Guard(const httplib::Request& req, httplib::Response& res, Handler fn);
  bool Authorized(const httplib::Request& req) const;
  void LogAccess(const httplib::Request& req, const httplib::Response& res);
  // httplib's hooks and routes, installed once by the constructor.
  void Install(httplib::Server& s);
  httplib::Server::HandlerResponse PreRoute(const httplib::Request& req, httplib::Response& res);
  void Responded(const httplib::Request& req, const httplib::Response& res);
  void ServeGet(Handler fn, const httplib::Request& req, httplib::Response& res);
  void ServePost(Handler fn, const httplib::Request& req, httplib::Response& res,
                 const httplib::ContentReader& reader);

  // ---- openai_server_jobs.cc: generation requests -> Job ----

  absl::Status HandleChat(const httplib::Request& req, httplib::Response& res);
  // POST /v1/messages (anthropic_api.h): the request as a chat request, answered in Anthropic's
  // shapes.
  absl::Status HandleMessages(const httplib::Request& req, httplib::Response& res);
  // POST /v1/responses (responses_api.h).
  absl::Status HandleResponses(const httplib::Request& req, httplib::Response& res);
  absl::Status HandleCompletion(const httplib::Request& req, httplib::Response& res);
  absl::Status PrepareChat(Json& body, Job& job);
  absl::Status CheckModel(const Json& body);
  // Special tokens written in `text` become their ids, except inside `plain_text`.
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text, const char* param,
                                              Tokenizer::PlainText plain_text = {});
  // Fills each prompt's max_tokens (and sampling.max_tokens, the largest) and rejects a prompt
  // that cannot fit the context.
  absl::Status FitContext(Job& job, const char* param);
  // /v1/completions' `prompt`: a string, an array of token ids, or a batch of either (an array
  // of strings or of token-id arrays), each with its echo text when `echo`.
  absl::StatusOr<std::vector<Prompt>> CompletionPrompts(const Json& prompt, bool echo);
  // Moves `messages` and `tools` out of `body` (no copy of the request's largest parts). Sets the
  // job's thinking mode and how its output is parsed.
  absl::StatusOr<std::vector<int32_t>> ChatPrompt(Json& body, Job* job);
  // logit_bias ids the tokenizer does not know are a 400 here, not a failed generation.
  absl::Status CheckLogitBias(const openai::GenerationParams& params) const;
  // Logs the request's ignored fields (IgnoredFields) once and names them in X-Ignored-Fields:
  // at most 16, each cut to 64 bytes of [A-Za-z0-9_.-] (anything else becomes '?'), so a key can
  // never inject a header.
  static void ReportIgnoredFields(const std::vector<std::string>& ignored, httplib::Response& res);
  // The job's constraint from its grammar (none without one); the sampling fields that would
  // keep the grammar from ending are refused with it.
  absl::Status Constrain(Job& job);

  // ---- openai_server_endpoints.cc: the routes that generate nothing ----

  // vLLM's shapes: {"prompt"} or {"messages", chat template controls} -> {"count",
  // "max_model_len", "tokens", "token_strs"}; {"tokens"} -> {"prompt"}.
  absl::Status HandleTokenize(const httplib::Request& req, httplib::Response& res);
  absl::Status HandleDetokenize(const httplib::Request& req, httplib::Response& res);
  absl::Status HandlePing(const httplib::Request&, httplib::Response& res);
  absl::Status HandleVersion(const httplib::Request&, httplib::Response& res);
  absl::Status HandleLoad(const httplib::Request&, httplib::Response& res);
  absl::Status HandleModels(const httplib::Request&, httplib::Response& res);
  absl::Status HandleMetrics(const httplib::Request&, httplib::Response& res);

  // ---- response_generation.cc: a Job on the engine, and its whole response ----

  // Submits the job and answers it: a whole response, or a stream (Stream) when it asks for one.
  // Returns an error only before anything was written (a refusal, a failed generation).
  absl::Status Run(Job job, const httplib::Request& req, httplib::Response& res);
  // Submits the job's n choices for each prompt (with share_prompt_prefill and no penalties --
  // which need the whole prompt on the workers, so such a request never resumes from the cache
  // -- only each prompt's first choice; the others wait in `pending`); on a refusal cancels
  // those already accepted.
  absl::StatusOr<std::vector<Choice>> Submit(const Job& job, const httplib::Response& res);
  // Submits a pending choice once its leader has had an event; a choice the engine refuses now
  // fails with the reason (and with it the request).
  void SubmitPending(std::vector<Choice>& choices);
  // One engine event of `c` through its output: returns the text and logprobs it releases and
  // sets c.finish once the choice is over. A stop string ends it with kStop (whatever the engine
  // says) and cancels the engine's sequence, which frees its KV.
  static OutputText::Piece Consume(Choice& c, const GenerationEvent& ev);
  // The request's outcome once every choice is over (kNone before): an error or a cancel of any
  // choice, else the first choice's reason.
  static FinishReason Outcome(const std::vector<Choice>& choices);
  // Polls every unfinished choice once (waiting up to kPollInterval in all); `on_piece` gets
  // each released piece and returns whether to go on. Returns whether any event arrived.
  static bool Poll(std::vector<Choice>& choices, RequestTimer& timer,
                   absl::FunctionRef<bool(Choice&, OutputText::Piece)> on_piece);
  // A choice that failed (an engine error or a cancel), or null.
  static const Choice* Failed(const std::vector<Choice>& choices);
  static void CancelAll(std::vector<Choice>& choices);
  // The prompts' tokens served from the prefix cache: for each prompt the best of its choices
  // (usage counts a prompt once, whatever n).
  static size_t CachedTokens(const std::vector<Choice>& choices);
  static size_t GeneratedTokens(const std::vector<Choice>& choices);
  // A finished choice of a non-streaming response.
  Json ChoiceJson(const Job& job, const Choice& c) const;
  static std::string CallId(const Job& job, const Choice& c, size_t i);
  // Stores a /v1/responses conversation with its reply (unless the job says not to).
  void StoreResponse(const Job& job, const Json& completion);
  void RecordAccess(const httplib::Response& res, const Job& job, const RequestTimer& timer);

  // ---- response_stream.cc: a Job's response as server-sent events ----

  // Hands the response to httplib as a chunked event stream that polls `choices` until done; a
  // client that goes away cancels them.
  void Stream(Job job, std::vector<Choice> choices, std::unique_ptr<RequestTimer> timer,
              httplib::Response& res);

 private:
  // response_generation.cc: the parts of Run.
  absl::StatusOr<GenerationRequest> ChoiceRequest(const Job& job, const Choice& c,
                                                  size_t count) const;
  absl::Status Refusal(const SubmitOutcome& out, const Job& job,
                       const httplib::Response& res) const;
  bool AwaitChoices(std::vector<Choice>& choices, RequestTimer& timer, const httplib::Request& req);
  absl::Status Respond(const Job& job, std::vector<Choice>& choices, RequestTimer& timer,
                       httplib::Response& res);

  // response_stream.cc: the parts of Stream.
  Json ChunkBase(const StreamState& st) const;
  static bool Write(StreamState& st, httplib::DataSink& sink, const Json& chunk);
  static bool WriteDone(StreamState& st, httplib::DataSink& sink);
  static bool WriteText(httplib::DataSink& sink, const std::string& text);
  static bool WriteEvent(httplib::DataSink& sink, const std::string& data);
  bool WriteDelta(StreamState& st, Choice& ch, httplib::DataSink& sink,
                  const chat::CompletionDelta& d, const std::string& text, const char* finish,
                  const std::vector<OutputLogprob>& logprobs = {});
  bool EmitText(StreamState& st, Choice& ch, httplib::DataSink& sink,
                const OutputText::Piece& piece, bool final);
  bool EmitPiece(StreamState& st, Choice& ch, httplib::DataSink& sink,
                 const OutputText::Piece& piece);
  bool Provide(StreamState& st, httplib::DataSink& sink);
  bool Fail(StreamState& st, const Choice& ch, httplib::DataSink& sink);
};

}  // namespace ss
