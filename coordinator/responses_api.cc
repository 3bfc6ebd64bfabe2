#include "coordinator/responses_api.h"

#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/openai_request.h"

namespace ss::responses {
namespace {

using openai::Dump;
using openai::Invalid;

const std::set<std::string>& KnownFields() {
  static const std::set<std::string> k{"model",
                                       "input",
                                       "instructions",
                                       "tools",
                                       "tool_choice",
                                       "reasoning",
                                       "text",
                                       "stream",
                                       "temperature",
                                       "top_p",
                                       "max_output_tokens",
                                       "parallel_tool_calls",
                                       "previous_response_id",
                                       "store",
                                       "metadata",
                                       "user",
                                       "truncation",
                                       "include"};
  return k;
}

std::string ItemId(const ResponseMeta& meta, const char* prefix, int index) {
  const std::string base = absl::StartsWith(meta.id, "resp_") ? meta.id.substr(5) : meta.id;
  return absl::StrCat(prefix, "_", base, "_", index);
}

// A message item's content (a string, or input_text / output_text parts) as text.
absl::StatusOr<std::string> ContentText(const Json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return Invalid("input", absl::StrCat(where, ": expected a string or parts"));
  std::string out;
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& p = content[k];
    const std::string type = p.is_object() ? p.value("type", "") : "";
    if ((type != "input_text" && type != "output_text" && type != "text") || !p.contains("text") ||
        !p["text"].is_string()) {
      return Invalid("input", absl::StrCat(where, "[", k, "]: a ", type.empty() ? "non-text" : type,
                                           " part is not supported (text only)"));
    }
    out += p["text"].get<std::string>();
  }
  return out;
}

absl::Status AddItems(const Json& input, Json& messages) {
  std::string reasoning;  // for the next assistant message
  // The assistant message a function_call joins: the one just before it (its text, or the calls
  // before it), else a new one.
  auto assistant = [&]() -> Json& {
    if (messages.empty() || messages.back()["role"] != "assistant") {
      messages.push_back(Json{{"role", "assistant"}, {"content", ""}});
    }
    Json& m = messages.back();
    if (!reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, "");
    return m;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& it = input[i];
    const std::string where = absl::StrCat("input[", i, "]");
    if (!it.is_object()) return Invalid("input", absl::StrCat(where, ": expected an object"));
    const std::string type = it.value("type", it.contains("role") ? "message" : "");
    if (type == "message") {
      const std::string role = it.value("role", "");
      if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
        return Invalid("input",
                       absl::StrCat(where, ".role: expected user, assistant, system or developer"));
      }
      if (!it.contains("content"))
        return Invalid("input", absl::StrCat(where, ".content: required"));
      auto text = ContentText(it["content"], absl::StrCat(where, ".content"));
      if (!text.ok()) return text.status();
      if (role == "assistant") {
        Json msg{{"role", "assistant"}, {"content", *text}};
        if (!reasoning.empty()) msg["reasoning_content"] = std::exchange(reasoning, "");
        messages.push_back(std::move(msg));
      } else {
        messages.push_back(
            Json{{"role", role == "developer" ? "system" : role}, {"content", *text}});
      }
    } else if (type == "function_call") {
      if (!it.contains("call_id") || !it["call_id"].is_string() || !it.contains("name") ||
          !it["name"].is_string()) {
        return Invalid("input", absl::StrCat(where, ": function_call needs call_id and name"));
      }
      const Json args = it.contains("arguments") ? it["arguments"] : Json("{}");
      if (!args.is_string())
        return Invalid("input", absl::StrCat(where, ".arguments: expected a string"));
      Json& m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = Json::array();
      m["tool_calls"].push_back(Json{{"id", it["call_id"]},
                                     {"type", "function"},
                                     {"function", {{"name", it["name"]}, {"arguments", args}}}});
    } else if (type == "function_call_output") {
      if (!it.contains("call_id") || !it["call_id"].is_string()) {
        return Invalid("input", absl::StrCat(where, ".call_id: expected a string"));
      }
      const Json& out = it.contains("output") ? it["output"] : Json("");
      auto text = ContentText(out, absl::StrCat(where, ".output"));
      if (!text.ok()) return text.status();
      messages.push_back(
          Json{{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", *text}});
    } else if (type == "reasoning") {
      for (const char* key : {"content", "summary"}) {
        if (!it.contains(key) || !it[key].is_array()) continue;
        for (const Json& p : it[key]) {
          if (p.is_object() && p.contains("text") && p["text"].is_string()) {
            reasoning += p["text"].get<std::string>();
          }
        }
        if (!reasoning.empty()) break;
      }
    } else {
      return Invalid("input", absl::StrCat(where, ": a ", type.empty() ? "typeless" : type,
                                           " item is not supported"));
    }
  }
  return absl::OkStatus();
}

// A function tool in chat's shape, or a 400 naming `at`.
absl::StatusOr<Json> FunctionTool(const Json& t, const std::string& at) {
  if (!t.contains("name") || !t["name"].is_string()) {
    return Invalid("tools", absl::StrCat(at, ".name: expected a string"));
  }
  Json fn{{"name", t["name"]}};
  if (t.contains("description")) fn["description"] = t["description"];
  fn["parameters"] = t.contains("parameters") ? t["parameters"] : Json::object();
  return Json{{"type", "function"}, {"function", std::move(fn)}};
}

// Function tools are mapped, a namespace's function tools are mapped by their own names, and
// built-in tools (web_search, file_search, ...: Codex always sends web_search) are dropped and
// reported as ignored.
absl::Status MapTools(const Json& body, Json& chat, std::vector<std::string>& ignored) {
  if (body.contains("tools")) {
    const Json& tools = body["tools"];
    if (!tools.is_array()) return Invalid("tools", "tools: expected an array");
    Json out = Json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const Json& t = tools[i];
      const std::string at = absl::StrCat("tools[", i, "]");
      const std::string type = t.is_object() ? t.value("type", "") : "";
      if (type == "function") {
        auto fn = FunctionTool(t, at);
        if (!fn.ok()) return fn.status();
        out.push_back(*std::move(fn));
      } else if (type == "namespace" && t.contains("tools") && t["tools"].is_array()) {
        for (size_t k = 0; k < t["tools"].size(); ++k) {
          const Json& inner = t["tools"][k];
          if (!inner.is_object() || inner.value("type", "") != "function") continue;
          auto fn = FunctionTool(inner, absl::StrCat(at, ".tools[", k, "]"));
          if (!fn.ok()) return fn.status();
          out.push_back(*std::move(fn));
        }
      } else {
        ignored.push_back(absl::StrCat("tools.", type.empty() ? "untyped" : type));
      }
    }
    chat["tools"] = std::move(out);
  }
  if (body.contains("tool_choice")) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string()) {
      chat["tool_choice"] = tc;
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name")) {
      chat["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      return Invalid("tool_choice", "tool_choice: expected auto, none, required or a function");
    }
  }
  if (body.contains("parallel_tool_calls"))
    chat["parallel_tool_calls"] = body["parallel_tool_calls"];
  return absl::OkStatus();
}

absl::Status MapText(const Json& body, Json& chat) {
  if (!body.contains("text")) return absl::OkStatus();
  const Json& text = body["text"];
  if (!text.is_object()) return Invalid("text", "text: expected an object");
  if (!text.contains("format")) return absl::OkStatus();
  const Json& f = text["format"];
  const std::string type = f.is_object() ? f.value("type", "") : "";
  if (type == "text") return absl::OkStatus();
  if (type == "json_object") {
    chat["response_format"] = Json{{"type", "json_object"}};
  } else if (type == "json_schema") {
    Json schema{{"name", f.value("name", "response")}};
    if (f.contains("schema")) schema["schema"] = f["schema"];
    if (f.contains("strict")) schema["strict"] = f["strict"];
    chat["response_format"] = Json{{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  } else {
    return Invalid("text", "text.format.type: expected text, json_object or json_schema");
  }
  return absl::OkStatus();
}

Json Usage(const Json& usage) {
  const int64_t cached = usage.contains("prompt_tokens_details")
                             ? usage["prompt_tokens_details"].value("cached_tokens", 0)
                             : 0;
  const int64_t in = usage.value("prompt_tokens", 0), out = usage.value("completion_tokens", 0);
  return Json{{"input_tokens", in},
              {"input_tokens_details", {{"cached_tokens", cached}}},
              {"output_tokens", out},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", in + out}};
}

Json ReasoningPart(const std::string& text) {
  return Json{{"type", "reasoning_text"}, {"text", text}};
}

Json ReasoningItem(const std::string& id, const std::string& text) {
  return Json{{"type", "reasoning"},
              {"id", id},
              {"summary", Json::array()},
              {"content", Json::array({ReasoningPart(text)})},
              {"status", "completed"}};
}

Json TextPart(const std::string& text) {
  return Json{{"type", "output_text"},
              {"text", text},
              {"annotations", Json::array()},
              {"logprobs", Json::array()}};
}

Json MessageItem(const std::string& id, const std::string& text, const char* status) {
  return Json{{"type", "message"},
              {"id", id},
              {"status", status},
              {"role", "assistant"},
              {"content", Json::array({TextPart(text)})}};
}

Json CallItem(const std::string& id, const Json& call) {
  return Json{{"type", "function_call"},
              {"id", id},
              {"call_id", call["id"]},
              {"name", call["function"]["name"]},
              {"arguments", call["function"].value("arguments", "{}")},
              {"status", "completed"}};
}

// The response object around `output`, echoing the request.
Json Envelope(const ResponseMeta& meta, const char* status, Json output, const Json& usage,
              bool incomplete) {
  const Json& r = meta.request;
  Json reasoning = r.contains("reasoning") ? r["reasoning"] : Json{{"effort", nullptr}};
  if (!reasoning.contains("summary")) reasoning["summary"] = nullptr;
  return Json{
      {"id", meta.id},
      {"object", "response"},
      {"created_at", meta.created_at},
      {"status", status},
      {"error", nullptr},
      {"incomplete_details", incomplete ? Json{{"reason", "max_output_tokens"}} : Json(nullptr)},
      {"instructions", r.value("instructions", Json())},
      {"max_output_tokens", r.value("max_output_tokens", Json())},
      {"model", meta.model},
      {"output", std::move(output)},
      {"parallel_tool_calls", r.value("parallel_tool_calls", true)},
      {"previous_response_id", r.value("previous_response_id", Json())},
      {"reasoning", std::move(reasoning)},
      {"store", r.value("store", true)},
      {"temperature", r.value("temperature", 1.0)},
      {"text", r.value("text", Json{{"format", {{"type", "text"}}}})},
      {"tool_choice", r.value("tool_choice", Json("auto"))},
      {"tools", r.value("tools", Json::array())},
      {"top_p", r.value("top_p", 1.0)},
      {"truncation", "disabled"},
      {"usage", usage.is_null() ? Json(nullptr) : Usage(usage)},
      {"user", r.value("user", Json())},
      {"metadata", r.value("metadata", Json::object())}};
}

}  // namespace

absl::StatusOr<ChatRequest> ToChatRequest(const Json& body, const Json* previous) {
  ChatRequest r;
  for (const auto& [key, value] : body.items()) {
    if (!KnownFields().contains(key)) r.ignored.push_back(key);
  }
  if (body.contains("truncation") && body["truncation"] != "disabled") {
    return Invalid("truncation", "truncation: only \"disabled\" is supported");
  }
  if (body.contains("include")) {
    if (!body["include"].is_array()) return Invalid("include", "include: expected an array");
    for (const Json& v : body["include"]) {
      // Reasoning is returned in the clear (reasoning_text), never encrypted.
      r.ignored.push_back(absl::StrCat("include.", v.is_string() ? v.get<std::string>() : "?"));
    }
  }
  Json& chat = r.body;
  chat = Json::object();
  if (body.contains("model")) chat["model"] = body["model"];
  for (const char* k : {"temperature", "top_p", "stream"}) {
    if (body.contains(k)) chat[k] = body[k];
  }
  if (body.contains("max_output_tokens")) chat["max_tokens"] = body["max_output_tokens"];
  if (body.value("stream", false) == true) chat["stream_options"] = Json{{"include_usage", true}};
  Json messages = Json::array();
  if (body.contains("instructions") && !body["instructions"].is_null()) {
    if (!body["instructions"].is_string()) {
      return Invalid("instructions", "instructions: expected a string");
    }
    messages.push_back(Json{{"role", "system"}, {"content", body["instructions"]}});
  }
  if (previous && previous->is_array()) {
    for (const Json& m : *previous) {
      if (m.value("role", "") != "system") messages.push_back(m);  // this turn's instructions
    }
  }
  if (!body.contains("input")) return Invalid("input", "input: required");
  const Json& input = body["input"];
  if (input.is_string()) {
    messages.push_back(Json{{"role", "user"}, {"content", input}});
  } else if (input.is_array()) {
    if (absl::Status s = AddItems(input, messages); !s.ok()) return s;
  } else {
    return Invalid("input", "input: expected a string or an array of items");
  }
  chat["messages"] = std::move(messages);
  if (absl::Status s = MapTools(body, chat, r.ignored); !s.ok()) return s;
  if (absl::Status s = MapText(body, chat); !s.ok()) return s;
  if (body.contains("reasoning")) {
    const Json& re = body["reasoning"];
    if (!re.is_object()) return Invalid("reasoning", "reasoning: expected an object");
    if (re.contains("effort") && !re["effort"].is_null()) chat["reasoning_effort"] = re["effort"];
    if (re.contains("summary") && !re["summary"].is_null())
      r.ignored.push_back("reasoning.summary");
  }
  return r;
}

Json AssistantMessage(const Json& completion) {
  const Json& msg = completion["choices"][0]["message"];
  // A streamed message of reasoning or tool calls only has no "content" (a const operator[] on a
  // missing key is undefined behaviour): value() only.
  Json content = msg.value("content", Json(""));
  Json m{{"role", "assistant"}, {"content", content.is_string() ? std::move(content) : Json("")}};
  if (msg.contains("reasoning_content")) m["reasoning_content"] = msg["reasoning_content"];
  if (msg.contains("tool_calls")) m["tool_calls"] = msg["tool_calls"];
  return m;
}

Json ToResponse(const Json& completion, const ResponseMeta& meta) {
  const Json& choice = completion["choices"][0];
  const Json& msg = choice["message"];
  Json output = Json::array();
  if (msg.contains("reasoning_content") && msg["reasoning_content"].is_string() &&
      !msg["reasoning_content"].get<std::string>().empty()) {
    output.push_back(ReasoningItem(ItemId(meta, "rs", static_cast<int>(output.size())),
                                   msg["reasoning_content"]));
  }
  if (msg.contains("content") && msg["content"].is_string() &&
      !msg["content"].get<std::string>().empty()) {
    output.push_back(MessageItem(ItemId(meta, "msg", static_cast<int>(output.size())),
                                 msg["content"], "completed"));
  }
  if (msg.contains("tool_calls")) {
    for (const Json& call : msg["tool_calls"]) {
      output.push_back(CallItem(ItemId(meta, "fc", static_cast<int>(output.size())), call));
    }
  }
  const bool incomplete = choice.value("finish_reason", "") == "length";
  return Envelope(meta, incomplete ? "incomplete" : "completed", std::move(output),
                  completion.value("usage", Json()), incomplete);
}

ResponseStream::ResponseStream(ResponseMeta meta, std::function<void(const Json&)> on_done)
    : meta_(std::move(meta)), on_done_(std::move(on_done)) {
  completion_ =
      Json{{"model", meta_.model},
           {"choices",
            Json::array({Json{{"message", {{"role", "assistant"}}}, {"finish_reason", nullptr}}})},
           {"usage", nullptr}};
}

std::string ResponseStream::Event(const std::string& type, Json data) {
  Json e{{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [k, v] : data.items()) e[k] = std::move(v);
  return absl::StrCat("event: ", type, "\ndata: ", Dump(e), "\n\n");
}

Json ResponseStream::Shell(const char* status) const {
  return Envelope(meta_, status, Json::array(), Json(), false);
}

std::string ResponseStream::Open(const std::string& kind) {
  std::string out = Close();
  kind_ = kind;
  ++output_index_;
  text_.clear();
  item_id_ = ItemId(meta_, kind == "reasoning" ? "rs" : "msg", output_index_);
  const Json item = kind == "reasoning" ? ReasoningItem(item_id_, "")
                                        : Json{{"type", "message"},
                                               {"id", item_id_},
                                               {"status", "in_progress"},
                                               {"role", "assistant"},
                                               {"content", Json::array()}};
  Json added = item;
  added["content"] = Json::array();
  added["status"] = "in_progress";
  out += Event("response.output_item.added", {{"output_index", output_index_}, {"item", added}});
  out += Event("response.content_part.added",
               {{"item_id", item_id_},
                {"output_index", output_index_},
                {"content_index", 0},
                {"part", kind == "reasoning" ? ReasoningPart("") : TextPart("")}});
  return out;
}

std::string ResponseStream::Close() {
  if (kind_.empty()) return "";
  std::string out;
  Json item;
  if (kind_ == "reasoning") {
    out += Event("response.reasoning_text.done", {{"item_id", item_id_},
                                                  {"output_index", output_index_},
                                                  {"content_index", 0},
                                                  {"text", text_}});
    out += Event("response.content_part.done", {{"item_id", item_id_},
                                                {"output_index", output_index_},
                                                {"content_index", 0},
                                                {"part", ReasoningPart(text_)}});
    item = ReasoningItem(item_id_, text_);
  } else {
    out += Event("response.output_text.done", {{"item_id", item_id_},
                                               {"output_index", output_index_},
                                               {"content_index", 0},
                                               {"text", text_},
                                               {"logprobs", Json::array()}});
    out += Event("response.content_part.done", {{"item_id", item_id_},
                                                {"output_index", output_index_},
                                                {"content_index", 0},
                                                {"part", TextPart(text_)}});
    item = MessageItem(item_id_, text_, "completed");
  }
  out += Event("response.output_item.done", {{"output_index", output_index_}, {"item", item}});
  output_.push_back(std::move(item));
  kind_.clear();
  return out;
}

std::string ResponseStream::Chunk(const Json& chunk) {
  std::string out;
  if (!started_) {
    started_ = true;
    out += Event("response.created", {{"response", Shell("in_progress")}});
    out += Event("response.in_progress", {{"response", Shell("in_progress")}});
  }
  if (finished_) return out;
  Json& message = completion_["choices"][0]["message"];
  if (chunk.contains("usage") && chunk["usage"].is_object()) completion_["usage"] = chunk["usage"];
  if (!chunk.contains("choices") || chunk["choices"].empty()) return out;
  const Json& choice = chunk["choices"][0];
  const Json& delta = choice.contains("delta") ? choice["delta"] : Json::object();
  const auto text_of = [&](const char* key) {
    return delta.contains(key) && delta[key].is_string() ? delta[key].get<std::string>()
                                                         : std::string();
  };
  if (const std::string r = text_of("reasoning_content"); !r.empty()) {
    if (kind_ != "reasoning") out += Open("reasoning");
    text_ += r;
    message["reasoning_content"] = message.value("reasoning_content", "") + r;
    out += Event("response.reasoning_text.delta", {{"item_id", item_id_},
                                                   {"output_index", output_index_},
                                                   {"content_index", 0},
                                                   {"delta", r}});
  }
  if (const std::string t = text_of("content"); !t.empty()) {
    if (kind_ != "message") out += Open("message");
    text_ += t;
    message["content"] = message.value("content", "") + t;
    out += Event("response.output_text.delta", {{"item_id", item_id_},
                                                {"output_index", output_index_},
                                                {"content_index", 0},
                                                {"delta", t},
                                                {"logprobs", Json::array()}});
  }
  if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
    for (const Json& call : delta["tool_calls"]) {
      out += Close();
      ++output_index_;
      const std::string id = ItemId(meta_, "fc", output_index_);
      Json item = CallItem(id, call);
      Json added = item;
      added["arguments"] = "";
      added["status"] = "in_progress";
      out +=
          Event("response.output_item.added", {{"output_index", output_index_}, {"item", added}});
      out +=
          Event("response.function_call_arguments.delta",
                {{"item_id", id}, {"output_index", output_index_}, {"delta", item["arguments"]}});
      out += Event(
          "response.function_call_arguments.done",
          {{"item_id", id}, {"output_index", output_index_}, {"arguments", item["arguments"]}});
      out += Event("response.output_item.done", {{"output_index", output_index_}, {"item", item}});
      output_.push_back(std::move(item));
      if (!message.contains("tool_calls")) message["tool_calls"] = Json::array();
      message["tool_calls"].push_back(call);
    }
  }
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
    out += Close();
    completion_["choices"][0]["finish_reason"] = choice["finish_reason"];
  }
  return out;
}

std::string ResponseStream::Done() {
  std::string out;
  if (!started_) out = Chunk(Json::object());
  if (finished_) return out;
  out += Close();
  finished_ = true;
  const bool incomplete = completion_["choices"][0]["finish_reason"] == "length";
  Json response = Envelope(meta_, incomplete ? "incomplete" : "completed", output_,
                           completion_["usage"], incomplete);
  out += Event(incomplete ? "response.incomplete" : "response.completed",
               {{"response", std::move(response)}});
  if (on_done_) on_done_(completion_);
  return out;
}

std::string ResponseStream::Error(const std::string& message) {
  finished_ = true;
  Json response = Envelope(meta_, "failed", output_, Json(), false);
  response["error"] = Json{{"code", "server_error"}, {"message", message}};
  return Event("response.failed", {{"response", std::move(response)}});
}

void ResponseStore::Put(const std::string& id, Json messages) {
  const size_t bytes = Dump(messages).size();
  absl::MutexLock lock(&mu_);
  if (bytes > max_bytes_ || capacity_ == 0) return;
  lru_.push_front(Entry{id, std::move(messages), bytes});
  index_[id] = lru_.begin();
  bytes_ += bytes;
  while (lru_.size() > capacity_ || bytes_ > max_bytes_) {
    bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().id);
    lru_.pop_back();
  }
}

Json ResponseStore::Get(const std::string& id) {
  absl::MutexLock lock(&mu_);
  const auto it = index_.find(id);
  if (it == index_.end()) return Json();
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->messages;
}

}  // namespace ss::responses
