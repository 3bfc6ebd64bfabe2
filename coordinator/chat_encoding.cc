#include "coordinator/chat_encoding.h"

#include <algorithm>
#include <array>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "coordinator/json_limits.h"
#include "coordinator/py_json.h"

namespace ss::chat {
namespace {

using Json = nlohmann::ordered_json;

// String building over std::string_view (this abseil's string_view is its own type).
void AppendPiece(std::string* s, std::string_view piece) { s->append(piece); }
void AppendPiece(std::string* s, size_t n) { s->append(std::to_string(n)); }
template <typename... Pieces>
void Append(std::string* s, const Pieces&... pieces) {
  (AppendPiece(s, pieces), ...);
}
template <typename... Pieces>
std::string Cat(const Pieces&... pieces) {
  std::string s;
  Append(&s, pieces...);
  return s;
}

// TOOLS_TEMPLATE of encoding_dsv4.py with its tokens filled in, split around {tool_schemas}.
constexpr std::string_view kToolsPrefix = R"txt(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

)txt";
constexpr std::string_view kToolsSuffix = R"txt(

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
)txt";
constexpr std::string_view kReasoningEffortMax =
    R"txt(Reasoning Effort: Absolute maximum with no shortcuts permitted.
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.

)txt";
constexpr std::string_view kResponseFormatPrefix =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

struct Task {
  std::string_view name;
  std::string_view token;
};
constexpr std::array<Task, 6> kTasks = {{
    {"action", "<｜action｜>"},
    {"query", "<｜query｜>"},
    {"authority", "<｜authority｜>"},
    {"domain", "<｜domain｜>"},
    {"title", "<｜title｜>"},
    {"read_url", "<｜read_url｜>"},
}};
constexpr std::array<std::string_view, 6> kRoles = {"system",    "developer", "user",
                                                    "assistant", "tool",      "latest_reminder"};

struct Block {
  bool tool_result = false;
  std::string text;  // the text, or the tool result's content
  std::string tool_use_id;
};

struct ToolCall {
  std::string id;
  std::string name;
  Json params;  // an object: parameter name -> value
};

// One message after validation. `where` names it in errors ("messages[3]").
struct Msg {
  std::string where;
  std::string role;
  std::string content;
  std::vector<Block> blocks;  // user messages after merging
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  const Json* tools = nullptr;            // a non-empty array, else null
  const Json* response_format = nullptr;  // truthy, else null
  std::optional<std::string> task;
  bool wo_eos = false;
};

absl::Status Invalid(std::string_view where, std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(Cat(where, ".", field, ": ", what));
}
absl::Status WrongType(std::string_view where, std::string_view field, std::string_view expected,
                       const Json& got) {
  return Invalid(where, field, Cat("expected ", expected, ", got ", JsonTypeName(got)));
}

// Python truthiness of a JSON value.
bool Truthy(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return v.get<bool>();
    case Json::value_t::string:
      return !v.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object:
      return !v.empty();
    case Json::value_t::number_integer:
      return v.get<int64_t>() != 0;
    case Json::value_t::number_unsigned:
      return v.get<uint64_t>() != 0;
    case Json::value_t::number_float:
      return v.get<double>() != 0.0;
    default:
      return false;
  }
}

const Json* Field(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// Optional string field: absent and null read as "".
absl::Status ReadString(const Json& obj, const char* key, std::string_view where,
                        std::string* out) {
  const Json* v = Field(obj, key);
  if (v == nullptr || v->is_null()) return absl::OkStatus();
  if (!v->is_string()) return WrongType(where, key, "a string", *v);
  *out = v->get<std::string>();
  return absl::OkStatus();
}

// `content`: a string, null, or an array of content parts whose texts are joined by "\n\n".
// Non-text parts render as "[Unsupported TYPE]" in tool results (as the official encoder does)
// and are an error elsewhere.
absl::Status ReadContent(const Json& msg, std::string_view where, bool tool_result,
                         std::string* out) {
  const Json* v = Field(msg, "content");
  if (v == nullptr || v->is_null()) return absl::OkStatus();
  if (v->is_string()) {
    *out = v->get<std::string>();
    return absl::OkStatus();
  }
  if (!v->is_array()) {
    return WrongType(where, "content", "a string or an array of content parts", *v);
  }
  std::vector<std::string> parts;
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& part = (*v)[i];
    const std::string field = Cat("content[", i, "]");
    if (!part.is_object()) return WrongType(where, field, "a content part object", part);
    const Json* type = Field(part, "type");
    if (type == nullptr || !type->is_string()) {
      return WrongType(where, field + ".type", "a string", type ? *type : Json());
    }
    if (*type == "text") {
      std::string text;
      RETURN_IF_ERROR(ReadString(part, "text", Cat(where, ".", field), &text));
      parts.push_back(std::move(text));
    } else if (tool_result) {
      parts.push_back(Cat("[Unsupported ", type->get<std::string>(), "]"));
    } else {
      return Invalid(
          where, field + ".type",
          Cat("unsupported content part type \"", type->get<std::string>(), "\" (only \"text\")"));
    }
  }
  *out = absl::StrJoin(parts, "\n\n");
  return absl::OkStatus();
}

absl::Status ReadToolCalls(const Json& msg, std::string_view where, std::vector<ToolCall>* out) {
  const Json* v = Field(msg, "tool_calls");
  if (v == nullptr || v->is_null()) return absl::OkStatus();
  if (!v->is_array()) return WrongType(where, "tool_calls", "an array", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& tc = (*v)[i];
    std::string field = Cat("tool_calls[", i, "]");
    if (!tc.is_object()) return WrongType(where, field, "an object", tc);
    ToolCall call;
    RETURN_IF_ERROR(ReadString(tc, "id", Cat(where, ".", field), &call.id));
    // OpenAI form {"function": {"name", "arguments"}}, or the flat {"name", "arguments"}.
    const Json* fn = Field(tc, "function");
    if (fn != nullptr) {
      field += ".function";
      if (!fn->is_object()) return WrongType(where, field, "an object", *fn);
      if (call.id.empty()) {
        RETURN_IF_ERROR(ReadString(*fn, "id", Cat(where, ".", field), &call.id));
      }
    } else {
      fn = &tc;
    }
    const Json* name = Field(*fn, "name");
    if (name == nullptr || !name->is_string()) {
      return WrongType(where, field + ".name", "a string", name ? *name : Json());
    }
    call.name = name->get<std::string>();
    const Json* args = Field(*fn, "arguments");
    if (args != nullptr && args->is_string()) {
      const std::string& text = args->get_ref<const std::string&>();
      absl::StatusOr<Json> parsed = ParseJsonWithLimits(text);
      if (absl::IsInvalidArgument(parsed.status())) {
        // Not JSON: one string parameter holding the text (encode_arguments_to_dsml does this).
        call.params = Json::object();
        call.params["arguments"] = text;
      } else if (!parsed.ok()) {
        return Invalid(where, field + ".arguments", std::string(parsed.status().message()));
      } else if (parsed->is_object()) {
        call.params = *std::move(parsed);
      } else {
        return Invalid(where, field + ".arguments",
                       Cat("expected a JSON object, got ", JsonTypeName(*parsed)));
      }
    } else if (args != nullptr && args->is_object()) {
      call.params = *args;
    } else {
      return WrongType(where, field + ".arguments", "a JSON string or an object",
                       args ? *args : Json());
    }
    out->push_back(std::move(call));
  }
  return absl::OkStatus();
}

absl::StatusOr<Msg> ReadMessage(const Json& m, std::string where) {
  if (!m.is_object()) {
    return absl::InvalidArgumentError(
        Cat(where, ": expected a message object, got ", JsonTypeName(m)));
  }
  Msg msg;
  msg.where = std::move(where);
  const Json* role = Field(m, "role");
  if (role == nullptr) return Invalid(msg.where, "role", "missing");
  if (!role->is_string()) return WrongType(msg.where, "role", "a string", *role);
  msg.role = role->get<std::string>();
  if (std::find(kRoles.begin(), kRoles.end(), msg.role) == kRoles.end()) {
    return Invalid(msg.where, "role", Cat("unknown role \"", msg.role, "\""));
  }
  RETURN_IF_ERROR(ReadContent(m, msg.where, msg.role == "tool", &msg.content));
  RETURN_IF_ERROR(ReadString(m, "reasoning_content", msg.where, &msg.reasoning));
  RETURN_IF_ERROR(ReadToolCalls(m, msg.where, &msg.tool_calls));
  if (const Json* tools = Field(m, "tools"); tools != nullptr && !tools->is_null()) {
    if (!tools->is_array()) return WrongType(msg.where, "tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& tool = (*tools)[i];
      const std::string field = Cat("tools[", i, "]");
      if (!tool.is_object()) return WrongType(msg.where, field, "an object", tool);
      const Json* fn = Field(tool, "function");
      if (fn == nullptr || !fn->is_object()) {
        return WrongType(msg.where, field + ".function", "an object", fn ? *fn : Json());
      }
    }
    if (!tools->empty()) msg.tools = tools;
  }
  if (const Json* rf = Field(m, "response_format"); rf != nullptr && Truthy(*rf)) {
    msg.response_format = rf;
  }
  if (const Json* task = Field(m, "task"); task != nullptr && !task->is_null()) {
    if (!task->is_string()) return WrongType(msg.where, "task", "a string", *task);
    const std::string& name = task->get_ref<const std::string&>();
    if (std::none_of(kTasks.begin(), kTasks.end(), [&](const Task& t) { return t.name == name; })) {
      return Invalid(msg.where, "task",
                     Cat("unknown task \"", name,
                         "\" (expected action, query, authority, domain, title or "
                         "read_url)"));
    }
    msg.task = name;
  }
  if (const Json* wo = Field(m, "wo_eos"); wo != nullptr && !wo->is_null()) {
    if (!wo->is_boolean()) return WrongType(msg.where, "wo_eos", "a boolean", *wo);
    msg.wo_eos = wo->get<bool>();
  }
  if (msg.role == "tool") {
    std::string id;
    RETURN_IF_ERROR(ReadString(m, "tool_call_id", msg.where, &id));
    msg.blocks.push_back({/*tool_result=*/true, msg.content, std::move(id)});
  }
  return msg;
}

absl::StatusOr<std::vector<Msg>> ReadMessages(const Json& list, std::string_view label) {
  if (!list.is_array()) {
    return absl::InvalidArgumentError(
        Cat(label, ": expected an array of messages, got ", JsonTypeName(list)));
  }
  std::vector<Msg> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    ASSIGN_OR_RETURN(Msg msg, ReadMessage(list[i], Cat(label, "[", i, "]")));
    out.push_back(std::move(msg));
  }
  return out;
}

// merge_tool_messages: tool results and follow-up user text join the preceding user message.
std::vector<Msg> MergeToolMessages(std::vector<Msg> in) {
  std::vector<Msg> merged;
  merged.reserve(in.size());
  for (Msg& m : in) {
    const bool after_user = !merged.empty() && merged.back().role == "user";
    if (m.role == "tool") {
      if (after_user) {
        merged.back().blocks.push_back(std::move(m.blocks.front()));
      } else {
        Msg user;
        user.where = m.where;
        user.role = "user";
        user.blocks.push_back(std::move(m.blocks.front()));
        merged.push_back(std::move(user));
      }
    } else if (m.role == "user") {
      Block text{/*tool_result=*/false, m.content, ""};
      if (after_user && !merged.back().task) {
        merged.back().blocks.push_back(std::move(text));
      } else {
        // A fresh user message keeps only content, task and wo_eos (as the official one does).
        Msg user;
        user.where = m.where;
        user.role = "user";
        user.content = std::move(m.content);
        user.blocks.push_back(std::move(text));
        user.task = std::move(m.task);
        user.wo_eos = m.wo_eos;
        merged.push_back(std::move(user));
      }
    } else {
      merged.push_back(std::move(m));
    }
  }
  return merged;
}

// sort_tool_results_by_call_order.
void SortToolResults(std::vector<Msg>* messages) {
  std::unordered_map<std::string, int> call_order;
  for (Msg& m : *messages) {
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      call_order.clear();
      for (size_t i = 0; i < m.tool_calls.size(); ++i) {
        if (!m.tool_calls[i].id.empty()) call_order[m.tool_calls[i].id] = static_cast<int>(i);
      }
    } else if (m.role == "user" && !m.blocks.empty()) {
      std::vector<Block> results;
      for (const Block& b : m.blocks) {
        if (b.tool_result) results.push_back(b);
      }
      if (results.size() <= 1 || call_order.empty()) continue;
      auto key = [&](const Block& b) {
        auto it = call_order.find(b.tool_use_id);
        return it == call_order.end() ? 0 : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& a, const Block& b) { return key(a) < key(b); });
      size_t next = 0;
      for (Block& b : m.blocks) {
        if (b.tool_result) b = std::move(results[next++]);
      }
    }
  }
}

int LastUserIndex(const std::vector<Msg>& messages) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    if (messages[i].role == "user" || messages[i].role == "developer") return i;
  }
  return -1;
}

// _drop_thinking_messages: before the last user/developer message, assistants lose their
// reasoning and developers are removed.
std::vector<Msg> DropThinking(const std::vector<Msg>& messages) {
  const int last_user = LastUserIndex(messages);
  std::vector<Msg> out;
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const Msg& m = messages[i];
    if (m.role == "user" || m.role == "system" || m.role == "tool" || m.role == "latest_reminder" ||
        i >= last_user) {
      out.push_back(m);
    } else if (m.role == "assistant") {
      out.push_back(m);
      out.back().reasoning.clear();
    }
  }
  return out;
}

// Writes the prompt: the template's own text with Markup, text taken from the request with
// Content (recorded in Prompt::content, adjacent ranges joined).
class PromptWriter {
 public:
  explicit PromptWriter(Prompt* p) : p_(p) {}
  template <typename... Pieces>
  void Markup(const Pieces&... pieces) {
    Append(&p_->text, pieces...);
  }
  void Content(std::string_view s) {
    const size_t begin = p_->text.size();
    p_->text.append(s);
    Mark(begin);
  }
  void ContentJson(const Json& v) {
    const size_t begin = p_->text.size();
    AppendPyJson(v, &p_->text);
    Mark(begin);
  }

 private:
  void Mark(size_t begin) {
    const size_t end = p_->text.size();
    if (begin == end) return;
    if (!p_->content.empty() && p_->content.back().second == begin) {
      p_->content.back().second = end;
    } else {
      p_->content.emplace_back(begin, end);
    }
  }
  Prompt* p_;
};

void AppendTools(const Json& tools, PromptWriter* out) {
  out->Markup(kToolsPrefix);
  bool first = true;
  for (const Json& tool : tools) {
    if (!first) out->Markup("\n");
    first = false;
    out->ContentJson(*Field(tool, "function"));  // an object (ParseMessage)
  }
  out->Markup(kToolsSuffix);
}

void AppendToolsAndFormat(const Msg& m, PromptWriter* out) {
  if (m.tools != nullptr) {
    out->Markup("\n\n");
    AppendTools(*m.tools, out);
  }
  if (m.response_format != nullptr) {
    out->Markup("\n\n", kResponseFormatPrefix);
    out->ContentJson(*m.response_format);
  }
}

void AppendToolCalls(const std::vector<ToolCall>& calls, PromptWriter* out) {
  out->Markup("\n\n", kToolCallsOpen, "\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i > 0) out->Markup("\n");
    out->Markup(kInvokeOpen, " name=\"");
    out->Content(calls[i].name);
    out->Markup("\">\n");
    bool first = true;
    for (auto it = calls[i].params.begin(); it != calls[i].params.end(); ++it) {
      if (!first) out->Markup("\n");
      first = false;
      const bool is_str = it.value().is_string();
      out->Markup(kParameterOpen, " name=\"");
      out->Content(it.key());
      out->Markup("\" string=\"", is_str ? "true" : "false", "\">");
      if (is_str) {
        out->Content(it.value().get_ref<const std::string&>());
      } else {
        out->ContentJson(it.value());
      }
      out->Markup(kParameterClose, ">");
    }
    out->Markup("\n", kInvokeClose, ">");
  }
  out->Markup("\n", kToolCallsClose);
}

struct RenderContext {
  const std::vector<Msg>& messages;
  bool thinking;
  bool drop_thinking;
  bool effort_max;
  int last_user;
  bool generation_prompt;  // EncodeOptions::add_generation_prompt
};

// render_message.
absl::Status RenderMessage(const RenderContext& ctx, int index, PromptWriter* out) {
  const Msg& m = ctx.messages[index];
  if (index == 0 && ctx.thinking && ctx.effort_max) out->Markup(kReasoningEffortMax);

  if (m.role == "system") {
    out->Content(m.content);
    AppendToolsAndFormat(m, out);
  } else if (m.role == "developer") {
    if (m.content.empty()) {
      return Invalid(m.where, "content", "a developer message needs non-empty content");
    }
    out->Markup(kUserToken);
    out->Content(m.content);
    AppendToolsAndFormat(m, out);
  } else if (m.role == "user") {
    out->Markup(kUserToken);
    for (size_t i = 0; i < m.blocks.size(); ++i) {
      if (i > 0) out->Markup("\n\n");
      if (m.blocks[i].tool_result) {
        out->Markup(kToolResultOpen);
        out->Content(m.blocks[i].text);
        out->Markup(kToolResultClose);
      } else {
        out->Content(m.blocks[i].text);
      }
    }
  } else if (m.role == "latest_reminder") {
    out->Markup(kLatestReminderToken);
    out->Content(m.content);
  } else if (m.role == "assistant") {
    const bool prev_has_task = index > 0 && ctx.messages[index - 1].task.has_value();
    if (ctx.thinking && !prev_has_task && (!ctx.drop_thinking || index > ctx.last_user)) {
      out->Content(m.reasoning);
      out->Markup(kThinkingEnd);
    }
    out->Content(m.content);
    if (!m.tool_calls.empty()) AppendToolCalls(m.tool_calls, out);
    if (!m.wo_eos) out->Markup(kEosToken);
  } else {
    // Tool messages are always merged into user messages first, so this means a broken merge.
    return absl::InternalError(
        Cat(m.where, ": role \"", m.role, "\" left unmerged by the encoder"));
  }

  // The transition into the next turn is written only before an assistant or reminder message,
  // or at the end (the generation prompt).
  const int next = index + 1;
  if (next < static_cast<int>(ctx.messages.size()) && ctx.messages[next].role != "assistant" &&
      ctx.messages[next].role != "latest_reminder") {
    return absl::OkStatus();
  }
  if (next == static_cast<int>(ctx.messages.size()) && !ctx.generation_prompt) {
    return absl::OkStatus();
  }
  if (m.task) {
    const auto task = std::find_if(kTasks.begin(), kTasks.end(),
                                   [&](const Task& t) { return t.name == *m.task; });
    if (*m.task == "action") {
      out->Markup(kAssistantToken, ctx.thinking ? kThinkingStart : kThinkingEnd, task->token);
    } else {
      out->Markup(task->token);
    }
  } else if (m.role == "user" || m.role == "developer") {
    const bool think = ctx.thinking && (!ctx.drop_thinking || index >= ctx.last_user);
    out->Markup(kAssistantToken, think ? kThinkingStart : kThinkingEnd);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Prompt> EncodePrompt(const nlohmann::ordered_json& messages,
                                    const EncodeOptions& opts) {
  bool effort_max = false;
  if (opts.reasoning_effort) {
    if (*opts.reasoning_effort == "max") {
      effort_max = true;
    } else if (*opts.reasoning_effort != "high") {
      return absl::InvalidArgumentError(Cat("reasoning_effort: \"", *opts.reasoning_effort,
                                            "\" is not one of unset, \"high\", \"max\""));
    }
  }
  std::vector<Msg> context;
  if (opts.context != nullptr) {
    ASSIGN_OR_RETURN(context, ReadMessages(*opts.context, "context"));
  }
  ASSIGN_OR_RETURN(std::vector<Msg> current, ReadMessages(messages, "messages"));

  context = MergeToolMessages(std::move(context));
  current = MergeToolMessages(std::move(current));
  const size_t num_current = current.size();
  std::vector<Msg> full = context;
  for (Msg& m : current) full.push_back(std::move(m));
  // Tool results follow the call order of the latest assistant turn, which may be in the context.
  SortToolResults(&full);

  Prompt prompt;
  PromptWriter out(&prompt);
  if (opts.add_default_bos_token && context.empty()) out.Markup(kBosToken);

  const bool thinking = opts.mode == ThinkingMode::kThinking;
  const bool any_tools =
      std::any_of(full.begin(), full.end(), [](const Msg& m) { return m.tools != nullptr; });
  const bool drop_thinking = opts.drop_thinking && !any_tools;

  // As in the official encoder: after dropping, the context is assumed to shrink as it would
  // alone. (With developer messages in the context this can leave new messages unrendered; the
  // official encoder behaves the same.)
  int context_len = static_cast<int>(context.size());
  int num_to_render = static_cast<int>(num_current);
  if (thinking && drop_thinking) {
    full = DropThinking(full);
    context_len = static_cast<int>(DropThinking(context).size());
    num_to_render = static_cast<int>(full.size()) - context_len;
  }

  if (opts.continue_final_message) {
    if (num_current == 0 || full.empty() || full.back().role != "assistant") {
      return absl::InvalidArgumentError(
          "continue_final_message: the last message must be an assistant message");
    }
    full.back().wo_eos = true;
  }
  const RenderContext ctx{
      full, thinking, drop_thinking, effort_max, LastUserIndex(full), opts.add_generation_prompt};
  for (int i = 0; i < num_to_render; ++i) {
    const int index = context_len + i;
    if (index < 0 || index >= static_cast<int>(full.size())) break;
    RETURN_IF_ERROR(RenderMessage(ctx, index, &out));
  }
  return prompt;
}

absl::StatusOr<std::string> EncodeMessages(const nlohmann::ordered_json& messages,
                                           const EncodeOptions& opts) {
  ASSIGN_OR_RETURN(Prompt prompt, EncodePrompt(messages, opts));
  return std::move(prompt.text);
}

}  // namespace ss::chat
