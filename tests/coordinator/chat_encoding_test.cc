// Chat-encoding rules of spec §6.2 beyond the four golden cases, Python-compatible JSON, and
// InvalidArgument (never a crash) on malformed messages.
#include "coordinator/chat_encoding.h"

#include <random>
#include <string>

#include "coordinator/py_json.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ss::chat {
namespace {

using Json = nlohmann::ordered_json;

const std::string kBos(kBosToken);
const std::string kEos(kEosToken);

std::string Encode(const std::string& messages_json, ThinkingMode mode = ThinkingMode::kChat,
                   EncodeOptions opts = {}) {
  opts.mode = mode;
  absl::StatusOr<std::string> prompt = EncodeMessages(Json::parse(messages_json), opts);
  EXPECT_TRUE(prompt.ok()) << prompt.status();
  return prompt.ok() ? *prompt : std::string();
}

absl::Status EncodeError(const std::string& messages_json, EncodeOptions opts = {}) {
  absl::StatusOr<std::string> prompt = EncodeMessages(Json::parse(messages_json), opts);
  return prompt.status();
}

TEST(PyJson, MatchesPythonJsonDumps) {
  // Expected strings are what CPython 3's json.dumps(v, ensure_ascii=False) prints.
  const std::pair<Json, std::string> cases[] = {
      {Json(1.0), "1.0"},
      {Json(-0.0), "-0.0"},
      {Json(0.1 + 0.2), "0.30000000000000004"},
      {Json(1e16), "1e+16"},
      {Json(1e15), "1000000000000000.0"},
      {Json(123456789.0), "123456789.0"},
      {Json(123456789012345678.0), "1.2345678901234568e+17"},
      {Json(1.2345678901234567e17), "1.2345678901234566e+17"},
      {Json(0.0001), "0.0001"},
      {Json(0.00001), "1e-05"},
      {Json(1.5e-7), "1.5e-07"},
      {Json(5e-324), "5e-324"},
      {Json(1.7976931348623157e308), "1.7976931348623157e+308"},
      {Json(2.5), "2.5"},
      {Json(-17), "-17"},
      {Json(18446744073709551615ull), "18446744073709551615"},
      {Json(true), "true"},
      {Json(nullptr), "null"},
      {Json("a\"b\\c\n\r\t\b\f\x01\x1f\x7f"), R"("a\"b\\c\n\r\t\b\f\u0001\u001f)"
                                              "\x7f\""},
      {Json("北京 °C 💡"), "\"北京 °C 💡\""},
      {Json::parse(R"({"z": [1, {"a": []}, {}], "a": "x"})"),
       R"({"z": [1, {"a": []}, {}], "a": "x"})"},
      {Json::parse(R"([ 1 ,2,  3 ])"), "[1, 2, 3]"},
  };
  for (const auto& [value, want] : cases) EXPECT_EQ(PyJsonDumps(value), want);
}

TEST(ChatEncoding, GenerationPromptPerMode) {
  const std::string m = R"([{"role": "user", "content": "hi"}])";
  EXPECT_EQ(Encode(m), kBos + "<｜User｜>hi<｜Assistant｜></think>");
  EXPECT_EQ(Encode(m, ThinkingMode::kThinking), kBos + "<｜User｜>hi<｜Assistant｜><think>");
  EncodeOptions no_bos;
  no_bos.add_default_bos_token = false;
  EXPECT_EQ(Encode(m, ThinkingMode::kChat, no_bos), "<｜User｜>hi<｜Assistant｜></think>");
}

TEST(ChatEncoding, ReasoningEffort) {
  const std::string m = R"([{"role": "system", "content": "S"}, {"role": "user", "content": "u"}])";
  EncodeOptions max;
  max.reasoning_effort = "max";
  const std::string thinking = Encode(m, ThinkingMode::kThinking, max);
  EXPECT_EQ(
      thinking.rfind(kBos + "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n", 0),
      0u);
  EXPECT_NE(thinking.find("left unchecked.\n\nS<｜User｜>u"), std::string::npos);
  // Only in thinking mode; "high" adds nothing.
  EXPECT_EQ(Encode(m, ThinkingMode::kChat, max), kBos + "S<｜User｜>u<｜Assistant｜></think>");
  EncodeOptions high;
  high.reasoning_effort = "high";
  EXPECT_EQ(Encode(m, ThinkingMode::kThinking, high), kBos + "S<｜User｜>u<｜Assistant｜><think>");
  EncodeOptions bad;
  bad.reasoning_effort = "low";
  EXPECT_EQ(EncodeError(m, bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatEncoding, DeveloperWithToolsAndResponseFormat) {
  const std::string p = Encode(R"([
    {"role": "developer", "content": "D",
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}],
     "response_format": {"type": "json_object"}}])");
  EXPECT_EQ(p.rfind(kBos + "<｜User｜>D\n\n## Tools\n\n", 0), 0u);
  EXPECT_NE(p.find("### Available Tool Schemas\n\n{\"name\": \"f\", \"parameters\": {\"b\": 1, "
                   "\"a\": 2}}\n\nYou MUST strictly follow"),
            std::string::npos);
  const std::string tail =
      "invoke tool calls.\n\n\n## Response Format:\n\nYou MUST strictly adhere to the following "
      "schema to reply:\n{\"type\": \"json_object\"}<｜Assistant｜></think>";
  EXPECT_EQ(p.substr(p.size() - tail.size()), tail);
}

TEST(ChatEncoding, ToolCallsRenderAsDsml) {
  const std::string p = Encode(R"([
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [
      {"id": "a", "type": "function", "function": {"name": "f",
       "arguments": "{\"s\": \"x \\\"q\\\" 北京\", \"n\": 3, \"r\": 2.0, \"b\": false, \"z\": null, \"l\": [1, \"二\"], \"o\": {\"k\": \"v\"}}"}},
      {"function": {"name": "g", "arguments": {"k": 1}}},
      {"name": "h", "arguments": "not json"},
      {"function": {"name": "e", "arguments": "{}"}}]}])");
  const std::string want =
      "<｜Assistant｜></think>Let me look.\n\n"
      "<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"s\" string=\"true\">x \"q\" 北京</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">3</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"r\" string=\"false\">2.0</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"b\" string=\"false\">false</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"z\" string=\"false\">null</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"l\" string=\"false\">[1, \"二\"]</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"o\" string=\"false\">{\"k\": \"v\"}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"g\">\n"
      "<｜DSML｜parameter name=\"k\" string=\"false\">1</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"h\">\n"
      "<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"e\">\n\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>" +
      kEos;
  EXPECT_EQ(p, kBos + "<｜User｜>u" + want);
}

TEST(ChatEncoding, ToolResultsMergeAndFollowCallOrder) {
  const std::string m = R"([
    {"role": "user", "content": "u"},
    {"role": "assistant", "tool_calls": [
      {"id": "a", "function": {"name": "f", "arguments": "{}"}},
      {"id": "b", "function": {"name": "g", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "b", "content": "B"},
    {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "A1"},
                                                      {"type": "image_url"},
                                                      {"type": "text", "text": "A2"}]},
    {"role": "user", "content": "thanks"}])";
  const std::string p = Encode(m, ThinkingMode::kThinking);
  const std::string want =
      kEos +
      "<｜User｜><tool_result>A1\n\n[Unsupported image_url]\n\nA2</tool_result>\n\n"
      "<tool_result>B</tool_result>\n\nthanks<｜Assistant｜><think>";
  EXPECT_EQ(p.substr(p.size() - want.size()), want);
  // Thinking mode, dropping: the earlier assistant turn has no thinking part.
  EXPECT_NE(p.find("<｜User｜>u<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>"),
            std::string::npos);
}

TEST(ChatEncoding, ConsecutiveUserMessagesJoinUnlessThePreviousHasATask) {
  EXPECT_EQ(Encode(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"),
            kBos + "<｜User｜>a\n\nb<｜Assistant｜></think>");
  EXPECT_EQ(Encode(R"([{"role": "user", "content": "a", "task": "query"},
                      {"role": "user", "content": "b"}])"),
            kBos + "<｜User｜>a<｜User｜>b<｜Assistant｜></think>");
}

TEST(ChatEncoding, Tasks) {
  EXPECT_EQ(
      Encode(R"([{"role": "user", "content": "q", "task": "action"}])", ThinkingMode::kThinking),
      kBos + "<｜User｜>q<｜Assistant｜><think><｜action｜>");
  EXPECT_EQ(Encode(R"([{"role": "user", "content": "q", "task": "title"}])"),
            kBos + "<｜User｜>q<｜title｜>");
  // The reply to a task has no thinking part, even in thinking mode.
  EXPECT_EQ(Encode(R"([{"role": "user", "content": "q", "task": "domain"},
                      {"role": "assistant", "content": "d", "reasoning_content": "r"}])",
                   ThinkingMode::kThinking),
            kBos + "<｜User｜>q<｜domain｜>d" + kEos);
}

TEST(ChatEncoding, DropThinking) {
  const std::string m = R"([
    {"role": "developer", "content": "dev"},
    {"role": "user", "content": "u1"},
    {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
    {"role": "user", "content": "u2"},
    {"role": "assistant", "content": "a2", "reasoning_content": "r2", "wo_eos": true}])";
  // Dropping: the developer message goes, the early reasoning goes; wo_eos leaves out the EOS.
  EXPECT_EQ(Encode(m, ThinkingMode::kThinking),
            kBos + "<｜User｜>u1<｜Assistant｜></think>a1" + kEos +
                "<｜User｜>u2<｜Assistant｜><think>r2</think>a2");
  EncodeOptions keep;
  keep.drop_thinking = false;
  EXPECT_EQ(Encode(m, ThinkingMode::kThinking, keep),
            kBos + "<｜User｜>dev<｜User｜>u1<｜Assistant｜><think>r1</think>a1" + kEos +
                "<｜User｜>u2<｜Assistant｜><think>r2</think>a2");
  // Chat mode never writes reasoning.
  EXPECT_EQ(Encode(m, ThinkingMode::kChat),
            kBos + "<｜User｜>dev<｜User｜>u1<｜Assistant｜></think>a1" + kEos +
                "<｜User｜>u2<｜Assistant｜></think>a2");
}

TEST(ChatEncoding, Context) {
  const Json context = Json::parse(R"([
    {"role": "system", "content": "S"},
    {"role": "user", "content": "u1"},
    {"role": "assistant", "content": "a1", "reasoning_content": "r1"}])");
  EncodeOptions opts;
  opts.context = &context;
  EXPECT_EQ(Encode(R"([{"role": "user", "content": "u2"}])", ThinkingMode::kThinking, opts),
            "<｜User｜>u2<｜Assistant｜><think>");
}

TEST(ChatEncoding, OpenAiContentParts) {
  EXPECT_EQ(Encode(R"([{"role": "system", "content": [{"type": "text", "text": "s1"},
                                                      {"type": "text", "text": "s2"}]},
                      {"role": "user", "content": [{"type": "text", "text": "u"}]},
                      {"role": "assistant", "content": null}])"),
            kBos + "s1\n\ns2<｜User｜>u<｜Assistant｜></think>" + kEos);
}

TEST(ChatEncoding, LatestReminder) {
  EXPECT_EQ(Encode(R"([{"role": "user", "content": "u"},
                      {"role": "latest_reminder", "content": "today"}])"),
            kBos + "<｜User｜>u<｜Assistant｜></think><｜latest_reminder｜>today");
}

TEST(ChatEncoding, GenerationPromptAndContinuedFinalMessage) {
  EncodeOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(Encode(R"([{"role": "user", "content": "u"}])", ThinkingMode::kChat, no_prompt),
            kBos + "<｜User｜>u");
  // Only the end loses its transition; turns before an assistant message keep theirs.
  EXPECT_EQ(Encode(R"([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                      {"role": "user", "content": "v"}])",
                   ThinkingMode::kChat, no_prompt),
            kBos + "<｜User｜>u<｜Assistant｜></think>a" + kEos + "<｜User｜>v");
  EncodeOptions cont;
  cont.continue_final_message = true;
  cont.add_generation_prompt = false;
  const std::string msgs = R"([{"role": "user", "content": "u"},
                               {"role": "assistant", "content": "The answer", "reasoning_content": "hm"}])";
  EXPECT_EQ(Encode(msgs, ThinkingMode::kChat, cont),
            kBos + "<｜User｜>u<｜Assistant｜></think>The answer");
  EXPECT_EQ(Encode(msgs, ThinkingMode::kThinking, cont),
            kBos + "<｜User｜>u<｜Assistant｜><think>hm</think>The answer");
  EXPECT_EQ(Encode(msgs), kBos + "<｜User｜>u<｜Assistant｜></think>The answer" + kEos);
  EXPECT_EQ(EncodeError(R"([{"role": "user", "content": "u"}])", cont).code(),
            absl::StatusCode::kInvalidArgument);
}

// Prompt::content holds exactly the bytes the request wrote, in order; the rest is the template.
TEST(ChatEncoding, PromptMarksRequestContent) {
  const Json messages = Json::parse(R"([
      {"role": "system", "content": "S", "tools": [{"type": "function", "function": {"name": "f"}}]},
      {"role": "user", "content": "U<｜Assistant｜>"},
      {"role": "assistant", "content": "A", "tool_calls": [
          {"id": "1", "function": {"name": "g", "arguments": "{\"k\": \"v\", \"n\": 1}"}}]},
      {"role": "tool", "tool_call_id": "1", "content": "R"}])");
  EncodeOptions opts;
  absl::StatusOr<Prompt> prompt = EncodePrompt(messages, opts);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(prompt->text, *EncodeMessages(messages, opts));
  std::vector<std::string> content;
  size_t prev_end = 0;
  for (const auto& [b, e] : prompt->content) {
    EXPECT_LT(b, e);
    EXPECT_TRUE(content.empty() || b > prev_end) << "ranges overlap or touch";
    prev_end = e;
    content.push_back(prompt->text.substr(b, e - b));
  }
  EXPECT_EQ(content, (std::vector<std::string>{"S", R"({"name": "f"})", "U<｜Assistant｜>", "A",
                                               "g", "k", "v", "n", "1", "R"}));
}

TEST(ChatEncoding, MalformedMessagesNameIndexAndField) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"role": "user"})", "messages: expected an array"},
      {R"([7])", "messages[0]: expected a message object, got a number"},
      {R"([{"role": "user", "content": "x"}, {"content": "x"}])", "messages[1].role: missing"},
      {R"([{"role": 3}])", "messages[0].role: expected a string, got a number"},
      {R"([{"role": "robot"}])", "messages[0].role: unknown role \"robot\""},
      {R"([{"role": "user", "content": 5}])", "messages[0].content: expected a string or an array"},
      {R"([{"role": "user", "content": [{"type": "image_url"}]}])",
       "messages[0].content[0].type: unsupported content part type \"image_url\""},
      {R"([{"role": "user", "content": [{"type": "text", "text": 1}]}])",
       "messages[0].content[0].text: expected a string"},
      {R"([{"role": "assistant", "tool_calls": {}}])", "messages[0].tool_calls: expected an array"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])",
       "messages[0].tool_calls[0].function.name: expected a string, got null"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}])",
       "messages[0].tool_calls[0].function.arguments: expected a JSON string or an object"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}])",
       "messages[0].tool_calls[0].function.arguments: expected a JSON object, got an array"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": ")" +
           std::string(100'000, '[') + R"("}}]}])",
       "messages[0].tool_calls[0].function.arguments: JSON nested deeper than 64 levels"},
      {R"([{"role": "system", "tools": [{"name": "f"}]}])",
       "messages[0].tools[0].function: expected an object"},
      {R"([{"role": "system", "tools": "f"}])", "messages[0].tools: expected an array"},
      {R"([{"role": "user", "content": "x", "task": "summarise"}])",
       "messages[0].task: unknown task \"summarise\""},
      {R"([{"role": "assistant", "wo_eos": "yes"}])", "messages[0].wo_eos: expected a boolean"},
      {R"([{"role": "tool", "tool_call_id": 1}])", "messages[0].tool_call_id: expected a string"},
      {R"([{"role": "assistant", "reasoning_content": []}])",
       "messages[0].reasoning_content: expected a string"},
      {R"([{"role": "user", "content": "u"}, {"role": "developer", "content": ""}])",
       "messages[1].content: a developer message needs non-empty content"},
  };
  for (const auto& [input, message] : cases) {
    const absl::Status status = EncodeError(input);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << input;
    EXPECT_NE(std::string(status.message()).find(message), std::string::npos)
        << input << " -> " << status;
  }
  Json bad_context = Json::parse(R"([{"role": "user"}, {"role": 1}])");
  EncodeOptions opts;
  opts.context = &bad_context;
  EXPECT_NE(std::string(EncodeError("[]", opts).message()).find("context[1].role"),
            std::string::npos);
}

// Random messages with random field types: the encoder returns a prompt or InvalidArgument,
// never anything else, and never throws.
TEST(ChatEncoding, RandomInputsNeverCrash) {
  std::mt19937 rng(1234);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const Json values[] = {
      nullptr,
      true,
      0,
      -1.5,
      "",
      "text",
      "{\"k\": [1, 2]}",
      "[1]",
      Json::array(),
      Json::object(),
      Json::parse(R"([{"type": "text", "text": "t"}])"),
      Json::parse(R"([{"type": "function", "function": {"name": "f"}}])"),
      Json::parse(R"([{"id": "a", "function": {"name": "f", "arguments": "{}"}}])"),
      Json::parse(R"({"name": "f", "arguments": {"x": 1}})")};
  const char* roles[] = {"system", "developer",       "user", "assistant",
                         "tool",   "latest_reminder", "other"};
  const char* keys[] = {"content", "reasoning_content", "tool_calls", "tools", "response_format",
                        "task",    "tool_call_id",      "wo_eos"};
  for (int iter = 0; iter < 3000; ++iter) {
    Json messages = Json::array();
    const int n = pick(6);
    for (int i = 0; i < n; ++i) {
      Json m = Json::object();
      if (pick(10) != 0) m["role"] = roles[pick(7)];
      for (const char* key : keys) {
        if (pick(3) == 0) m[key] = values[pick(static_cast<int>(std::size(values)))];
      }
      if (pick(4) == 0) m["task"] = "action";
      messages.push_back(m);
    }
    EncodeOptions opts;
    opts.mode = pick(2) ? ThinkingMode::kThinking : ThinkingMode::kChat;
    opts.drop_thinking = pick(2);
    absl::StatusOr<std::string> p = EncodeMessages(messages, opts);
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << messages.dump();
    }
  }
}

}  // namespace
}  // namespace ss::chat
