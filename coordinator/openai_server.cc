#include "coordinator/openai_server.h"

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "common/status.h"
#include "coordinator/access_log.h"
#include "coordinator/anthropic_api.h"
#include "coordinator/chat_encoding.h"
#include "coordinator/completion_parser.h"
#include "coordinator/connection_pool.h"
#include "coordinator/connection_socket.h"
#include "coordinator/cors.h"
#include "coordinator/openai_render.h"
#include "coordinator/openai_request.h"
#include "coordinator/output_text.h"
#include "coordinator/receive_deadline.h"
#include "coordinator/responses_api.h"
#include "coordinator/stats_log.h"
#include "coordinator/structured_output.h"
#include "coordinator/utf8.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

using chat::ThinkingMode;
using openai::ApiError;
using openai::ApiStatus;
using openai::ChatLogprobs;
using openai::CompletionLogprobs;
using openai::Dump;
using openai::ErrorBody;
using openai::Field;
using openai::GenerationParams;
using openai::GetBool;
using openai::GetInt;
using openai::GetString;
using openai::Invalid;
using openai::Json;
using openai::ParseBody;
using openai::ParseGenerationParams;
using openai::ParseTemplateControls;
using openai::ParseThinking;
using openai::ParseToolChoice;
using openai::ToApiError;
using openai::ToolCallJson;
using openai::ToolChoice;
using openai::TypeName;
using openai::UsageJson;

constexpr auto kPollInterval = std::chrono::milliseconds(50);
// A connection waiting for a request's headers may have received this much beyond a maximal body
// (which a client may send right behind them) before it is dropped (receive_deadline.h).
constexpr uint64_t kHeadBytesAllowance = 1u << 20;

using Clock = std::chrono::steady_clock;

// Routes answered in Anthropic's shapes (errors included).
bool IsAnthropic(const httplib::Request& req) { return req.path == "/v1/messages"; }

// The error's body in the shape of the request's API.
std::string ErrorText(const httplib::Request& req, const ApiError& e) {
  return Dump(IsAnthropic(req) ? anthropic::ErrorBody(e.status, e.message) : ErrorBody(e));
}

void SendError(httplib::Response& res, const ApiError& e, const std::string& body) {
  res.status = e.status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  res.set_content(body, "application/json");
}
void SendError(httplib::Response& res, const ApiError& e) { SendError(res, e, Dump(ErrorBody(e))); }

ConnectionEndpoints Endpoints(const httplib::Request& req) {
  return ConnectionEndpoints{req.local_port, req.remote_addr, req.remote_port};
}

bool HasBody(const httplib::Request& req) {
  return req.has_header("Transfer-Encoding") ||
         (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
}

// Answers with `e` and then closes the connection, for a request whose body was not read (or not
// all of it): httplib would otherwise parse the rest of the body as the next request. A chunked
// provider that finishes the response and then returns false makes httplib drop the connection;
// before that, what the client still sends is discarded for a while (up to 16 MiB or 1 s, when
// the request carries a body), so that the close does not reset the connection under the
// response.
void SendErrorAndClose(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_header("Connection", "close");
  auto body = std::make_shared<std::string>(ErrorText(req, e));
  res.set_chunked_content_provider(
      "application/json",
      [body, ep = Endpoints(req), linger = HasBody(req)](size_t, httplib::DataSink& sink) {
        sink.write(body->data(), body->size());
        sink.done();
        if (const int fd = linger ? FindConnectionSocket(ep) : -1; fd >= 0) {
          LingeringShutdown(fd, size_t{16} << 20, std::chrono::seconds(1));
        }
        return false;
      });
}

constexpr char kRequestIdHeader[] = "X-Request-Id";

// A client's X-Request-Id is used when it is 1..128 characters of [A-Za-z0-9._:-] (it goes into
// the log); otherwise the gateway makes one.
bool UsableRequestId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

// Status of a non-streaming request whose client went away (nginx's "client closed request"):
// nobody reads the response; it is not counted in http_request_errors_total.
constexpr int kClientClosed = 499;

void SendJson(httplib::Response& res, const Json& j) {
  res.status = 200;
  res.set_content(Dump(j), "application/json");
}

// Health probes and scrapes: open without a key, not counted as errors, logged at debug level.
bool IsProbe(const std::string& path) {
  return path == "/health" || path == "/ready" || path == "/metrics" || path == "/ping";
}

int64_t NowSeconds() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

// ---------------------------------------------------------------------------------------------

struct OpenAiServer::Impl {
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
  static constexpr size_t kStoredResponses = 1024;
  responses::ResponseStore response_store{kStoredResponses, size_t{256} << 20};

  StatsSample Stats() const {
    StatsSample s;
    s.prompt_tokens = gm->prompt_tokens_total();
    s.generation_tokens = gm->generation_tokens_total();
    const EngineGauges g = config.engine_gauges ? config.engine_gauges() : EngineGauges{};
    s.running = g.running.value_or(gm->open_requests());
    s.waiting = g.waiting.value_or(0);
    s.kv_usage = g.kv_usage.value_or(0.0);
    s.prefix_queries = g.prefix_queries.value_or(0);
    s.prefix_hits = g.prefix_hits.value_or(0);
    return s;
  }

  enum class Kind { kChat, kCompletion };

  // A request that passed validation, ready to submit.
  struct Job {
    Kind kind;
    ThinkingMode mode = ThinkingMode::kChat;
    // How the output is parsed: starting in the reasoning (thinking mode) or in the content (chat
    // mode, or continuing a final assistant message), with or without tool calls.
    ThinkingMode parse_mode = ThinkingMode::kChat;
    bool parse_tool_calls = true;
    bool parallel_tool_calls = true;                  // false: only the first tool call is returned
    std::optional<openai::RequestedGrammar> grammar;  // structured output (structured_output.h)
    std::shared_ptr<TokenConstraint> constraint;      // its constraint, made by Constrain
    std::string echo;        // completions' echo: the prompt's text, returned first
    bool anthropic = false;  // /v1/messages: rendered as Anthropic's message or events
    // /v1/responses: rendered as a response object or its events; its conversation (messages,
    // then the reply) is stored under its id unless `store` is false.
    std::optional<responses::ResponseMeta> response;
    Json conversation;
    bool store = true;
    std::vector<int32_t> prompt;
    GenerationParams params;
    std::string id;
    Clock::time_point arrival;
  };

  absl::Status HandleMetrics(const httplib::Request&, httplib::Response& res) {
    gm->Scrape(config.engine_gauges ? config.engine_gauges() : EngineGauges{});
    res.status = 200;
    res.set_content(registry->Serialize(), "text/plain; version=0.0.4");
    return absl::OkStatus();
  }

  // A fresh id: 32 hex digits, distinct for every request of this process (a bijective mix of a
  // counter) and, with a 128-bit random salt per process, across restarts and replicas.
  std::string NewRequestId() {
    const uint64_t n = ++next_request_id;
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx",
                  static_cast<unsigned long long>(Mix(request_id_salt[0] + kGolden * n)),
                  static_cast<unsigned long long>(Mix(request_id_salt[1] + kGolden * n)));
    return buf;
  }
  static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  static uint64_t Mix(uint64_t z) {  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static std::array<uint64_t, 2> RandomSalt() {
    std::random_device rd;  // the kernel's entropy (getrandom)
    std::array<uint64_t, 2> salt{};
    for (uint64_t& s : salt) s = (uint64_t{rd()} << 32) ^ rd();
    return salt;
  }

  // A 500 for the client: a generic message naming the request id; `detail` (engine errors,
  // worker names, anything internal) goes to the log only.
  static absl::Status ServerError(const httplib::Response& res, const std::string& what,
                                  const std::string& detail) {
    const std::string id = res.get_header_value(kRequestIdHeader);
    spdlog::error("request {}: {}: {}", id, what, detail);
    return absl::InternalError(absl::StrCat(what, "; see the server log for request ", id));
  }

  // Runs a handler and renders the error it returns (a handler that fails writes nothing).
  template <typename F>
  void Guard(const httplib::Request& req, httplib::Response& res, F&& f) {
    if (absl::Status s = f(req, res); !s.ok()) {
      const ApiError e = ToApiError(s);
      SendError(res, e, ErrorText(req, e));
    }
  }

  absl::Status CheckModel(const Json& body) {
    const Json* m = Field(body, "model");
    if (!m) return Invalid("model", "model: required");
    if (!m->is_string()) {
      return Invalid("model", absl::StrCat("model: expected a string, got ", TypeName(*m)));
    }
    if (m->get_ref<const std::string&>() != config.model_name) {
      return ApiStatus(
          absl::StatusCode::kNotFound,
          absl::StrCat("The model `", m->get_ref<const std::string&>(), "` does not exist"),
          "model", "model_not_found");
    }
    return absl::OkStatus();
  }

  // Special tokens written in `text` become their ids, except inside `plain_text`.
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text, const char* param,
                                              Tokenizer::PlainText plain_text = {}) {
    auto ids = tokenizer->Encode(text, plain_text);
    if (!ids.ok()) return Invalid(param, ids.status().message());
    return ids;
  }

  // Fills sampling.max_tokens and rejects what cannot fit the context.
  absl::Status FitContext(Job& job, const char* param) {
    const int64_t prompt = static_cast<int64_t>(job.prompt.size());
    int64_t ctx = config.max_context_tokens;
    if (const int64_t kv = config.max_sequence_tokens ? config.max_sequence_tokens() : 0; kv > 0) {
      ctx = std::min(ctx, kv);  // the KV cache holds less than the model's context
    }
    int64_t want = job.params.max_tokens.value_or(ctx - prompt);
    // Anthropic's clients ask for a fixed max_tokens (Claude Code: 32,000) whatever the context:
    // /v1/messages lowers it to the context left instead of refusing the request.
    if (job.anthropic && prompt < ctx) want = std::min(want, ctx - prompt);
    if (prompt + want > ctx || want < 1) {
      return ApiStatus(
          absl::StatusCode::kInvalidArgument,
          absl::StrCat("This model's maximum context length is ", ctx,
                       " tokens. However, you requested ", prompt + std::max<int64_t>(want, 0),
                       " tokens (", prompt, " in the prompt, ", std::max<int64_t>(want, 0),
                       " for the completion)."),
          param, "context_length_exceeded");
    }
    if (job.params.sampling.min_tokens > want) {
      return Invalid("min_tokens", absl::StrCat("min_tokens (", job.params.sampling.min_tokens,
                                                ") must not exceed max_tokens (", want, ")"));
    }
    job.params.sampling.max_tokens = static_cast<int32_t>(want);
    return absl::OkStatus();
  }

  // Moves `messages` and `tools` out of `body` (no copy of the request's largest parts). Sets the
  // job's thinking mode and how its output is parsed.
  absl::StatusOr<std::vector<int32_t>> ChatPrompt(Json& body, Job* job) {
    if (!Field(body, "messages")) return Invalid("messages", "messages: required");
    Json msgs = std::move(body["messages"]);
    if (!msgs.is_array() || msgs.empty()) {
      return Invalid("messages", "messages: expected a non-empty array");
    }
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (!msgs[i].is_object()) {
        return Invalid("messages", absl::StrCat("messages[", i, "]: expected an object"));
      }
    }
    chat::EncodeOptions opts;
    RETURN_IF_ERROR(ParseThinking(body, &opts));
    RETURN_IF_ERROR(ParseTemplateControls(body, msgs, &opts));
    // Request-level tools / response_format go on the system message (prepended if missing).
    Json* tools = body.contains("tools") && !body["tools"].is_null() ? &body["tools"] : nullptr;
    if (tools && !tools->is_array()) return Invalid("tools", "tools: expected an array");
    const Json* rf = Field(body, "response_format");
    if (rf && !rf->is_object()) {
      return Invalid("response_format", "response_format: expected an object");
    }
    ASSIGN_OR_RETURN(const ToolChoice choice, ParseToolChoice(body, tools));
    ASSIGN_OR_RETURN(const std::optional<bool> parallel, GetBool(body, "parallel_tool_calls"));
    job->parallel_tool_calls = parallel.value_or(true);
    ASSIGN_OR_RETURN(job->grammar, structured->RequestGrammar(body, choice, tools));
    if (choice.kind == ToolChoice::kNone) tools = nullptr;  // not rendered, not parsed
    job->parse_tool_calls = choice.kind != ToolChoice::kNone;
    const bool text_format = rf && rf->value("type", Json("text")) == "text";
    if ((tools && !tools->empty()) || (rf && !text_format)) {
      if (msgs[0].value("role", Json("")) != "system") {
        Json sys = Json::object();
        sys["role"] = "system";
        sys["content"] = "";
        msgs.insert(msgs.begin(), std::move(sys));
      }
      if (tools && !tools->empty()) msgs[0]["tools"] = std::move(*tools);
      if (rf && !text_format) msgs[0]["response_format"] = *rf;
    }
    job->mode = opts.mode;
    job->parse_mode = opts.continue_final_message ? ThinkingMode::kChat : opts.mode;
    auto prompt = chat::EncodePrompt(msgs, opts);
    if (!prompt.ok()) return Invalid("messages", prompt.status().message());
    return Encode(prompt->text, "messages", prompt->content);  // message content is text
  }

  // logit_bias ids the tokenizer does not know are a 400 here, not a failed generation.
  absl::Status CheckLogitBias(const GenerationParams& params) const {
    for (const auto& [id, bias] : params.sampling.logit_bias) {
      if (id >= tokenizer->vocab_size()) {
        return Invalid("logit_bias",
                       absl::StrCat("logit_bias: token id ", id, " is outside the vocabulary [0, ",
                                    tokenizer->vocab_size(), ")"));
      }
    }
    return absl::OkStatus();
  }

  // Logs the request's ignored fields (IgnoredFields) once and names them in X-Ignored-Fields:
  // at most 16, each cut to 64 bytes of [A-Za-z0-9_.-] (anything else becomes '?'), so a key can
  // never inject a header.
  static void ReportIgnoredFields(const std::vector<std::string>& ignored, httplib::Response& res) {
    if (ignored.empty()) return;
    std::string list;
    for (size_t i = 0; i < ignored.size() && i < 16; ++i) {
      if (i > 0) list += ", ";
      for (const char c : ignored[i].substr(0, 64)) {
        list +=
            absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-'
                ? c
                : '?';
      }
    }
    if (ignored.size() > 16) absl::StrAppend(&list, ", and ", ignored.size() - 16, " more");
    spdlog::warn("request {}: fields present in the request but ignored: {}",
                 res.get_header_value(kRequestIdHeader), list);
    res.set_header("X-Ignored-Fields", list);
  }

  // The job's constraint from its grammar (none without one); the sampling fields that would
  // keep the grammar from ending are refused with it.
  absl::Status Constrain(Job& job) {
    if (!job.grammar) return absl::OkStatus();
    if (job.params.sampling.ignore_eos) {
      return Invalid("ignore_eos", absl::StrCat("ignore_eos: cannot be combined with ",
                                                job.grammar->param, " (structured output)"));
    }
    if (job.params.sampling.min_tokens > 0) {
      return Invalid("min_tokens", absl::StrCat("min_tokens: cannot be combined with ",
                                                job.grammar->param, " (structured output)"));
    }
    ASSIGN_OR_RETURN(job.constraint, structured->Constraint(
                                         *job.grammar, job.parse_mode == ThinkingMode::kThinking));
    return absl::OkStatus();
  }

  absl::Status HandleChat(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(Json body, ParseBody(req.body));
    RETURN_IF_ERROR(CheckModel(body));
    ReportIgnoredFields(openai::IgnoredFields(body, /*chat=*/true), res);
    Job job;
    job.arrival = Clock::now();
    job.id = absl::StrCat("chatcmpl-", NewRequestId());
    RETURN_IF_ERROR(PrepareChat(body, job));
    return Run(std::move(job), req, res);
  }

  // POST /v1/messages (anthropic_api.h): the request as a chat request, answered in Anthropic's
  // shapes.
  absl::Status HandleMessages(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(Json body, ParseBody(req.body));
    RETURN_IF_ERROR(CheckModel(body));
    ASSIGN_OR_RETURN(anthropic::ChatRequest chat, anthropic::ToChatRequest(body));
    ReportIgnoredFields(chat.ignored, res);
    Job job;
    job.arrival = Clock::now();
    job.id = absl::StrCat("msg_", NewRequestId());
    job.anthropic = true;
    RETURN_IF_ERROR(PrepareChat(chat.body, job));
    return Run(std::move(job), req, res);
  }

  // POST /v1/responses (responses_api.h).
  absl::Status HandleResponses(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(Json body, ParseBody(req.body));
    RETURN_IF_ERROR(CheckModel(body));
    Json previous;
    if (const Json* prev = Field(body, "previous_response_id"); prev && !prev->is_null()) {
      if (!prev->is_string()) {
        return Invalid("previous_response_id", "previous_response_id: expected a string");
      }
      previous = response_store.Get(prev->get<std::string>());
      if (previous.is_null()) {
        return ApiStatus(absl::StatusCode::kNotFound,
                         absl::StrCat("Previous response with id '", prev->get<std::string>(),
                                      "' not found (responses are kept in memory, ",
                                      kStoredResponses, " at most, and not across restarts)"),
                         "previous_response_id", "previous_response_not_found");
      }
    }
    ASSIGN_OR_RETURN(responses::ChatRequest chat,
                     responses::ToChatRequest(body, previous.is_null() ? nullptr : &previous));
    ReportIgnoredFields(chat.ignored, res);
    Job job;
    job.arrival = Clock::now();
    job.id = absl::StrCat("resp_", NewRequestId());
    ASSIGN_OR_RETURN(std::optional<bool> store, GetBool(body, "store"));
    job.store = store.value_or(true);
    if (job.store) job.conversation = chat.body["messages"];
    Json echo = Json::object();
    for (const char* k : {"instructions", "max_output_tokens", "parallel_tool_calls",
                          "previous_response_id", "reasoning", "store", "temperature", "text",
                          "tool_choice", "tools", "top_p", "user", "metadata"}) {
      if (body.contains(k)) echo[k] = std::move(body[k]);
    }
    job.response =
        responses::ResponseMeta{job.id, NowSeconds(), config.model_name, std::move(echo)};
    RETURN_IF_ERROR(PrepareChat(chat.body, job));
    return Run(std::move(job), req, res);
  }

  void StoreResponse(const Job& job, const Json& completion) {
    if (!job.store) return;
    Json conversation = job.conversation;
    conversation.push_back(responses::AssistantMessage(completion));
    response_store.Put(job.id, std::move(conversation));
  }

  absl::Status PrepareChat(Json& body, Job& job) {
    job.kind = Kind::kChat;
    ASSIGN_OR_RETURN(job.params, ParseGenerationParams(body, /*chat=*/true));
    RETURN_IF_ERROR(CheckLogitBias(job.params));
    ASSIGN_OR_RETURN(job.prompt, ChatPrompt(body, &job));
    RETURN_IF_ERROR(Constrain(job));
    return FitContext(job, "messages");
  }

  absl::Status HandleCompletion(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(Json body, ParseBody(req.body));
    RETURN_IF_ERROR(CheckModel(body));
    Job job;
    job.arrival = Clock::now();
    job.kind = Kind::kCompletion;
    ReportIgnoredFields(openai::IgnoredFields(body, /*chat=*/false), res);
    ASSIGN_OR_RETURN(job.params, ParseGenerationParams(body, /*chat=*/false));
    RETURN_IF_ERROR(CheckLogitBias(job.params));
    const Json* prompt = Field(body, "prompt");
    if (!prompt) return Invalid("prompt", "prompt: required");
    if (prompt->is_string()) {
      ASSIGN_OR_RETURN(job.prompt, Encode(prompt->get_ref<const std::string&>(), "prompt"));
    } else if (prompt->is_array() && !prompt->empty()) {
      for (const auto& id : *prompt) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= tokenizer->vocab_size()) {
          return Invalid("prompt", "prompt: expected a string or an array of token ids");
        }
        job.prompt.push_back(id.get<int32_t>());
      }
    } else {
      return Invalid("prompt", "prompt: expected a string or an array of token ids");
    }
    if (job.prompt.empty()) return Invalid("prompt", "prompt: must not be empty");
    ASSIGN_OR_RETURN(const bool echo, openai::ParseEcho(body, job.params));
    if (echo) {
      auto text = tokenizer->Decode(job.prompt);
      if (!text.ok()) return Invalid("prompt", text.status().message());
      job.echo = prompt->is_string() ? prompt->get<std::string>() : *std::move(text);
    }
    ASSIGN_OR_RETURN(job.grammar, structured->RequestGrammar(body, ToolChoice{}, nullptr));
    RETURN_IF_ERROR(Constrain(job));
    job.id = absl::StrCat("cmpl-", NewRequestId());
    RETURN_IF_ERROR(FitContext(job, "prompt"));
    return Run(std::move(job), req, res);
  }

  // One choice of a request: its own engine sequence (n > 1: several, seeds seed + index).
  struct Choice {
    int index = 0;
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

  // Submits the job's n choices (with share_prompt_prefill and no penalties -- which need the
  // whole prompt on the workers, so such a request never resumes from the cache -- only choice
  // 0; the others wait in `pending`); on a refusal cancels those already accepted.
  absl::StatusOr<std::vector<Choice>> Submit(const Job& job, const httplib::Response& res) {
    std::vector<Choice> choices(static_cast<size_t>(job.params.n));
    const SamplingParams& sp = job.params.sampling;
    const bool defer = config.share_prompt_prefill && choices.size() > 1 &&
                       sp.frequency_penalty == 0.0f && sp.presence_penalty == 0.0f &&
                       sp.repetition_penalty == 1.0f;
    for (size_t i = 0; i < choices.size(); ++i) {
      Choice& c = choices[i];
      c.index = static_cast<int>(i);
      c.cancel = std::make_shared<CancellationToken>();
      c.output = std::make_unique<OutputText>(*tokenizer, job.params.stop,
                                              job.params.include_stop_str_in_output,
                                              static_cast<size_t>(job.params.sampling.min_tokens));
      c.parser =
          std::make_unique<chat::CompletionStreamParser>(job.parse_mode, job.parse_tool_calls);
      GenerationRequest gr;
      gr.request_id = choices.size() == 1 ? job.id : absl::StrCat(job.id, "-", i);
      gr.prompt = job.prompt;
      gr.sampling = job.params.sampling;
      if (gr.sampling.seed) *gr.sampling.seed += i;
      gr.cancel = c.cancel;
      gr.constraint = job.constraint;
      if (i > 0 && job.grammar) {
        ASSIGN_OR_RETURN(
            gr.constraint,
            structured->Constraint(*job.grammar, job.parse_mode == ThinkingMode::kThinking));
      }
      if (defer && i > 0) {
        c.pending = std::move(gr);
        continue;
      }
      SubmitOutcome out = engine->Submit(std::move(gr));
      absl::Status refused;
      switch (out.status) {
        case SubmitStatus::kAccepted:
          if (!out.stream) {
            refused = ServerError(res, "internal error",
                                  "the engine accepted the request without a stream");
          }
          c.stream = std::move(out.stream);
          break;
        case SubmitStatus::kOverloaded:
          refused =
              ApiStatus(absl::StatusCode::kUnavailable, "The server is overloaded; retry later", "",
                        "overloaded", std::max(1, out.retry_after_s));
          break;
        case SubmitStatus::kNotReady:
          refused =
              ApiStatus(absl::StatusCode::kUnavailable, "The model is not ready yet; retry later",
                        "", "not_ready", std::max(1, out.retry_after_s));
          break;
        case SubmitStatus::kRejected:
          refused =
              ApiStatus(absl::StatusCode::kInvalidArgument, out.error,
                        job.kind == Kind::kChat ? "messages" : "prompt", "context_length_exceeded");
          break;
      }
      if (!refused.ok()) {
        for (size_t k = 0; k < i; ++k) choices[k].cancel->Cancel();
        return refused;
      }
    }
    return choices;
  }

  // Submits the pending choices once choice 0 has had an event; a choice the engine refuses now
  // fails with the reason (and with it the request).
  void SubmitPending(std::vector<Choice>& choices) {
    const Choice& first = choices[0];
    if (first.output->tokens() == 0 && first.finish == FinishReason::kNone) return;
    for (Choice& c : choices) {
      if (!c.pending) continue;
      SubmitOutcome out = engine->Submit(*std::move(c.pending));
      c.pending.reset();
      if (out.status == SubmitStatus::kAccepted && out.stream) {
        c.stream = std::move(out.stream);
        continue;
      }
      c.finish = FinishReason::kError;
      c.error = out.status == SubmitStatus::kOverloaded ? "the server is overloaded; retry later"
                : out.status == SubmitStatus::kRejected ? out.error
                                                        : "the model is not ready; retry later";
    }
  }

  // One engine event of `c` through its output: returns the text and logprobs it releases and
  // sets c.finish once the choice is over. A stop string ends it with kStop (whatever the engine
  // says) and cancels the engine's sequence, which frees its KV.
  static OutputText::Piece Consume(Choice& c, const GenerationEvent& ev) {
    OutputText::Piece piece = c.output->Add(ev.tokens, ev.logprobs);
    if (!c.output->stopped() && ev.finish != FinishReason::kNone) {
      piece.Append(c.output->Finish());
    }
    c.finish = ev.finish;
    c.error = ev.error;
    if (c.output->stopped()) {
      c.finish = FinishReason::kStop;
      c.cancel->Cancel();
    }
    return piece;
  }

  // The request's outcome once every choice is over (kNone before): an error or a cancel of any
  // choice, else the first choice's reason.
  static FinishReason Outcome(const std::vector<Choice>& choices) {
    for (const Choice& c : choices) {
      if (c.finish == FinishReason::kNone) return FinishReason::kNone;
    }
    for (const Choice& c : choices) {
      if (c.finish == FinishReason::kError || c.finish == FinishReason::kCancelled) return c.finish;
    }
    return choices[0].finish;
  }

  // Polls every unfinished choice once (waiting up to kPollInterval in all); `on_piece` gets
  // each released piece. Returns whether any event arrived.
  template <typename F>
  static bool Poll(std::vector<Choice>& choices, RequestTimer& timer, F&& on_piece) {
    const auto wait =
        std::max(std::chrono::milliseconds(1), kPollInterval / static_cast<int>(choices.size()));
    bool any = false;
    for (Choice& c : choices) {
      if (c.finish != FinishReason::kNone || !c.stream) continue;
      auto ev = c.stream->Next(wait);
      if (!ev) continue;
      any = true;
      c.cached_tokens = ev->cached_tokens;
      const size_t before = c.output->tokens();
      OutputText::Piece piece = Consume(c, *ev);
      timer.Event(c.output->tokens() - before, Outcome(choices), ev->scheduled, ev->cached_tokens);
      if (!on_piece(c, std::move(piece))) return any;
    }
    return any;
  }

  // A choice that failed (an engine error or a cancel), or null.
  static const Choice* Failed(const std::vector<Choice>& choices) {
    for (const Choice& c : choices) {
      if (c.finish == FinishReason::kError || c.finish == FinishReason::kCancelled) return &c;
    }
    return nullptr;
  }

  static void CancelAll(std::vector<Choice>& choices) {
    for (Choice& c : choices) c.cancel->Cancel();
  }

  // The prompt's tokens served from the prefix cache: the best of the choices (the prompt is
  // counted once in usage).
  static size_t CachedTokens(const std::vector<Choice>& choices) {
    int64_t n = 0;
    for (const Choice& c : choices) n = std::max(n, c.cached_tokens);
    return static_cast<size_t>(n);
  }

  static size_t GeneratedTokens(const std::vector<Choice>& choices) {
    size_t n = 0;
    for (const Choice& c : choices) n += c.output->tokens();
    return n;
  }

  // A finished choice of a non-streaming response.
  Json ChoiceJson(const Job& job, const Choice& c) const {
    const bool logprobs = job.params.sampling.top_logprobs >= 0;
    Json choice = Json::object();
    choice["index"] = c.index;
    std::string reason = FinishReasonName(c.finish);
    if (job.kind == Kind::kChat) {
      chat::ParsedCompletion parsed =
          chat::ParseCompletion(c.all.text, job.parse_mode, job.parse_tool_calls);
      if (!job.parallel_tool_calls && parsed.tool_calls.size() > 1) parsed.tool_calls.resize(1);
      Json msg = Json::object();
      msg["role"] = "assistant";
      msg["content"] = parsed.content.empty() && !parsed.tool_calls.empty() ? Json(nullptr)
                                                                            : Json(parsed.content);
      if (job.mode == ThinkingMode::kThinking) msg["reasoning_content"] = parsed.reasoning_content;
      if (!parsed.tool_calls.empty()) {
        Json calls = Json::array();
        for (size_t i = 0; i < parsed.tool_calls.size(); ++i) {
          calls.push_back(ToolCallJson(parsed.tool_calls[i], CallId(job, c, i), i,
                                       /*with_index=*/false));
        }
        msg["tool_calls"] = std::move(calls);
        if (c.finish != FinishReason::kLength) reason = "tool_calls";
      }
      choice["message"] = std::move(msg);
      choice["logprobs"] = logprobs ? ChatLogprobs(*tokenizer, c.all.logprobs) : Json(nullptr);
    } else {
      choice["text"] = job.echo + c.all.text;
      choice["logprobs"] =
          logprobs ? CompletionLogprobs(*tokenizer, c.all.logprobs) : Json(nullptr);
    }
    choice["finish_reason"] = reason;
    choice["stop_reason"] = c.output->stopped() ? Json(c.output->stop_string()) : Json(nullptr);
    return choice;
  }

  static std::string CallId(const Job& job, const Choice& c, size_t i) {
    return c.index == 0 ? absl::StrCat("call_", job.id, "_", i)
                        : absl::StrCat("call_", job.id, "_", c.index, "_", i);
  }

  absl::Status Run(Job job, const httplib::Request& req, httplib::Response& res) {
    auto timer = std::make_unique<RequestTimer>(*gm, job.arrival);
    ASSIGN_OR_RETURN(std::vector<Choice> choices, Submit(job, res));
    timer->Accepted(job.prompt.size(), job.params.n, job.params.sampling.max_tokens,
                    job.params.stream);
    if (job.params.stream) {
      Stream(std::move(job), std::move(choices), std::move(timer), res);
      return absl::OkStatus();
    }
    // The client's socket, looked at every poll interval: one that hung up cancels the request.
    const int fd = FindConnectionSocket(Endpoints(req));
    auto next_check = Clock::now() + kPollInterval;
    while (Outcome(choices) == FinishReason::kNone && Failed(choices) == nullptr) {
      Poll(choices, *timer, [](Choice& c, OutputText::Piece piece) {
        c.all.Append(std::move(piece));
        return true;
      });
      SubmitPending(choices);
      if (const auto now = Clock::now(); now >= next_check) {
        next_check = now + kPollInterval;
        if (fd >= 0 && PeerClosed(fd)) {
          CancelAll(choices);
          timer->Abort();
          spdlog::info("request {} ({}): the client went away; cancelled",
                       res.get_header_value(kRequestIdHeader), job.id);
          res.status = kClientClosed;
          RecordAccess(res, job, *timer);
          return absl::OkStatus();
        }
      }
    }
    if (const Choice* failed = Failed(choices)) {
      CancelAll(choices);
      timer->Event(0, failed->finish);
      RecordAccess(res, job, *timer);
      return ServerError(
          res, "generation failed",
          absl::StrCat(job.id, ": ", failed->error.empty() ? "cancelled" : failed->error));
    }
    Json resp = Json::object();
    resp["id"] = job.id;
    resp["object"] = job.kind == Kind::kChat ? "chat.completion" : "text_completion";
    resp["created"] = NowSeconds();
    resp["model"] = config.model_name;
    resp["choices"] = Json::array();
    for (const Choice& c : choices) resp["choices"].push_back(ChoiceJson(job, c));
    resp["usage"] = UsageJson(job.prompt.size(), GeneratedTokens(choices), CachedTokens(choices));
    if (job.response) {
      StoreResponse(job, resp);
      SendJson(res, responses::ToResponse(resp, *job.response));
    } else {
      SendJson(res, job.anthropic ? anthropic::ToMessage(resp, job.id) : resp);
    }
    RecordAccess(res, job, *timer);
    return absl::OkStatus();
  }

  void RecordAccess(const httplib::Response& res, const Job& job, const RequestTimer& timer) {
    access.Record(&res, {res.get_header_value(kRequestIdHeader), job.id, timer.Summary()});
  }

  // Per-stream state shared by httplib's content provider and releaser.
  struct StreamState {
    Job job;
    std::string request_id;  // X-Request-Id
    std::vector<Choice> choices;
    std::unique_ptr<RequestTimer> timer;  // running until the response (and this) is destroyed
    bool finished = false;                // [DONE] was written
    bool logged = false;                  // its access record was made
    const void* response = nullptr;       // the access log's key
    int64_t created = 0;
    // /v1/messages and /v1/responses: their API's events (null: chat completions' own).
    std::unique_ptr<EventTranslator> events;
  };

  Json ChunkBase(const StreamState& st) const {
    Json c = Json::object();
    c["id"] = st.job.id;
    c["object"] = st.job.kind == Kind::kChat ? "chat.completion.chunk" : "text_completion";
    c["created"] = st.created;
    c["model"] = config.model_name;
    return c;
  }

  // One chunk to the client: an OpenAI `data:` event, or the route's API's events for it.
  static bool Write(StreamState& st, httplib::DataSink& sink, const Json& chunk) {
    if (!st.events) return WriteEvent(sink, Dump(chunk));
    return WriteText(sink, st.events->Chunk(chunk));
  }
  static bool WriteDone(StreamState& st, httplib::DataSink& sink) {
    if (!st.events) return WriteEvent(sink, "[DONE]");
    return WriteText(sink, st.events->Done());
  }
  static bool WriteText(httplib::DataSink& sink, const std::string& text) {
    return text.empty() || sink.write(text.data(), text.size());
  }

  static bool WriteEvent(httplib::DataSink& sink, const std::string& data) {
    std::string line = absl::StrCat("data: ", data, "\n\n");
    return sink.write(line.data(), line.size());
  }

  // One chunk of choice `ch` carrying `delta` (chat) or `text` (completions) and the logprobs of
  // the ids it completes (when requested); finish_reason null or given.
  bool WriteDelta(StreamState& st, Choice& ch, httplib::DataSink& sink,
                  const chat::CompletionDelta& d, const std::string& text, const char* finish,
                  const std::vector<OutputLogprob>& logprobs = {}) {
    const bool with_logprobs = st.job.params.sampling.top_logprobs >= 0 && !logprobs.empty();
    Json c = ChunkBase(st);
    Json choice = Json::object();
    choice["index"] = ch.index;
    if (st.job.kind == Kind::kChat) {
      Json delta = Json::object();
      if (!ch.started) delta["role"] = "assistant";
      if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
      if (!d.content.empty() || !ch.started) delta["content"] = d.content;
      size_t n_calls = d.tool_calls.size();
      if (!st.job.parallel_tool_calls) n_calls = std::min<size_t>(n_calls, ch.tool_calls == 0);
      if (n_calls > 0) {
        Json calls = Json::array();
        for (size_t k = 0; k < n_calls; ++k) {
          const size_t i = ch.tool_calls++;
          calls.push_back(
              ToolCallJson(d.tool_calls[k], CallId(st.job, ch, i), i, /*with_index=*/true));
        }
        delta["tool_calls"] = std::move(calls);
      }
      choice["delta"] = std::move(delta);
      choice["logprobs"] = with_logprobs ? ChatLogprobs(*tokenizer, logprobs) : Json(nullptr);
    } else {
      choice["text"] = text;
      choice["logprobs"] = with_logprobs ? CompletionLogprobs(*tokenizer, logprobs) : Json(nullptr);
    }
    choice["finish_reason"] = finish ? Json(finish) : Json(nullptr);
    if (finish) {
      choice["stop_reason"] = ch.output->stopped() ? Json(ch.output->stop_string()) : Json(nullptr);
    }
    c["choices"] = Json::array({std::move(choice)});
    ch.started = true;
    return Write(st, sink, c);
  }

  // Released text and logprobs -> one delta chunk (nothing written when it carries nothing).
  bool EmitText(StreamState& st, Choice& ch, httplib::DataSink& sink,
                const OutputText::Piece& piece, bool final) {
    const std::string& text = piece.text;
    if (st.job.kind == Kind::kCompletion) {
      if (text.empty() && piece.logprobs.empty()) return true;
      return WriteDelta(st, ch, sink, {}, text, nullptr, piece.logprobs);
    }
    chat::CompletionDelta d = ch.parser->Feed(text);
    if (final) {
      chat::CompletionDelta rest = ch.parser->Finish();
      d.reasoning_content += rest.reasoning_content;
      d.content += rest.content;
      for (auto& call : rest.tool_calls) d.tool_calls.push_back(std::move(call));
    }
    if (d.empty() && piece.logprobs.empty()) return true;
    return WriteDelta(st, ch, sink, d, "", nullptr, piece.logprobs);
  }

  // A piece of choice `ch` as chunks: its text, and once the choice is over its finish chunk.
  bool EmitPiece(StreamState& st, Choice& ch, httplib::DataSink& sink,
                 const OutputText::Piece& piece) {
    const bool over = ch.finish != FinishReason::kNone;
    if (!EmitText(st, ch, sink, piece, over)) return false;
    if (!over || ch.finish == FinishReason::kError || ch.finish == FinishReason::kCancelled) {
      return true;
    }
    std::string reason = FinishReasonName(ch.finish);
    if (ch.tool_calls > 0 && ch.finish != FinishReason::kLength) reason = "tool_calls";
    return WriteDelta(st, ch, sink, {}, "", reason.c_str());
  }

  // Called repeatedly by httplib until it returns false or calls sink.done().
  bool Provide(StreamState& st, httplib::DataSink& sink) {
    for (Choice& ch : st.choices) {
      if (!ch.started && st.job.kind == Kind::kChat) {
        if (!WriteDelta(st, ch, sink, {}, "", nullptr)) return false;  // the role chunk
      }
      if (!ch.started && !st.job.echo.empty()) {
        if (!WriteDelta(st, ch, sink, {}, st.job.echo, nullptr)) return false;
      }
    }
    bool written = true;
    const bool any = Poll(st.choices, *st.timer, [&](Choice& ch, OutputText::Piece piece) {
      written = EmitPiece(st, ch, sink, piece);
      return written;
    });
    if (!written) return false;
    SubmitPending(st.choices);
    if (!any) {
      for (const Choice& ch : st.choices) {
        if (ch.finish == FinishReason::kNone && ch.cancel->cancelled()) return false;
      }
    }
    if (const Choice* failed = Failed(st.choices)) return Fail(st, *failed, sink);  // at once
    if (Outcome(st.choices) == FinishReason::kNone) return true;
    if (st.job.params.include_usage) {
      Json c = ChunkBase(st);
      c["choices"] = Json::array();
      c["usage"] =
          UsageJson(st.job.prompt.size(), GeneratedTokens(st.choices), CachedTokens(st.choices));
      if (!Write(st, sink, c)) return false;
    }
    st.finished = true;
    if (!WriteDone(st, sink)) return false;
    sink.done();
    return true;
  }

  // Ends a stream whose choice `ch` failed: the others are cancelled, an error event, [DONE].
  bool Fail(StreamState& st, const Choice& ch, httplib::DataSink& sink) {
    CancelAll(st.choices);
    st.timer->Event(0, ch.finish);
    st.finished = true;
    spdlog::error("request {}: generation failed: {}: {}", st.request_id, st.job.id,
                  ch.error.empty() ? "cancelled" : ch.error);
    const ApiError e = ToApiError(absl::InternalError(
        absl::StrCat("generation failed; see the server log for request ", st.request_id)));
    if (st.events) {
      if (!WriteText(sink, st.events->Error(e.message))) return false;
    } else {
      if (!WriteEvent(sink, Dump(ErrorBody(e)))) return false;
      if (!WriteEvent(sink, "[DONE]")) return false;
    }
    sink.done();
    return true;
  }

  void Stream(Job job, std::vector<Choice> choices, std::unique_ptr<RequestTimer> timer,
              httplib::Response& res) {
    auto st = std::make_shared<StreamState>();
    st->timer = std::move(timer);
    st->job = std::move(job);
    st->choices = std::move(choices);
    st->created = NowSeconds();
    st->request_id = res.get_header_value(kRequestIdHeader);
    st->response = &res;
    if (st->job.response) {
      st->events = std::make_unique<responses::ResponseStream>(
          *st->job.response, [this, st = st.get()](const Json& c) { StoreResponse(st->job, c); });
    } else if (st->job.anthropic) {
      st->events = std::make_unique<anthropic::MessageStream>(st->job.id, config.model_name,
                                                              st->job.prompt.size());
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) {
          const bool more = Provide(*st, sink);
          if (!more) {
            CancelAll(st->choices);  // the client went away: stop generating
            st->timer->Abort();
          }
          if ((!more || st->finished) && !st->logged) {
            st->logged = true;
            access.Record(st->response, {st->request_id, st->job.id, st->timer->Summary()});
          }
          return more;
        },
        [st](bool) {
          if (st->finished) return;
          CancelAll(st->choices);  // the client went away (or the server stops)
          st->timer->Abort();
        });
  }

  // vLLM's shapes: {"prompt"} or {"messages", chat template controls} -> {"count",
  // "max_model_len", "tokens", "token_strs"}; {"tokens"} -> {"prompt"}.
  absl::Status HandleTokenize(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(Json body, ParseBody(req.body));
    if (const Json* m = Field(body, "model"); m) RETURN_IF_ERROR(CheckModel(body));
    ASSIGN_OR_RETURN(std::optional<bool> special, GetBool(body, "add_special_tokens"));
    if (special.value_or(false)) {
      return Invalid("add_special_tokens",
                     "add_special_tokens: true is not supported: a prompt is tokenized as given "
                     "(the completions endpoint adds no BOS either); the chat template adds its "
                     "own");
    }
    ASSIGN_OR_RETURN(std::optional<bool> strs, GetBool(body, "return_token_strs"));
    std::vector<int32_t> ids;
    if (Field(body, "messages")) {
      Job job;
      ASSIGN_OR_RETURN(ids, ChatPrompt(body, &job));
    } else {
      ASSIGN_OR_RETURN(std::optional<std::string> text, GetString(body, "prompt"));
      if (!text) {
        ASSIGN_OR_RETURN(text, GetString(body, "text"));
      }
      if (!text) return Invalid("prompt", "prompt: required (a string), or messages");
      ASSIGN_OR_RETURN(ids, Encode(*text, "prompt"));
    }
    Json resp = Json::object();
    resp["count"] = ids.size();
    resp["max_model_len"] = config.max_context_tokens;
    resp["tokens"] = ids;
    resp["token_strs"] = nullptr;
    if (strs.value_or(false)) {
      Json t = Json::array();
      for (const int32_t id : ids) t.push_back(openai::TokenString(*tokenizer, id));
      resp["token_strs"] = std::move(t);
    }
    SendJson(res, resp);
    return absl::OkStatus();
  }

  absl::Status HandleDetokenize(const httplib::Request& req, httplib::Response& res) {
    ASSIGN_OR_RETURN(Json body, ParseBody(req.body));
    if (const Json* m = Field(body, "model"); m) RETURN_IF_ERROR(CheckModel(body));
    const char* key = Field(body, "tokens") ? "tokens" : "ids";
    const Json* ids = Field(body, key);
    if (!ids) return Invalid("tokens", "tokens: required (an array of token ids)");
    if (!ids->is_array()) return Invalid(key, absl::StrCat(key, ": expected an array"));
    std::vector<int32_t> v;
    for (size_t i = 0; i < ids->size(); ++i) {
      const Json& id = (*ids)[i];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= tokenizer->vocab_size()) {
        return Invalid(key, absl::StrCat(key, "[", i, "]: not a token id"));
      }
      v.push_back(id.get<int32_t>());
    }
    auto text = tokenizer->Decode(v);
    if (!text.ok()) return Invalid(key, text.status().message());
    Json resp = Json::object();
    resp["prompt"] = *text;
    SendJson(res, resp);
    return absl::OkStatus();
  }

  absl::Status HandlePing(const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content("{}", "application/json");
    return absl::OkStatus();
  }

  absl::Status HandleVersion(const httplib::Request&, httplib::Response& res) {
    SendJson(res, Json{{"version", config.version}});
    return absl::OkStatus();
  }

  absl::Status HandleLoad(const httplib::Request&, httplib::Response& res) {
    SendJson(res, Json{{"server_load", gm->open_requests()}});
    return absl::OkStatus();
  }

  absl::Status HandleModels(const httplib::Request&, httplib::Response& res) {
    Json m = Json::object();
    m["id"] = config.model_name;
    m["object"] = "model";
    m["created"] = 0;
    m["owned_by"] = "splitserve";
    m["max_model_len"] = config.max_context_tokens;
    Json resp = Json::object();
    resp["object"] = "list";
    resp["data"] = Json::array({std::move(m)});
    SendJson(res, resp);
    return absl::OkStatus();
  }

  void LogAccess(const httplib::Request& req, const httplib::Response& res) {
    const std::string id = res.get_header_value(kRequestIdHeader);
    const std::optional<AccessRecord> record = access.Take(&res, id);
    const std::string line =
        AccessLine(absl::StrCat(req.remote_addr, ":", req.remote_port), req.method, req.path,
                   res.status, id, record ? &*record : nullptr);
    if (IsProbe(req.path)) {
      spdlog::debug("{}", line);
    } else {
      spdlog::info("{}", line);
    }
  }

  bool Authorized(const httplib::Request& req) const {
    if (config.api_keys.empty()) return true;
    // Anthropic's clients send the key as x-api-key.
    if (const std::string key = req.get_header_value("x-api-key"); !key.empty()) {
      for (const auto& k : config.api_keys) {
        if (k == key) return true;
      }
    }
    const std::string auth = req.get_header_value("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (auth.size() <= kBearer.size() || auth.compare(0, kBearer.size(), kBearer) != 0) {
      return false;
    }
    const std::string key = auth.substr(kBearer.size());
    for (const auto& k : config.api_keys) {
      if (k == key) return true;
    }
    return false;
  }
};

// ---------------------------------------------------------------------------------------------

OpenAiServer::OpenAiServer(GatewayConfig config, const Tokenizer& tokenizer,
                           GenerationEngine& engine)
    : impl_(std::make_unique<Impl>()), server_(std::make_unique<httplib::Server>()) {
  impl_->config = std::move(config);
  impl_->tokenizer = &tokenizer;
  impl_->engine = &engine;
  impl_->structured =
      std::make_unique<openai::StructuredOutput>(tokenizer, impl_->config.model_vocab_size);
  if (impl_->config.metrics == nullptr) {
    impl_->owned_metrics = std::make_unique<metrics::Metrics>();
    impl_->registry = impl_->owned_metrics.get();
  } else {
    impl_->registry = impl_->config.metrics;
  }
  impl_->cors = CorsPolicy{impl_->config.allowed_origins, impl_->config.allow_credentials,
                           impl_->config.allowed_methods, impl_->config.allowed_headers};
  impl_->gm = std::make_unique<GatewayMetrics>(*impl_->registry, impl_->config.model_name,
                                               impl_->config.max_context_tokens);
  impl_->deadline = std::make_unique<ReceiveDeadline>(
      std::chrono::milliseconds(std::max(1, impl_->config.head_timeout_ms)),
      std::chrono::milliseconds(std::max(1, impl_->config.body_timeout_ms)),
      impl_->config.max_body_bytes + kHeadBytesAllowance);
  Impl* impl = impl_.get();
  httplib::Server& s = *server_;
  s.set_payload_max_length(impl->config.max_body_bytes);
  s.set_keep_alive_timeout(std::max(1, impl->config.keep_alive_timeout_s));
  s.set_pre_routing_handler([impl](const httplib::Request& req, httplib::Response& res) {
    impl->deadline->HeadReceived(Endpoints(req));
    std::string id = req.get_header_value(kRequestIdHeader);
    res.set_header(kRequestIdHeader, UsableRequestId(id) ? id : impl->NewRequestId());
    if (!HasBody(req) && HandlePreflight(impl->cors, req, res)) {
      return httplib::Server::HandlerResponse::Handled;
    }
    AddCorsHeaders(impl->cors, req, res);
    // Only GET and POST have routes. httplib reads the body of any other method that may carry
    // one into memory without a limit before routing, and a body left unread would be parsed as
    // the next request: both are refused here, before any body is read.
    if (req.method != "GET" && req.method != "HEAD" && req.method != "POST") {
      SendErrorAndClose(req, res,
                        ApiError{405, absl::StrCat("method ", req.method, " not allowed"),
                                 "invalid_request_error", "", "", 0});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.method != "POST" && HasBody(req)) {
      SendErrorAndClose(req, res,
                        ApiError{400, absl::StrCat(req.method, " with a body"),
                                 "invalid_request_error", "", "", 0});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (IsProbe(req.path) || impl->Authorized(req)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    SendErrorAndClose(req, res,
                      ApiError{401, "Incorrect API key provided", "invalid_request_error", "",
                               "invalid_api_key", 0});
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses httplib sets itself (404 route, 400 unparsable request) get a body too.
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.has_header("Content-Type")) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        ApiError e{res.status, "", "invalid_request_error", "", "", 0};
        if (res.status == 404) {
          e.message = absl::StrCat("no route ", req.method, " ", req.path);
        } else if (res.status == 413) {
          e.message = "request body too large";
        } else {
          e.message = absl::StrCat("HTTP ", res.status);
          if (res.status >= 500) e.type = "server_error";
        }
        res.set_content(Dump(ErrorBody(e)), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  // Every response passes here once written: the connection's next request is timed from now;
  // count the errors (probes, scrapes and clients that went away excepted).
  s.set_logger([impl](const httplib::Request& req, const httplib::Response& res) {
    impl->deadline->Done(Endpoints(req));
    impl->LogAccess(req, res);
    if (res.status < 400 || res.status == kClientClosed) return;
    if (IsProbe(req.path)) return;
    impl->gm->Error(res.status).Increment();
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    SendError(res, ToApiError(Impl::ServerError(res, "internal error", "exception in a handler")));
  });
  using Fn = absl::Status (Impl::*)(const httplib::Request&, httplib::Response&);
  auto get = [impl](Fn fn) {
    return [impl, fn](const httplib::Request& req, httplib::Response& res) {
      impl->deadline->Received(Endpoints(req));
      impl->Guard(req, res, [&](const httplib::Request& q, httplib::Response& r) {
        return (impl->*fn)(q, r);
      });
    };
  };
  // POST bodies are read here, not by httplib, which bounds only a Content-Length body: a chunked
  // (or compressed) one is counted as it arrives and refused with 413 past max_body_bytes, without
  // reading further. A refused body is left unread and its connection closed.
  auto post = [impl](Fn fn) {
    return [impl, fn](const httplib::Request& req, httplib::Response& res,
                      const httplib::ContentReader& reader) {
      const size_t limit = impl->config.max_body_bytes;
      const ApiError too_large{
          413,
          absl::StrCat("request body too large (the limit is ", limit, " bytes)"),
          "invalid_request_error",
          "",
          "",
          0};
      if (req.has_header("Content-Length")) {
        uint64_t n = 0;
        if (!absl::SimpleAtoi(req.get_header_value("Content-Length"), &n)) {
          return SendErrorAndClose(
              req, res,
              ApiError{400, "invalid Content-Length", "invalid_request_error", "", "", 0});
        }
        if (n > limit) return SendErrorAndClose(req, res, too_large);
      }
      std::string body;
      bool over = false;
      const bool read = reader([&](const char* data, size_t n) {
        if (n > limit - body.size()) {
          over = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      if (over) return SendErrorAndClose(req, res, too_large);
      if (!read) {
        return SendErrorAndClose(req, res,
                                 ApiError{400, "the request body could not be read",
                                          "invalid_request_error", "", "", 0});
      }
      impl->deadline->Received(Endpoints(req));
      httplib::Request with_body = req;
      with_body.body = std::move(body);
      impl->Guard(with_body, res, [&](const httplib::Request& q, httplib::Response& r) {
        return (impl->*fn)(q, r);
      });
    };
  };
  s.Post("/v1/chat/completions", post(&Impl::HandleChat));
  s.Post("/v1/completions", post(&Impl::HandleCompletion));
  s.Post("/v1/messages", post(&Impl::HandleMessages));
  s.Post("/v1/responses", post(&Impl::HandleResponses));
  s.Post("/tokenize", post(&Impl::HandleTokenize));
  s.Post("/detokenize", post(&Impl::HandleDetokenize));
  s.Post("/ping", post(&Impl::HandlePing));
  // Any other POST: 404 without reading its body (httplib would read it without a limit).
  s.Post(".*",
         [](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
           SendErrorAndClose(req, res,
                             ApiError{404, absl::StrCat("no route ", req.method, " ", req.path),
                                      "invalid_request_error", "", "", 0});
         });
  s.Get("/v1/models", get(&Impl::HandleModels));
  s.Get("/ping", get(&Impl::HandlePing));
  s.Get("/version", get(&Impl::HandleVersion));
  s.Get("/load", get(&Impl::HandleLoad));
  s.Get("/metrics", get(&Impl::HandleMetrics));
  s.Get("/health", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->deadline->Received(Endpoints(req));
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  s.Get("/ready", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->deadline->Received(Endpoints(req));
    if (impl->engine->Ready()) {
      res.set_content("{\"status\":\"ready\"}", "application/json");
    } else {
      SendError(res, ApiError{503, "not ready", "server_error", "", "not_ready", 1});
    }
  });
}

OpenAiServer::~OpenAiServer() { Stop(); }

absl::StatusOr<int> OpenAiServer::Start(const std::string& host, int port) {
  if (thread_.joinable()) return absl::FailedPreconditionError("server already started");
  // cpp-httplib listens with a backlog of 5, compiled into Debian's library: a burst of more
  // simultaneous connections than that has its SYNs dropped, and those clients wait a whole TCP
  // retransmission timeout (1 s) before the server sees them. The listening socket is captured
  // when it is created and listened on again with the system's maximum backlog.
  auto listen_fd = std::make_shared<std::atomic<int>>(-1);
  server_->set_socket_options([listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd->store(sock);
  });
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host);
    if (bound <= 0) return absl::UnavailableError(absl::StrCat("cannot bind ", host, ":0"));
  } else if (!server_->bind_to_port(host, port)) {
    return absl::UnavailableError(absl::StrCat("cannot bind ", host, ":", port));
  }
  if (const int fd = listen_fd->load(); fd >= 0 && ::listen(fd, SOMAXCONN) != 0) {
    spdlog::warn("HTTP listen backlog stays at cpp-httplib's 5: listen: {}", std::strerror(errno));
  }
  const size_t threads = static_cast<size_t>(std::max(1, impl_->config.http_threads));
  server_->new_task_queue = [threads] { return new ConnectionPool(threads); };
  impl_->deadline->Start(bound);
  if (impl_->config.log_stats_interval_s > 0) {
    Impl* impl = impl_.get();
    impl_->stats_log = std::make_unique<StatsLogger>(
        absl::Seconds(impl_->config.log_stats_interval_s), [impl] { return impl->Stats(); });
    impl_->stats_log->Start();
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return bound;
}

void OpenAiServer::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
  impl_->deadline->Stop();
  if (impl_->stats_log) impl_->stats_log->Stop();
}

}  // namespace ss
