#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/openai_render.h"
#include "coordinator/openai_server_impl.h"

namespace ss {
namespace {

using gateway::SendJson;
using openai::Field;
using openai::GetBool;
using openai::GetString;
using openai::Invalid;
using openai::Json;
using openai::ParseBody;

}  // namespace

absl::Status OpenAiServer::Impl::HandleTokenize(const httplib::Request& req,
                                                httplib::Response& res) {
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

absl::Status OpenAiServer::Impl::HandleDetokenize(const httplib::Request& req,
                                                  httplib::Response& res) {
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

absl::Status OpenAiServer::Impl::HandlePing(const httplib::Request&, httplib::Response& res) {
  res.status = 200;
  res.set_content("{}", "application/json");
  return absl::OkStatus();
}

absl::Status OpenAiServer::Impl::HandleVersion(const httplib::Request&, httplib::Response& res) {
  SendJson(res, Json{{"version", config.version}});
  return absl::OkStatus();
}

absl::Status OpenAiServer::Impl::HandleLoad(const httplib::Request&, httplib::Response& res) {
  SendJson(res, Json{{"server_load", gm->open_requests()}});
  return absl::OkStatus();
}

absl::Status OpenAiServer::Impl::HandleModels(const httplib::Request&, httplib::Response& res) {
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

absl::Status OpenAiServer::Impl::HandleMetrics(const httplib::Request&, httplib::Response& res) {
  gm->Scrape(config.engine_gauges ? config.engine_gauges() : EngineGauges{});
  res.status = 200;
  res.set_content(registry->Serialize(), "text/plain; version=0.0.4");
  return absl::OkStatus();
}

}  // namespace ss
