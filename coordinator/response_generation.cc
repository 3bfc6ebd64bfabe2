#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/anthropic_api.h"
#include "coordinator/completion_parser.h"
#include "coordinator/connection_socket.h"
#include "coordinator/openai_render.h"
#include "coordinator/openai_server_impl.h"
#include "coordinator/responses_api.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

using chat::ThinkingMode;
using gateway::Endpoints;
using gateway::kClientClosed;
using gateway::kPollInterval;
using gateway::kRequestIdHeader;
using gateway::NowSeconds;
using gateway::SendJson;
using openai::ApiStatus;
using openai::ChatLogprobs;
using openai::CompletionLogprobs;
using openai::Json;
using openai::ToolCallJson;
using openai::UsageJson;

}  // namespace

absl::Status OpenAiServer::Impl::Run(Job job, const httplib::Request& req, httplib::Response& res) {
  auto timer = std::make_unique<RequestTimer>(*gm, job.arrival);
  ASSIGN_OR_RETURN(std::vector<Choice> choices, Submit(job, res));
  timer->Accepted(job.PromptTokens(), job.params.n, job.params.sampling.max_tokens,
                  job.params.stream);
  if (job.params.stream) {
    Stream(std::move(job), std::move(choices), std::move(timer), res);
    return absl::OkStatus();
  }
  if (!AwaitChoices(choices, *timer, req)) {
    timer->Abort();
    spdlog::info("request {} ({}): the client went away; cancelled",
                 res.get_header_value(kRequestIdHeader), job.id);
    res.status = kClientClosed;
    RecordAccess(res, job, *timer);
    return absl::OkStatus();
  }
  return Respond(job, choices, *timer, res);
}

// Polls until every choice is over or one failed; false (all cancelled) when the client's socket,
// looked at every poll interval, hung up.
bool OpenAiServer::Impl::AwaitChoices(std::vector<Choice>& choices, RequestTimer& timer,
                                      const httplib::Request& req) {
  const int fd = FindConnectionSocket(Endpoints(req));
  auto next_check = Clock::now() + kPollInterval;
  while (Outcome(choices) == FinishReason::kNone && Failed(choices) == nullptr) {
    Poll(choices, timer, [](Choice& c, OutputText::Piece piece) {
      c.all.Append(std::move(piece));
      return true;
    });
    SubmitPending(choices);
    if (const auto now = Clock::now(); now >= next_check) {
      next_check = now + kPollInterval;
      if (fd >= 0 && PeerClosed(fd)) {
        CancelAll(choices);
        return false;
      }
    }
  }
  return true;
}

// The whole response of choices that are over, or the 500 of one that failed.
absl::Status OpenAiServer::Impl::Respond(const Job& job, std::vector<Choice>& choices,
                                         RequestTimer& timer, httplib::Response& res) {
  if (const Choice* failed = Failed(choices)) {
    CancelAll(choices);
    timer.Event(0, failed->finish);
    RecordAccess(res, job, timer);
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
  resp["usage"] = UsageJson(job.PromptTokens(), GeneratedTokens(choices), CachedTokens(choices));
  if (job.response) {
    StoreResponse(job, resp);
    SendJson(res, responses::ToResponse(resp, *job.response));
  } else {
    SendJson(res, job.anthropic ? anthropic::ToMessage(resp, job.id) : resp);
  }
  RecordAccess(res, job, timer);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OpenAiServer::Impl::Choice>> OpenAiServer::Impl::Submit(
    const Job& job, const httplib::Response& res) {
  const size_t n = static_cast<size_t>(job.params.n);
  std::vector<Choice> choices(job.prompts.size() * n);
  const SamplingParams& sp = job.params.sampling;
  const bool defer = config.share_prompt_prefill && n > 1 && sp.frequency_penalty == 0.0f &&
                     sp.presence_penalty == 0.0f && sp.repetition_penalty == 1.0f;
  for (size_t i = 0; i < choices.size(); ++i) {
    Choice& c = choices[i];
    c.index = static_cast<int>(i);
    c.prompt = i / n;
    c.leader = i - i % n;
    c.cancel = std::make_shared<CancellationToken>();
    c.output = std::make_unique<OutputText>(*tokenizer, job.params.stop,
                                            job.params.include_stop_str_in_output,
                                            static_cast<size_t>(job.params.sampling.min_tokens));
    c.parser = std::make_unique<chat::CompletionStreamParser>(job.parse_mode, job.parse_tool_calls);
    ASSIGN_OR_RETURN(GenerationRequest gr, ChoiceRequest(job, c, choices.size()));
    if (defer && i != c.leader) {
      c.pending = std::move(gr);
      continue;
    }
    SubmitOutcome out = engine->Submit(std::move(gr));
    if (absl::Status refused = Refusal(out, job, res); !refused.ok()) {
      for (size_t k = 0; k < i; ++k) choices[k].cancel->Cancel();
      return refused;
    }
    c.stream = std::move(out.stream);
  }
  return choices;
}

// The engine's request for choice `c` (of `count`): its prompt, the seed plus its place among
// the prompt's n choices.
absl::StatusOr<GenerationRequest> OpenAiServer::Impl::ChoiceRequest(const Job& job, const Choice& c,
                                                                    size_t count) const {
  GenerationRequest gr;
  gr.request_id = count == 1 ? job.id : absl::StrCat(job.id, "-", c.index);
  gr.prompt = job.prompts[c.prompt].tokens;
  gr.sampling = job.params.sampling;
  gr.sampling.max_tokens = job.prompts[c.prompt].max_tokens;
  if (gr.sampling.seed) *gr.sampling.seed += c.index - static_cast<int>(c.leader);
  gr.cancel = c.cancel;
  gr.constraint = job.constraint;
  if (c.index > 0 && job.grammar) {
    ASSIGN_OR_RETURN(gr.constraint, structured->Constraint(
                                        *job.grammar, job.parse_mode == ThinkingMode::kThinking));
  }
  return gr;
}

// The error answering a submission the engine did not take (OK when it did, with a stream).
absl::Status OpenAiServer::Impl::Refusal(const SubmitOutcome& out, const Job& job,
                                         const httplib::Response& res) const {
  switch (out.status) {
    case SubmitStatus::kAccepted:
      if (!out.stream) {
        return ServerError(res, "internal error",
                           "the engine accepted the request without a stream");
      }
      return absl::OkStatus();
    case SubmitStatus::kOverloaded:
      return ApiStatus(absl::StatusCode::kUnavailable, "The server is overloaded; retry later", "",
                       "overloaded", std::max(1, out.retry_after_s));
    case SubmitStatus::kNotReady:
      return ApiStatus(absl::StatusCode::kUnavailable, "The model is not ready yet; retry later",
                       "", "not_ready", std::max(1, out.retry_after_s));
    case SubmitStatus::kRejected:
      return ApiStatus(absl::StatusCode::kInvalidArgument, out.error,
                       job.kind == Kind::kChat ? "messages" : "prompt", "context_length_exceeded");
  }
  return absl::OkStatus();
}

void OpenAiServer::Impl::SubmitPending(std::vector<Choice>& choices) {
  for (Choice& c : choices) {
    if (!c.pending) continue;
    const Choice& leader = choices[c.leader];
    if (leader.output->tokens() == 0 && leader.finish == FinishReason::kNone) continue;
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

OutputText::Piece OpenAiServer::Impl::Consume(Choice& c, const GenerationEvent& ev) {
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

FinishReason OpenAiServer::Impl::Outcome(const std::vector<Choice>& choices) {
  for (const Choice& c : choices) {
    if (c.finish == FinishReason::kNone) return FinishReason::kNone;
  }
  for (const Choice& c : choices) {
    if (c.finish == FinishReason::kError || c.finish == FinishReason::kCancelled) return c.finish;
  }
  return choices[0].finish;
}

bool OpenAiServer::Impl::Poll(std::vector<Choice>& choices, RequestTimer& timer,
                              absl::FunctionRef<bool(Choice&, OutputText::Piece)> on_piece) {
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

const OpenAiServer::Impl::Choice* OpenAiServer::Impl::Failed(const std::vector<Choice>& choices) {
  for (const Choice& c : choices) {
    if (c.finish == FinishReason::kError || c.finish == FinishReason::kCancelled) return &c;
  }
  return nullptr;
}

void OpenAiServer::Impl::CancelAll(std::vector<Choice>& choices) {
  for (Choice& c : choices) c.cancel->Cancel();
}

size_t OpenAiServer::Impl::CachedTokens(const std::vector<Choice>& choices) {
  std::vector<int64_t> best;  // by prompt
  for (const Choice& c : choices) {
    if (c.prompt >= best.size()) best.resize(c.prompt + 1, 0);
    best[c.prompt] = std::max(best[c.prompt], c.cached_tokens);
  }
  int64_t n = 0;
  for (const int64_t b : best) n += b;
  return static_cast<size_t>(n);
}

size_t OpenAiServer::Impl::GeneratedTokens(const std::vector<Choice>& choices) {
  size_t n = 0;
  for (const Choice& c : choices) n += c.output->tokens();
  return n;
}

Json OpenAiServer::Impl::ChoiceJson(const Job& job, const Choice& c) const {
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
    msg["content"] =
        parsed.content.empty() && !parsed.tool_calls.empty() ? Json(nullptr) : Json(parsed.content);
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
    choice["text"] = job.prompts[c.prompt].echo + c.all.text;
    choice["logprobs"] = logprobs ? CompletionLogprobs(*tokenizer, c.all.logprobs) : Json(nullptr);
  }
  choice["finish_reason"] = reason;
  choice["stop_reason"] = c.output->stopped() ? Json(c.output->stop_string()) : Json(nullptr);
  return choice;
}

std::string OpenAiServer::Impl::CallId(const Job& job, const Choice& c, size_t i) {
  return c.index == 0 ? absl::StrCat("call_", job.id, "_", i)
                      : absl::StrCat("call_", job.id, "_", c.index, "_", i);
}

void OpenAiServer::Impl::StoreResponse(const Job& job, const Json& completion) {
  if (!job.store) return;
  Json conversation = job.conversation;
  conversation.push_back(responses::AssistantMessage(completion));
  response_store.Put(job.id, std::move(conversation));
}

void OpenAiServer::Impl::RecordAccess(const httplib::Response& res, const Job& job,
                                      const RequestTimer& timer) {
  access.Record(&res, {res.get_header_value(kRequestIdHeader), job.id, timer.Summary()});
}

}  // namespace ss
