#include "coordinator/anthropic_api.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/openai_request.h"

namespace ss::anthropic {
namespace {

using openai::Dump;
using openai::Invalid;
using openai::TypeName;

// Fields this mapping reads, and labels that change nothing.
const std::set<std::string>& KnownFields() {
  static const std::set<std::string> k{"model",       "messages",     "system",   "max_tokens",
                                       "temperature", "top_p",        "top_k",    "stream",
                                       "tools",       "tool_choice",  "thinking", "stop_sequences",
                                       "metadata",    "output_config"};
  return k;
}

// A string, or an array of text blocks, as one string; `where` names it in errors.
absl::StatusOr<std::string> TextOf(const Json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) return Invalid(where, absl::StrCat(where, ": expected a string or blocks"));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& b = v[i];
    const std::string at = absl::StrCat(where, "[", i, "]");
    if (!b.is_object() || !b.contains("type") || b["type"] != "text" || !b.contains("text") ||
        !b["text"].is_string()) {
      return Invalid(where, absl::StrCat(at, ": only text blocks are supported here"));
    }
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
  }
  return out;
}

// One Anthropic message as OpenAI messages (a user's tool results become tool messages first).
absl::Status AddMessage(const Json& m, size_t i, Json& out) {
  const std::string where = absl::StrCat("messages[", i, "]");
  if (!m.is_object()) return Invalid("messages", absl::StrCat(where, ": expected an object"));
  const Json* role = m.contains("role") ? &m["role"] : nullptr;
  if (!role || !role->is_string() ||
      (*role != "user" && *role != "assistant" && *role != "system")) {
    return Invalid("messages", absl::StrCat(where, ".role: expected \"user\", \"assistant\" or ",
                                            "\"system\", got ", role ? Dump(*role) : "nothing"));
  }
  if (*role == "system") {
    // Claude Code sends system messages between the turns. DeepSeek-V4's template has a system
    // prompt only at the start and answers only after a user turn, so the text joins the user
    // turn it follows (or starts one), where it stays for every later request: the prefix the
    // cache holds does not change.
    if (!m.contains("content"))
      return Invalid("messages", absl::StrCat(where, ".content: required"));
    auto text = TextOf(m["content"], absl::StrCat(where, ".content"));
    if (!text.ok()) return Invalid("messages", text.status().message());
    if (!out.empty() && out.back()["role"] == "user" && out.back()["content"].is_string()) {
      out.back()["content"] = absl::StrCat(out.back()["content"].get<std::string>(), "\n\n", *text);
    } else {
      out.push_back(Json{{"role", "user"}, {"content", *text}});
    }
    return absl::OkStatus();
  }
  const bool user = *role == "user";
  if (!m.contains("content")) return Invalid("messages", absl::StrCat(where, ".content: required"));
  const Json& content = m["content"];
  if (content.is_string()) {
    out.push_back(Json{{"role", *role}, {"content", content}});
    return absl::OkStatus();
  }
  if (!content.is_array()) {
    return Invalid("messages", absl::StrCat(where, ".content: expected a string or blocks"));
  }
  std::string text, reasoning;
  Json calls = Json::array();
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& b = content[k];
    const std::string at = absl::StrCat(where, ".content[", k, "]");
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) {
      return Invalid("messages", absl::StrCat(at, ": expected a block with a type"));
    }
    const std::string type = b["type"];
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) {
        return Invalid("messages", absl::StrCat(at, ".text: expected a string"));
      }
      text += b["text"].get<std::string>();
    } else if (type == "tool_result" && user) {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) {
        return Invalid("messages", absl::StrCat(at, ".tool_use_id: expected a string"));
      }
      std::string result;
      if (b.contains("content")) {
        auto r = TextOf(b["content"], absl::StrCat(at, ".content"));
        if (!r.ok()) return Invalid("messages", r.status().message());
        result = *std::move(r);
      }
      if (b.value("is_error", false)) result = absl::StrCat("Error: ", result);
      out.push_back(
          Json{{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
    } else if (type == "tool_use" && !user) {
      if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") ||
          !b["name"].is_string()) {
        return Invalid("messages", absl::StrCat(at, ": tool_use needs a string id and name"));
      }
      const Json input = b.contains("input") ? b["input"] : Json::object();
      calls.push_back(Json{{"id", b["id"]},
                           {"type", "function"},
                           {"function", {{"name", b["name"]}, {"arguments", Dump(input)}}}});
    } else if ((type == "thinking" || type == "redacted_thinking") && !user) {
      if (b.contains("thinking") && b["thinking"].is_string()) {
        reasoning += b["thinking"].get<std::string>();
      }
    } else {
      return Invalid("messages", absl::StrCat(at, ": a ", type, " block is not supported in a ",
                                              user ? "user" : "assistant", " message"));
    }
  }
  if (user) {
    if (!text.empty() || calls.empty()) {
      // A user message of tool results only adds no empty user turn.
      bool only_results = !content.empty();
      for (const Json& b : content) only_results = only_results && b["type"] == "tool_result";
      if (!only_results) out.push_back(Json{{"role", "user"}, {"content", text}});
    }
    return absl::OkStatus();
  }
  Json msg{{"role", "assistant"}, {"content", text}};
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  out.push_back(std::move(msg));
  return absl::OkStatus();
}

absl::Status MapTools(const Json& body, Json& chat) {
  if (!body.contains("tools")) return absl::OkStatus();
  const Json& tools = body["tools"];
  if (!tools.is_array()) return Invalid("tools", "tools: expected an array");
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string at = absl::StrCat("tools[", i, "]");
    if (!t.is_object()) return Invalid("tools", absl::StrCat(at, ": expected an object"));
    if (t.contains("type") && t["type"] != "custom") {
      return Invalid("tools", absl::StrCat(at, ": server tools (type ", Dump(t["type"]),
                                           ") are not supported; only client tools"));
    }
    if (!t.contains("name") || !t["name"].is_string()) {
      return Invalid("tools", absl::StrCat(at, ".name: expected a string"));
    }
    Json fn{{"name", t["name"]}};
    if (t.contains("description")) fn["description"] = t["description"];
    fn["parameters"] = t.contains("input_schema") ? t["input_schema"] : Json::object();
    out.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  chat["tools"] = std::move(out);
  if (!body.contains("tool_choice")) return absl::OkStatus();
  const Json& tc = body["tool_choice"];
  if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string()) {
    return Invalid("tool_choice", "tool_choice: expected an object with a type");
  }
  const std::string type = tc["type"];
  if (type == "auto") {
    chat["tool_choice"] = "auto";
  } else if (type == "any") {
    chat["tool_choice"] = "required";
  } else if (type == "none") {
    chat["tool_choice"] = "none";
  } else if (type == "tool") {
    if (!tc.contains("name") || !tc["name"].is_string()) {
      return Invalid("tool_choice", "tool_choice.name: required with type \"tool\"");
    }
    chat["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", tc["name"]}}}};
  } else {
    return Invalid("tool_choice",
                   absl::StrCat("tool_choice.type: unknown value ", Dump(tc["type"])));
  }
  if (tc.value("disable_parallel_tool_use", false)) chat["parallel_tool_calls"] = false;
  return absl::OkStatus();
}

absl::Status MapThinking(const Json& body, ChatRequest& r) {
  bool thinking = false;
  if (body.contains("thinking")) {
    const Json& t = body["thinking"];
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string()) {
      return Invalid("thinking", "thinking: expected {\"type\": \"enabled\" | \"disabled\"}");
    }
    if (t["type"] == "enabled") {
      thinking = true;
      const Json* budget = t.contains("budget_tokens") ? &t["budget_tokens"] : nullptr;
      if (!budget || !budget->is_number_integer() || budget->get<int64_t>() < 1) {
        return Invalid("thinking", "thinking.budget_tokens: a positive integer is required");
      }
      r.ignored.push_back("thinking.budget_tokens");
    } else if (t["type"] == "adaptive") {
      thinking = true;  // the model decides how much to think: DeepSeek-V4's thinking mode
    } else if (t["type"] != "disabled") {
      return Invalid("thinking", absl::StrCat("thinking.type: unknown value ", Dump(t["type"])));
    }
  }
  Json kwargs{{"thinking", thinking}};
  // output_config.effort: low | medium | high -> the standard effort, max -> DeepSeek-V4's max.
  if (body.contains("output_config")) {
    const Json& oc = body["output_config"];
    if (!oc.is_object()) return Invalid("output_config", "output_config: expected an object");
    for (const auto& [key, value] : oc.items()) {
      if (key != "effort") r.ignored.push_back(absl::StrCat("output_config.", key));
    }
    if (oc.contains("effort")) {
      const Json& e = oc["effort"];
      if (!e.is_string() || (e != "low" && e != "medium" && e != "high" && e != "max")) {
        return Invalid("output_config",
                       "output_config.effort: expected \"low\", \"medium\", \"high\" or \"max\"");
      }
      if (thinking && e == "max") kwargs["reasoning_effort"] = "max";
    }
  }
  r.body["chat_template_kwargs"] = std::move(kwargs);
  return absl::OkStatus();
}

std::string StopReason(const Json& choice) {
  const std::string finish = choice.value("finish_reason", "stop");
  if (finish == "length") return "max_tokens";
  if (finish == "tool_calls") return "tool_use";
  if (choice.contains("stop_reason") && choice["stop_reason"].is_string()) return "stop_sequence";
  return "end_turn";
}

Json Usage(const Json& usage) {
  const int64_t cached = usage.contains("prompt_tokens_details")
                             ? usage["prompt_tokens_details"].value("cached_tokens", 0)
                             : 0;
  return Json{{"input_tokens", usage.value("prompt_tokens", 0) - cached},
              {"output_tokens", usage.value("completion_tokens", 0)},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", cached}};
}

Json ToolInput(const Json& call) {
  const std::string args = call["function"].value("arguments", "{}");
  Json input = Json::parse(args, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : Json::object();
}

}  // namespace

absl::StatusOr<ChatRequest> ToChatRequest(const Json& body) {
  ChatRequest r;
  for (const auto& [key, value] : body.items()) {
    if (!KnownFields().contains(key)) r.ignored.push_back(key);
  }
  Json& chat = r.body;
  chat = Json::object();
  if (body.contains("model")) chat["model"] = body["model"];
  if (!body.contains("max_tokens")) return Invalid("max_tokens", "max_tokens: required");
  chat["max_tokens"] = body["max_tokens"];
  for (const char* k : {"temperature", "top_p", "top_k", "stream"}) {
    if (body.contains(k)) chat[k] = body[k];
  }
  if (body.value("stream", false) == true) chat["stream_options"] = Json{{"include_usage", true}};
  if (body.contains("stop_sequences")) chat["stop"] = body["stop_sequences"];
  Json messages = Json::array();
  if (body.contains("system")) {
    auto system = TextOf(body["system"], "system");
    if (!system.ok()) return system.status();
    messages.push_back(Json{{"role", "system"}, {"content", *system}});
  }
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    return Invalid("messages", "messages: expected a non-empty array");
  }
  for (size_t i = 0; i < body["messages"].size(); ++i) {
    if (absl::Status s = AddMessage(body["messages"][i], i, messages); !s.ok()) return s;
  }
  chat["messages"] = std::move(messages);
  if (absl::Status s = MapTools(body, chat); !s.ok()) return s;
  if (absl::Status s = MapThinking(body, r); !s.ok()) return s;
  return r;
}

Json ToMessage(const Json& completion, const std::string& id) {
  const Json& choice = completion["choices"][0];
  const Json& msg = choice["message"];
  Json content = Json::array();
  if (msg.contains("reasoning_content") && msg["reasoning_content"].is_string() &&
      !msg["reasoning_content"].get<std::string>().empty()) {
    content.push_back(
        Json{{"type", "thinking"}, {"thinking", msg["reasoning_content"]}, {"signature", ""}});
  }
  if (msg.contains("content") && msg["content"].is_string() &&
      !msg["content"].get<std::string>().empty()) {
    content.push_back(Json{{"type", "text"}, {"text", msg["content"]}});
  }
  if (msg.contains("tool_calls")) {
    for (const Json& call : msg["tool_calls"]) {
      content.push_back(Json{{"type", "tool_use"},
                             {"id", call["id"]},
                             {"name", call["function"]["name"]},
                             {"input", ToolInput(call)}});
    }
  }
  const std::string reason = StopReason(choice);
  return Json{{"id", id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", completion["model"]},
              {"content", std::move(content)},
              {"stop_reason", reason},
              {"stop_sequence", reason == "stop_sequence" ? choice["stop_reason"] : Json(nullptr)},
              {"usage", Usage(completion["usage"])}};
}

Json ErrorBody(int status, const std::string& message) {
  std::string type = "api_error";
  switch (status) {
    case 400:
    case 405:
    case 422:
      type = "invalid_request_error";
      break;
    case 401:
      type = "authentication_error";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      break;
    case 413:
      type = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      break;
    case 503:
    case 529:
      type = "overloaded_error";
      break;
    default:
      break;
  }
  return Json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

MessageStream::MessageStream(std::string id, std::string model, size_t input_tokens)
    : id_(std::move(id)), model_(std::move(model)), input_tokens_(input_tokens) {}

std::string MessageStream::Event(const char* type, const Json& data) {
  return absl::StrCat("event: ", type, "\ndata: ", Dump(data), "\n\n");
}

std::string MessageStream::StartBlock(const char* type, Json block) {
  std::string out = StopBlock();
  block_ = type;
  ++index_;
  return out + Event("content_block_start", Json{{"type", "content_block_start"},
                                                 {"index", index_},
                                                 {"content_block", std::move(block)}});
}

std::string MessageStream::StopBlock() {
  if (block_.empty()) return "";
  block_.clear();
  return Event("content_block_stop", Json{{"type", "content_block_stop"}, {"index", index_}});
}

std::string MessageStream::Chunk(const Json& chunk) {
  std::string out;
  if (!started_) {
    started_ = true;
    out += Event("message_start",
                 Json{{"type", "message_start"},
                      {"message",
                       {{"id", id_},
                        {"type", "message"},
                        {"role", "assistant"},
                        {"model", model_},
                        {"content", Json::array()},
                        {"stop_reason", nullptr},
                        {"stop_sequence", nullptr},
                        {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", 0}}}}}});
  }
  if (stopped_) return out;
  const Json& choices = chunk.contains("choices") ? chunk["choices"] : Json::array();
  if (choices.empty()) {
    if (chunk.contains("usage") && chunk["usage"].is_object()) out += Finish(&chunk["usage"]);
    return out;
  }
  const Json& choice = choices[0];
  const Json& delta = choice.contains("delta") ? choice["delta"] : Json::object();
  const auto text_of = [&](const char* key) {
    return delta.contains(key) && delta[key].is_string() ? delta[key].get<std::string>()
                                                         : std::string();
  };
  if (const std::string r = text_of("reasoning_content"); !r.empty()) {
    if (block_ != "thinking") {
      out +=
          StartBlock("thinking", Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    }
    out += Event("content_block_delta",
                 Json{{"type", "content_block_delta"},
                      {"index", index_},
                      {"delta", {{"type", "thinking_delta"}, {"thinking", r}}}});
  }
  if (const std::string t = text_of("content"); !t.empty()) {
    if (block_ != "text") out += StartBlock("text", Json{{"type", "text"}, {"text", ""}});
    out += Event("content_block_delta", Json{{"type", "content_block_delta"},
                                             {"index", index_},
                                             {"delta", {{"type", "text_delta"}, {"text", t}}}});
  }
  if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
    for (const Json& call : delta["tool_calls"]) {
      out += StartBlock("tool_use", Json{{"type", "tool_use"},
                                         {"id", call["id"]},
                                         {"name", call["function"]["name"]},
                                         {"input", Json::object()}});
      out += Event(
          "content_block_delta",
          Json{{"type", "content_block_delta"},
               {"index", index_},
               {"delta", {{"type", "input_json_delta"}, {"partial_json", Dump(ToolInput(call))}}}});
      out += StopBlock();
    }
  }
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
    out += StopBlock();
    stop_reason_ = StopReason(choice);
    if (stop_reason_ == "stop_sequence") stop_sequence_ = choice["stop_reason"];
  }
  return out;
}

std::string MessageStream::Finish(const Json* usage) {
  if (stopped_) return "";
  stopped_ = true;
  Json u = Json{{"output_tokens", 0}};
  if (usage) {
    const Json full = Usage(*usage);
    u = Json{{"input_tokens", full["input_tokens"]},
             {"output_tokens", full["output_tokens"]},
             {"cache_read_input_tokens", full["cache_read_input_tokens"]}};
  }
  return StopBlock() +
         Event("message_delta",
               Json{{"type", "message_delta"},
                    {"delta", {{"stop_reason", stop_reason_}, {"stop_sequence", stop_sequence_}}},
                    {"usage", std::move(u)}}) +
         Event("message_stop", Json{{"type", "message_stop"}});
}

std::string MessageStream::Done() {
  std::string out;
  if (!started_) out = Chunk(Json{{"choices", Json::array()}});
  return out + Finish(nullptr);
}

std::string MessageStream::Error(const std::string& message) {
  stopped_ = true;
  return Event("error",
               Json{{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}});
}

}  // namespace ss::anthropic
