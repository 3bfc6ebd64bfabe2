#include "coordinator/openai_request.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/json_limits.h"

namespace ss::openai {

ApiError Invalid(std::string param, std::string message) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), "", 0};
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

Json ParseBody(const std::string& text) {
  absl::StatusOr<Json> parsed = ParseJsonWithLimits(text);
  if (!parsed.ok()) {
    throw Invalid("", absl::StrCat("request body: ", parsed.status().message()));
  }
  Json body = *std::move(parsed);
  if (!body.is_object()) {
    throw Invalid("", absl::StrCat("request body must be a JSON object, got ", TypeName(body)));
  }
  return body;
}

const Json* Field(const Json& obj, const std::string& key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> GetNumber(const Json& obj, const std::string& key, double lo, double hi) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) {
    throw Invalid(key, absl::StrCat(key, ": expected a number, got ", TypeName(*v)));
  }
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    throw Invalid(key, absl::StrCat(key, ": must be in [", lo, ", ", hi, "]"));
  }
  return d;
}

std::optional<int64_t> GetInt(const Json& obj, const std::string& key, int64_t lo, int64_t hi) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    throw Invalid(key, absl::StrCat(key, ": expected an integer, got ", TypeName(*v)));
  }
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo))) {
      throw Invalid(key, absl::StrCat(key, ": must be in [", lo, ", ", hi, "]"));
    }
    return static_cast<int64_t>(u);
  }
  int64_t i = v->get<int64_t>();
  if (i < lo || i > hi) throw Invalid(key, absl::StrCat(key, ": must be in [", lo, ", ", hi, "]"));
  return i;
}

std::optional<bool> GetBool(const Json& obj, const std::string& key) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) {
    throw Invalid(key, absl::StrCat(key, ": expected a boolean, got ", TypeName(*v)));
  }
  return v->get<bool>();
}

std::optional<std::string> GetString(const Json& obj, const std::string& key) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) {
    throw Invalid(key, absl::StrCat(key, ": expected a string, got ", TypeName(*v)));
  }
  return v->get<std::string>();
}

GenerationParams ParseGenerationParams(const Json& body, bool chat) {
  GenerationParams p;
  if (auto v = GetNumber(body, "temperature", 0.0, 2.0)) p.sampling.temperature = float(*v);
  if (auto v = GetNumber(body, "top_p", 0.0, 1.0)) {
    if (*v <= 0.0) throw Invalid("top_p", "top_p: must be in (0, 1]");
    p.sampling.top_p = float(*v);
  }
  if (auto v = GetInt(body, "top_k", -1, std::numeric_limits<int32_t>::max())) {
    p.sampling.top_k = int32_t(*v);
  }
  constexpr int64_t kMaxTok = std::numeric_limits<int32_t>::max();
  p.max_tokens = GetInt(body, "max_tokens", 1, kMaxTok);
  if (chat) {
    if (auto v = GetInt(body, "max_completion_tokens", 1, kMaxTok)) p.max_tokens = v;
  }
  if (auto v = GetInt(body, "seed", std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max())) {
    p.sampling.seed = static_cast<uint64_t>(*v);
  }
  if (auto v = GetInt(body, "n", 1, 1)) (void)v;
  if (const Json* stop = Field(body, "stop")) {
    bool ok = stop->is_string();
    if (stop->is_array()) {
      ok = stop->size() <= 4;
      for (const auto& s : *stop) ok = ok && s.is_string();
    }
    if (!ok) throw Invalid("stop", "stop: expected a string or an array of up to 4 strings");
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else {
      for (const auto& s : *stop) p.stop.push_back(s.get<std::string>());
    }
  }
  if (chat) {
    const bool logprobs = GetBool(body, "logprobs").value_or(false);
    const auto top = GetInt(body, "top_logprobs", 0, kMaxTopLogprobs);
    if (top && !logprobs) {
      throw Invalid("top_logprobs", "top_logprobs: requires logprobs to be true");
    }
    if (logprobs) p.sampling.top_logprobs = static_cast<int32_t>(top.value_or(0));
  } else if (auto v = GetInt(body, "logprobs", 0, kMaxTopLogprobs)) {
    p.sampling.top_logprobs = static_cast<int32_t>(*v);
  }
  p.stream = GetBool(body, "stream").value_or(false);
  if (const Json* so = Field(body, "stream_options")) {
    if (!so->is_object()) {
      throw Invalid("stream_options",
                    absl::StrCat("stream_options: expected an object, got ", TypeName(*so)));
    }
    if (const Json* iu = Field(*so, "include_usage")) {
      if (!iu->is_boolean()) {
        throw Invalid("stream_options.include_usage",
                      "stream_options.include_usage: expected a boolean");
      }
      p.include_usage = iu->get<bool>();
    }
  }
  return p;
}

void ParseThinking(const Json& body, chat::EncodeOptions* opts) {
  if (auto v = GetString(body, "reasoning_effort")) opts->reasoning_effort = *v;
  const Json* kw = Field(body, "chat_template_kwargs");
  if (!kw) return;
  if (!kw->is_object()) {
    throw Invalid("chat_template_kwargs",
                  absl::StrCat("chat_template_kwargs: expected an object, got ", TypeName(*kw)));
  }
  for (const char* key : {"thinking", "enable_thinking"}) {
    if (const Json* v = Field(*kw, key)) {
      if (!v->is_boolean()) {
        throw Invalid(absl::StrCat("chat_template_kwargs.", key),
                      absl::StrCat("chat_template_kwargs.", key, ": expected a boolean"));
      }
      opts->mode = v->get<bool>() ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
    }
  }
  if (const Json* v = Field(*kw, "thinking_mode")) {
    if (!v->is_string() || (*v != "thinking" && *v != "chat")) {
      throw Invalid("chat_template_kwargs.thinking_mode",
                    "chat_template_kwargs.thinking_mode: expected \"thinking\" or \"chat\"");
    }
    opts->mode = *v == "thinking" ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
  }
  if (const Json* v = Field(*kw, "reasoning_effort")) {
    if (!v->is_string()) {
      throw Invalid("chat_template_kwargs.reasoning_effort",
                    "chat_template_kwargs.reasoning_effort: expected a string");
    }
    opts->reasoning_effort = v->get<std::string>();
  }
}

}  // namespace ss::openai
