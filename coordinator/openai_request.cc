#include "coordinator/openai_request.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <string_view>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"
#include "common/status.h"
#include "coordinator/json_limits.h"

namespace ss::openai {
namespace {

constexpr char kParamUrl[] = "type.splitserve/openai.param";
constexpr char kCodeUrl[] = "type.splitserve/openai.code";
constexpr char kRetryAfterUrl[] = "type.splitserve/openai.retry_after_s";

std::string Payload(const absl::Status& s, const char* url) {
  const absl::optional<absl::Cord> c = s.GetPayload(url);
  return c ? std::string(*c) : std::string();
}

absl::Status OutOfRange(const std::string& key, auto lo, auto hi) {
  return Invalid(key, absl::StrCat(key, ": must be in [", lo, ", ", hi, "]"));
}

}  // namespace

absl::Status Invalid(absl::string_view param, absl::string_view message) {
  return ApiStatus(absl::StatusCode::kInvalidArgument, message, param, "");
}

absl::Status ApiStatus(absl::StatusCode code, absl::string_view message, absl::string_view param,
                       absl::string_view error_code, int retry_after_s) {
  absl::Status s(code, message);
  if (!param.empty()) s.SetPayload(kParamUrl, absl::Cord(param));
  if (!error_code.empty()) s.SetPayload(kCodeUrl, absl::Cord(error_code));
  if (retry_after_s > 0) s.SetPayload(kRetryAfterUrl, absl::Cord(absl::StrCat(retry_after_s)));
  return s;
}

ApiError ToApiError(const absl::Status& status) {
  ApiError e;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      e.status = 400;
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      break;
    default:
      e.status = 500;
      break;
  }
  e.type = e.status >= 500 ? "server_error" : "invalid_request_error";
  e.message = std::string(status.message());
  e.param = Payload(status, kParamUrl);
  e.code = Payload(status, kCodeUrl);
  if (!absl::SimpleAtoi(Payload(status, kRetryAfterUrl), &e.retry_after_s)) e.retry_after_s = 0;
  return e;
}

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

Json ErrorBody(const ApiError& e) {
  Json err = Json::object();
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? Json(nullptr) : Json(e.param);
  err["code"] = e.code.empty() ? Json(nullptr) : Json(e.code);
  Json body = Json::object();
  body["error"] = std::move(err);
  return body;
}

const char* TypeName(const Json& j) { return j.type_name(); }

absl::StatusOr<Json> ParseBody(const std::string& text) {
  absl::StatusOr<Json> parsed = ParseJsonWithLimits(text);
  if (!parsed.ok()) {
    return Invalid("", absl::StrCat("request body: ", parsed.status().message()));
  }
  if (!parsed->is_object()) {
    return Invalid("", absl::StrCat("request body must be a JSON object, got ", TypeName(*parsed)));
  }
  return parsed;
}

const Json* Field(const Json& obj, const std::string& key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<double>> GetNumber(const Json& obj, const std::string& key, double lo,
                                                double hi) {
  const Json* v = Field(obj, key);
  if (!v) return std::optional<double>();
  if (!v->is_number()) {
    return Invalid(key, absl::StrCat(key, ": expected a number, got ", TypeName(*v)));
  }
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    return OutOfRange(key, lo, hi);
  }
  return d;
}

absl::StatusOr<std::optional<int64_t>> GetInt(const Json& obj, const std::string& key, int64_t lo,
                                              int64_t hi) {
  const Json* v = Field(obj, key);
  if (!v) return std::optional<int64_t>();
  if (!v->is_number_integer()) {
    return Invalid(key, absl::StrCat(key, ": expected an integer, got ", TypeName(*v)));
  }
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo))) {
      return OutOfRange(key, lo, hi);
    }
    return static_cast<int64_t>(u);
  }
  int64_t i = v->get<int64_t>();
  if (i < lo || i > hi) return OutOfRange(key, lo, hi);
  return i;
}

absl::StatusOr<std::optional<bool>> GetBool(const Json& obj, const std::string& key) {
  const Json* v = Field(obj, key);
  if (!v) return std::optional<bool>();
  if (!v->is_boolean()) {
    return Invalid(key, absl::StrCat(key, ": expected a boolean, got ", TypeName(*v)));
  }
  return v->get<bool>();
}

absl::StatusOr<std::optional<std::string>> GetString(const Json& obj, const std::string& key) {
  const Json* v = Field(obj, key);
  if (!v) return std::optional<std::string>();
  if (!v->is_string()) {
    return Invalid(key, absl::StrCat(key, ": expected a string, got ", TypeName(*v)));
  }
  return v->get<std::string>();
}

namespace {

// A sampling field splitserve does not implement yet, and the value that leaves output as it is.
struct NoEffectField {
  const char* name;
  double neutral;       // numbers: this value is accepted
  bool chat, complete;  // the routes that know the field
};
constexpr NoEffectField kNoEffectFields[] = {
    {"best_of", 1.0, false, true},
    {"length_penalty", 1.0, true, true},
};

// Fields a vLLM client may send whose effect splitserve cannot honour yet (issue 28): a value
// that would change the output is a 400 naming the field, never silently ignored; the neutral
// value (echo / use_beam_search false) is accepted.
absl::Status RefuseWithoutEffect(const Json& body, bool chat) {
  auto refuse = [](const std::string& name, const std::string& neutral) {
    return Invalid(name,
                   absl::StrCat(name, ": not supported yet (it would have no effect); omit it",
                                neutral.empty() ? "" : " or send " + neutral));
  };
  for (const NoEffectField& f : kNoEffectFields) {
    if (!(chat ? f.chat : f.complete)) continue;
    const Json* v = Field(body, f.name);
    if (v == nullptr) continue;
    if (!v->is_number() || v->get<double>() != f.neutral) {
      return refuse(f.name, absl::StrCat(f.neutral));
    }
  }
  for (const char* name : {"use_beam_search", "echo"}) {
    if (!chat && std::string_view(name) == "echo") continue;  // completions: ParseEcho
    const Json* v = Field(body, name);
    if (v != nullptr && !(v->is_boolean() && !v->get<bool>())) return refuse(name, "false");
  }
  if (const Json* v = Field(body, "suffix");
      v != nullptr && !(v->is_string() && v->get_ref<const std::string&>().empty())) {
    return refuse("suffix", "\"\"");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GenerationParams> ParseGenerationParams(const Json& body, bool chat) {
  GenerationParams p;
  ASSIGN_OR_RETURN(const std::optional<double> temperature,
                   GetNumber(body, "temperature", 0.0, 2.0));
  if (temperature) p.sampling.temperature = float(*temperature);
  ASSIGN_OR_RETURN(const std::optional<double> top_p, GetNumber(body, "top_p", 0.0, 1.0));
  if (top_p) {
    if (*top_p <= 0.0) return Invalid("top_p", "top_p: must be in (0, 1]");
    p.sampling.top_p = float(*top_p);
  }
  ASSIGN_OR_RETURN(const std::optional<int64_t> top_k,
                   GetInt(body, "top_k", -1, std::numeric_limits<int32_t>::max()));
  if (top_k) p.sampling.top_k = int32_t(*top_k);
  constexpr int64_t kMaxTok = std::numeric_limits<int32_t>::max();
  ASSIGN_OR_RETURN(p.max_tokens, GetInt(body, "max_tokens", 1, kMaxTok));
  if (chat) {
    ASSIGN_OR_RETURN(const std::optional<int64_t> v,
                     GetInt(body, "max_completion_tokens", 1, kMaxTok));
    if (v) p.max_tokens = v;
  }
  ASSIGN_OR_RETURN(const std::optional<int64_t> seed,
                   GetInt(body, "seed", std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max()));
  if (seed) p.sampling.seed = static_cast<uint64_t>(*seed);
  ASSIGN_OR_RETURN(const std::optional<int64_t> n, GetInt(body, "n", 1, kMaxChoices));
  p.n = static_cast<int>(n.value_or(1));
  if (const Json* stop = Field(body, "stop")) {
    bool ok = stop->is_string();
    if (stop->is_array()) {
      ok = stop->size() <= 4;
      for (const auto& s : *stop) ok = ok && s.is_string();
    }
    if (!ok) return Invalid("stop", "stop: expected a string or an array of up to 4 strings");
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else {
      for (const auto& s : *stop) p.stop.push_back(s.get<std::string>());
    }
  }
  if (chat) {
    ASSIGN_OR_RETURN(const std::optional<bool> logprobs, GetBool(body, "logprobs"));
    ASSIGN_OR_RETURN(const std::optional<int64_t> top,
                     GetInt(body, "top_logprobs", 0, kMaxTopLogprobs));
    if (top && !logprobs.value_or(false)) {
      return Invalid("top_logprobs", "top_logprobs: requires logprobs to be true");
    }
    if (logprobs.value_or(false)) p.sampling.top_logprobs = static_cast<int32_t>(top.value_or(0));
  } else {
    ASSIGN_OR_RETURN(const std::optional<int64_t> v, GetInt(body, "logprobs", 0, kMaxTopLogprobs));
    if (v) p.sampling.top_logprobs = static_cast<int32_t>(*v);
  }
  ASSIGN_OR_RETURN(const std::optional<bool> ignore_eos, GetBool(body, "ignore_eos"));
  p.sampling.ignore_eos = ignore_eos.value_or(false);
  if (const Json* ids = Field(body, "stop_token_ids")) {
    bool ok = ids->is_array() && ids->size() <= kMaxStopTokenIds;
    for (const auto& id : ok ? *ids : Json::array()) {
      ok = ok && id.is_number_integer() && id.get<int64_t>() >= 0 &&
           id.get<int64_t>() <= std::numeric_limits<int32_t>::max();
      if (ok) p.sampling.stop_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    if (!ok) {
      return Invalid("stop_token_ids", absl::StrCat("stop_token_ids: expected an array of up to ",
                                                    kMaxStopTokenIds, " non-negative token ids"));
    }
  }
  ASSIGN_OR_RETURN(const std::optional<bool> include_stop,
                   GetBool(body, "include_stop_str_in_output"));
  p.include_stop_str_in_output = include_stop.value_or(false);
  ASSIGN_OR_RETURN(const std::optional<double> min_p, GetNumber(body, "min_p", 0.0, 1.0));
  p.sampling.min_p = static_cast<float>(min_p.value_or(0.0));
  ASSIGN_OR_RETURN(const std::optional<double> frequency,
                   GetNumber(body, "frequency_penalty", -2.0, 2.0));
  p.sampling.frequency_penalty = static_cast<float>(frequency.value_or(0.0));
  ASSIGN_OR_RETURN(const std::optional<double> presence,
                   GetNumber(body, "presence_penalty", -2.0, 2.0));
  p.sampling.presence_penalty = static_cast<float>(presence.value_or(0.0));
  ASSIGN_OR_RETURN(const std::optional<double> repetition,
                   GetNumber(body, "repetition_penalty", 0.0, 1e6));
  if (repetition && *repetition <= 0.0) {
    return Invalid("repetition_penalty", "repetition_penalty: must be > 0");
  }
  p.sampling.repetition_penalty = static_cast<float>(repetition.value_or(1.0));
  ASSIGN_OR_RETURN(const std::optional<int64_t> min_tokens, GetInt(body, "min_tokens", 0, kMaxTok));
  p.sampling.min_tokens = static_cast<int32_t>(min_tokens.value_or(0));
  if (const Json* lb = Field(body, "logit_bias")) {
    bool ok = lb->is_object() && lb->size() <= kMaxLogitBias;
    for (auto it = ok ? lb->begin() : lb->end(); ok && it != lb->end(); ++it) {
      int64_t id = -1;
      ok = absl::SimpleAtoi(it.key(), &id) && id >= 0 &&
           id <= std::numeric_limits<int32_t>::max() && it->is_number() &&
           it->get<double>() >= -100.0 && it->get<double>() <= 100.0;
      if (ok) {
        p.sampling.logit_bias.emplace_back(static_cast<int32_t>(id),
                                           static_cast<float>(it->get<double>()));
      }
    }
    if (!ok) {
      return Invalid("logit_bias",
                     absl::StrCat("logit_bias: expected an object of up to ", kMaxLogitBias,
                                  " \"token id\": bias pairs, biases in [-100, 100]"));
    }
  }
  RETURN_IF_ERROR(RefuseWithoutEffect(body, chat));
  ASSIGN_OR_RETURN(const std::optional<bool> stream, GetBool(body, "stream"));
  p.stream = stream.value_or(false);
  if (const Json* so = Field(body, "stream_options")) {
    if (!so->is_object()) {
      return Invalid("stream_options",
                     absl::StrCat("stream_options: expected an object, got ", TypeName(*so)));
    }
    if (const Json* iu = Field(*so, "include_usage")) {
      if (!iu->is_boolean()) {
        return Invalid("stream_options.include_usage",
                       "stream_options.include_usage: expected a boolean");
      }
      p.include_usage = iu->get<bool>();
    }
  }
  return p;
}

absl::Status ParseThinking(const Json& body, chat::EncodeOptions* opts) {
  ASSIGN_OR_RETURN(std::optional<std::string> effort, GetString(body, "reasoning_effort"));
  if (effort) {
    if (*effort == "none") {
      opts->mode = chat::ThinkingMode::kChat;
    } else if (*effort == "minimal" || *effort == "low" || *effort == "medium" ||
               *effort == "high") {
      opts->mode = chat::ThinkingMode::kThinking;
    } else if (*effort == "xhigh" || *effort == "max") {
      opts->mode = chat::ThinkingMode::kThinking;
      opts->reasoning_effort = "max";
    } else {
      return Invalid("reasoning_effort",
                     absl::StrCat("reasoning_effort: \"", *effort,
                                  "\" is not one of none, minimal, low, medium, high, xhigh, max"));
    }
  }
  const Json* kw = Field(body, "chat_template_kwargs");
  if (!kw) return absl::OkStatus();
  if (!kw->is_object()) {
    return Invalid("chat_template_kwargs",
                   absl::StrCat("chat_template_kwargs: expected an object, got ", TypeName(*kw)));
  }
  for (const char* key : {"thinking", "enable_thinking"}) {
    if (const Json* v = Field(*kw, key)) {
      if (!v->is_boolean()) {
        return Invalid(absl::StrCat("chat_template_kwargs.", key),
                       absl::StrCat("chat_template_kwargs.", key, ": expected a boolean"));
      }
      opts->mode = v->get<bool>() ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
    }
  }
  if (const Json* v = Field(*kw, "thinking_mode")) {
    if (!v->is_string() || (*v != "thinking" && *v != "chat")) {
      return Invalid("chat_template_kwargs.thinking_mode",
                     "chat_template_kwargs.thinking_mode: expected \"thinking\" or \"chat\"");
    }
    opts->mode = *v == "thinking" ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
  }
  if (const Json* v = Field(*kw, "reasoning_effort")) {
    if (!v->is_string()) {
      return Invalid("chat_template_kwargs.reasoning_effort",
                     "chat_template_kwargs.reasoning_effort: expected a string");
    }
    opts->reasoning_effort = v->get<std::string>();
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ParseEcho(const Json& body, const GenerationParams& params) {
  ASSIGN_OR_RETURN(const std::optional<bool> echo, GetBool(body, "echo"));
  if (echo.value_or(false) && params.sampling.top_logprobs >= 0) {
    return Invalid("echo",
                   "echo: with logprobs it needs the prompt's logprobs, which splitserve "
                   "does not compute; send echo or logprobs, not both");
  }
  return echo.value_or(false);
}

std::vector<std::string> IgnoredFields(const Json& body, bool chat) {
  static constexpr const char* kCommon[] = {"model",
                                            "max_tokens",
                                            "temperature",
                                            "top_p",
                                            "top_k",
                                            "min_p",
                                            "seed",
                                            "n",
                                            "stop",
                                            "stop_token_ids",
                                            "logprobs",
                                            "stream",
                                            "stream_options",
                                            "logit_bias",
                                            "frequency_penalty",
                                            "presence_penalty",
                                            "repetition_penalty",
                                            "min_tokens",
                                            "ignore_eos",
                                            "include_stop_str_in_output",
                                            "best_of",
                                            "length_penalty",
                                            "use_beam_search",
                                            "user",
                                            "metadata",
                                            "response_format",
                                            "structured_outputs",
                                            "guided_json",
                                            "guided_regex",
                                            "guided_choice",
                                            "guided_grammar"};
  static constexpr const char* kChat[] = {"messages",
                                          "max_completion_tokens",
                                          "top_logprobs",
                                          "tools",
                                          "tool_choice",
                                          "parallel_tool_calls",
                                          "chat_template_kwargs",
                                          "reasoning_effort",
                                          "add_generation_prompt",
                                          "continue_final_message"};
  static constexpr const char* kCompletion[] = {"prompt", "echo", "suffix"};
  std::vector<std::string> out;
  for (auto it = body.begin(); it != body.end(); ++it) {
    auto is = [&](const auto& names) {
      return std::find(std::begin(names), std::end(names), it.key()) != std::end(names);
    };
    if (!is(kCommon) && !(chat ? is(kChat) : is(kCompletion))) out.push_back(it.key());
  }
  return out;
}

absl::Status ParseTemplateControls(const Json& body, const Json& messages,
                                   chat::EncodeOptions* opts) {
  ASSIGN_OR_RETURN(const std::optional<bool> add, GetBool(body, "add_generation_prompt"));
  ASSIGN_OR_RETURN(const std::optional<bool> cont, GetBool(body, "continue_final_message"));
  bool prefix = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json* p = messages[i].is_object() ? Field(messages[i], "prefix") : nullptr;
    if (p == nullptr) continue;
    const std::string name = absl::StrCat("messages[", i, "].prefix");
    if (!p->is_boolean()) return Invalid(name, absl::StrCat(name, ": expected a boolean"));
    if (!p->get<bool>()) continue;
    if (i + 1 != messages.size() || messages[i].value("role", Json("")) != "assistant") {
      return Invalid(name, absl::StrCat(name, ": only the final message, an assistant message, ",
                                        "may have prefix: true"));
    }
    prefix = true;
  }
  opts->continue_final_message = cont.value_or(false) || prefix;
  if (opts->continue_final_message && add.value_or(false)) {
    return Invalid("add_generation_prompt",
                   "add_generation_prompt: cannot be true while the final message is continued "
                   "(continue_final_message or prefix)");
  }
  opts->add_generation_prompt = add.value_or(!opts->continue_final_message);
  if (opts->continue_final_message && messages.back().value("role", Json("")) != "assistant") {
    return Invalid("continue_final_message",
                   "continue_final_message: the last message must be an assistant message");
  }
  return absl::OkStatus();
}

absl::StatusOr<ToolChoice> ParseToolChoice(const Json& body, const Json* tools) {
  ToolChoice c;
  const Json* tc = Field(body, "tool_choice");
  if (tc == nullptr) return c;
  const bool have_tools = tools != nullptr && tools->is_array() && !tools->empty();
  if (tc->is_string()) {
    const std::string v = tc->get<std::string>();
    if (v == "auto") return c;
    if (v == "none") {
      c.kind = ToolChoice::kNone;
      return c;
    }
    if (v != "required") {
      return Invalid("tool_choice",
                     absl::StrCat("tool_choice: \"", v, "\" is not one of auto, none, required"));
    }
    c.kind = ToolChoice::kRequired;
  } else if (tc->is_object()) {
    const Json* fn = Field(*tc, "function");
    const Json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
    if (tc->value("type", Json("")) != "function" || name == nullptr || !name->is_string()) {
      return Invalid(
          "tool_choice",
          "tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    c.kind = ToolChoice::kNamed;
    c.name = name->get<std::string>();
    bool found = false;
    for (const Json& t : have_tools ? *tools : Json::array()) {
      const Json* f = t.is_object() ? Field(t, "function") : nullptr;
      found = found || (f != nullptr && f->is_object() && f->value("name", Json("")) == c.name);
    }
    if (!found) {
      return Invalid("tool_choice", absl::StrCat("tool_choice: the function \"", c.name,
                                                 "\" is not among the request's tools"));
    }
  } else {
    return Invalid("tool_choice", "tool_choice: expected a string or an object");
  }
  if (!have_tools) {
    return Invalid("tool_choice", "tool_choice: a forced tool call needs tools");
  }
  return c;
}

}  // namespace ss::openai
