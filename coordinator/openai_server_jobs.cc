#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/anthropic_api.h"
#include "coordinator/chat_encoding.h"
#include "coordinator/openai_server_impl.h"
#include "coordinator/responses_api.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

using chat::ThinkingMode;
using gateway::kRequestIdHeader;
using gateway::NowSeconds;
using openai::ApiStatus;
using openai::Field;
using openai::GenerationParams;
using openai::GetBool;
using openai::Invalid;
using openai::Json;
using openai::ParseBody;
using openai::ParseGenerationParams;
using openai::ParseTemplateControls;
using openai::ParseThinking;
using openai::ParseToolChoice;
using openai::ToolChoice;
using openai::TypeName;

}  // namespace

absl::Status OpenAiServer::Impl::HandleChat(const httplib::Request& req, httplib::Response& res) {
  ASSIGN_OR_RETURN(Json body, ParseBody(req.body));
  RETURN_IF_ERROR(CheckModel(body));
  ReportIgnoredFields(openai::IgnoredFields(body, /*chat=*/true), res);
  Job job;
  job.arrival = Clock::now();
  job.id = absl::StrCat("chatcmpl-", NewRequestId());
  RETURN_IF_ERROR(PrepareChat(body, job));
  return Run(std::move(job), req, res);
}

absl::Status OpenAiServer::Impl::HandleMessages(const httplib::Request& req,
                                                httplib::Response& res) {
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

absl::Status OpenAiServer::Impl::HandleResponses(const httplib::Request& req,
                                                 httplib::Response& res) {
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
                                    "' not found (responses are kept in memory, ", kStoredResponses,
                                    " at most, and not across restarts)"),
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
  job.response = responses::ResponseMeta{job.id, NowSeconds(), config.model_name, std::move(echo)};
  RETURN_IF_ERROR(PrepareChat(chat.body, job));
  return Run(std::move(job), req, res);
}

absl::Status OpenAiServer::Impl::PrepareChat(Json& body, Job& job) {
  job.kind = Kind::kChat;
  ASSIGN_OR_RETURN(job.params, ParseGenerationParams(body, /*chat=*/true));
  RETURN_IF_ERROR(CheckLogitBias(job.params));
  ASSIGN_OR_RETURN(std::vector<int32_t> tokens, ChatPrompt(body, &job));
  job.prompts.emplace_back().tokens = std::move(tokens);
  RETURN_IF_ERROR(Constrain(job));
  return FitContext(job, "messages");
}

absl::Status OpenAiServer::Impl::HandleCompletion(const httplib::Request& req,
                                                  httplib::Response& res) {
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
  ASSIGN_OR_RETURN(const bool echo, openai::ParseEcho(body, job.params));
  ASSIGN_OR_RETURN(job.prompts, CompletionPrompts(*prompt, echo));
  if (const int64_t choices = static_cast<int64_t>(job.prompts.size()) * job.params.n;
      choices > openai::kMaxBatchChoices) {
    return Invalid(
        "prompt",
        absl::StrCat("prompt: ", job.prompts.size(), " prompts x n = ", job.params.n, " make ",
                     choices, " choices; one request takes at most ", openai::kMaxBatchChoices));
  }
  ASSIGN_OR_RETURN(job.grammar, structured->RequestGrammar(body, ToolChoice{}, nullptr));
  RETURN_IF_ERROR(Constrain(job));
  job.id = absl::StrCat("cmpl-", NewRequestId());
  RETURN_IF_ERROR(FitContext(job, "prompt"));
  return Run(std::move(job), req, res);
}

absl::StatusOr<std::vector<OpenAiServer::Impl::Prompt>> OpenAiServer::Impl::CompletionPrompts(
    const Json& prompt, bool echo) {
  constexpr const char* kShapes =
      "expected a string, an array of token ids, or an array of strings or of token-id arrays";
  const bool batch = prompt.is_array() && !prompt.empty() && !prompt[0].is_number();
  std::vector<const Json*> items;
  if (batch) {
    for (const Json& p : prompt) items.push_back(&p);
  } else {
    items.push_back(&prompt);
  }
  std::vector<Prompt> out(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const Json& p = *items[i];
    // Error messages name the item of a batch.
    auto name = [&] { return batch ? absl::StrCat("prompt[", i, "]") : std::string("prompt"); };
    auto shape_error = [&] {
      return Invalid("prompt",
                     absl::StrCat(name(), ": ",
                                  batch ? "expected a string or an array of token ids" : kShapes));
    };
    if (p.is_string()) {
      ASSIGN_OR_RETURN(out[i].tokens, Encode(p.get_ref<const std::string&>(), "prompt"));
    } else if (p.is_array() && !p.empty()) {
      for (const auto& id : p) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= tokenizer->vocab_size()) {
          return shape_error();
        }
        out[i].tokens.push_back(id.get<int32_t>());
      }
    } else {
      return shape_error();
    }
    if (out[i].tokens.empty()) {
      return Invalid("prompt", absl::StrCat(name(), ": must not be empty"));
    }
    if (!echo) continue;
    if (p.is_string()) {
      out[i].echo = p.get<std::string>();
    } else {
      auto text = tokenizer->Decode(out[i].tokens);
      if (!text.ok()) return Invalid("prompt", text.status().message());
      out[i].echo = *std::move(text);
    }
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> OpenAiServer::Impl::ChatPrompt(Json& body, Job* job) {
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

absl::Status OpenAiServer::Impl::CheckModel(const Json& body) {
  const Json* m = Field(body, "model");
  if (!m) return Invalid("model", "model: required");
  if (!m->is_string()) {
    return Invalid("model", absl::StrCat("model: expected a string, got ", TypeName(*m)));
  }
  if (m->get_ref<const std::string&>() != config.model_name) {
    return ApiStatus(
        absl::StatusCode::kNotFound,
        absl::StrCat("The model `", m->get_ref<const std::string&>(), "` does not exist"), "model",
        "model_not_found");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> OpenAiServer::Impl::Encode(const std::string& text,
                                                                const char* param,
                                                                Tokenizer::PlainText plain_text) {
  auto ids = tokenizer->Encode(text, plain_text);
  if (!ids.ok()) return Invalid(param, ids.status().message());
  return ids;
}

absl::Status OpenAiServer::Impl::FitContext(Job& job, const char* param) {
  int64_t ctx = config.max_context_tokens;
  if (const int64_t kv = config.max_sequence_tokens ? config.max_sequence_tokens() : 0; kv > 0) {
    ctx = std::min(ctx, kv);  // the KV cache holds less than the model's context
  }
  int32_t largest = 0;
  for (size_t i = 0; i < job.prompts.size(); ++i) {
    const int64_t prompt = static_cast<int64_t>(job.prompts[i].tokens.size());
    // A batch's message names the prompt that does not fit.
    auto which = [&] {
      return job.prompts.size() > 1 ? absl::StrCat("prompt[", i, "]: ") : std::string();
    };
    int64_t want = job.params.max_tokens.value_or(ctx - prompt);
    // Anthropic's clients ask for a fixed max_tokens (Claude Code: 32,000) whatever the
    // context: /v1/messages lowers it to the context left instead of refusing the request.
    if (job.anthropic && prompt < ctx) want = std::min(want, ctx - prompt);
    if (prompt + want > ctx || want < 1) {
      return ApiStatus(
          absl::StatusCode::kInvalidArgument,
          absl::StrCat(which(), "This model's maximum context length is ", ctx,
                       " tokens. However, you requested ", prompt + std::max<int64_t>(want, 0),
                       " tokens (", prompt, " in the prompt, ", std::max<int64_t>(want, 0),
                       " for the completion)."),
          param, "context_length_exceeded");
    }
    if (job.params.sampling.min_tokens > want) {
      return Invalid("min_tokens",
                     absl::StrCat(which(), "min_tokens (", job.params.sampling.min_tokens,
                                  ") must not exceed max_tokens (", want, ")"));
    }
    job.prompts[i].max_tokens = static_cast<int32_t>(want);
    largest = std::max(largest, job.prompts[i].max_tokens);
  }
  job.params.sampling.max_tokens = largest;
  return absl::OkStatus();
}

absl::Status OpenAiServer::Impl::CheckLogitBias(const GenerationParams& params) const {
  for (const auto& [id, bias] : params.sampling.logit_bias) {
    if (id >= tokenizer->vocab_size()) {
      return Invalid("logit_bias",
                     absl::StrCat("logit_bias: token id ", id, " is outside the vocabulary [0, ",
                                  tokenizer->vocab_size(), ")"));
    }
  }
  return absl::OkStatus();
}

void OpenAiServer::Impl::ReportIgnoredFields(const std::vector<std::string>& ignored,
                                             httplib::Response& res) {
  if (ignored.empty()) return;
  std::string list;
  for (size_t i = 0; i < ignored.size() && i < 16; ++i) {
    if (i > 0) list += ", ";
    for (const char c : ignored[i].substr(0, 64)) {
      list += absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-'
                  ? c
                  : '?';
    }
  }
  if (ignored.size() > 16) absl::StrAppend(&list, ", and ", ignored.size() - 16, " more");
  spdlog::warn("request {}: fields present in the request but ignored: {}",
               res.get_header_value(kRequestIdHeader), list);
  res.set_header("X-Ignored-Fields", list);
}

absl::Status OpenAiServer::Impl::Constrain(Job& job) {
  if (!job.grammar) return absl::OkStatus();
  if (job.params.sampling.ignore_eos) {
    return Invalid("ignore_eos", absl::StrCat("ignore_eos: cannot be combined with ",
                                              job.grammar->param, " (structured output)"));
  }
  if (job.params.sampling.min_tokens > 0) {
    return Invalid("min_tokens", absl::StrCat("min_tokens: cannot be combined with ",
                                              job.grammar->param, " (structured output)"));
  }
  ASSIGN_OR_RETURN(job.constraint,
                   structured->Constraint(*job.grammar, job.parse_mode == ThinkingMode::kThinking));
  return absl::OkStatus();
}

}  // namespace ss
