// DsmlToolCallGbnf: random sentences of the grammar parse back with the completion parser into
// tool calls of the given tools whose arguments validate against their parameter schemas; the
// chat encoder's own rendering of tool calls is a sentence; errors.
#include "coordinator/grammar/dsml_tool_gbnf.h"

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/chat_encoding.h"
#include "coordinator/completion_parser.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grammar_test_util.h"

namespace ss::grammar {
namespace {

using nlohmann::ordered_json;
using testing::Accepts;
using testing::Compile;

const ordered_json& Tools() {
  static const ordered_json tools = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"type": "string", "enum": ["c", "f"]}},
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
      "properties": {
        "query": {"type": "string", "maxLength": 30},
        "filters": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "opts": {"type": "object", "properties": {"exact": {"type": "boolean"}},
                 "required": ["exact"], "additionalProperties": false}},
      "required": ["query", "filters"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object",
      "properties": {}}}},
    {"type": "function", "function": {"name": "mixed", "parameters": {"type": "object",
      "$defs": {"Word": {"type": "string", "pattern": "^[a-z]+$"}},
      "properties": {"v": {"anyOf": [{"$ref": "#/$defs/Word"}, {"type": "number"}]},
                     "when": {"type": "string", "format": "date"}},
      "required": ["v"]}}},
    {"name": "bare", "parameters": {"type": "object", "properties": {
      "x": {"type": "boolean"}}, "required": ["x"]}}
  ])");
  return tools;
}

const ordered_json* FindTool(const std::string& name) {
  for (const auto& t : Tools()) {
    const ordered_json& fn = t.contains("function") ? t["function"] : t;
    if (fn["name"] == name) return &fn;
  }
  return nullptr;
}

// Every sentence parses into valid calls; returns the number of calls seen per walk.
void CheckSentences(const std::optional<std::string>& forced, bool any_whitespace) {
  absl::StatusOr<std::string> gbnf =
      DsmlToolCallGbnf(Tools(), forced, JsonGrammarOptions{any_whitespace});
  ASSERT_TRUE(gbnf.ok()) << gbnf.status();
  auto g = Compile(*gbnf);
  ASSERT_NE(g, nullptr) << *gbnf;
  std::mt19937 rng(3);
  int finished = 0;
  for (int i = 0; i < 60; ++i) {
    std::optional<std::string> s = testing::RandomSentence(g, &rng, 20000);
    if (!s) continue;
    ++finished;
    const chat::ParsedCompletion parsed = chat::ParseCompletion(*s, chat::ThinkingMode::kChat);
    EXPECT_EQ(parsed.content, "") << *s;
    EXPECT_EQ(parsed.reasoning_content, "") << *s;
    ASSERT_FALSE(parsed.tool_calls.empty()) << *s;
    if (forced) {
      ASSERT_EQ(parsed.tool_calls.size(), 1u) << *s;
      EXPECT_EQ(parsed.tool_calls[0].name, *forced);
    }
    for (const chat::ParsedToolCall& call : parsed.tool_calls) {
      const ordered_json* fn = FindTool(call.name);
      ASSERT_NE(fn, nullptr) << call.name;
      nlohmann::json args = nlohmann::json::parse(call.arguments, nullptr, false);
      ASSERT_FALSE(args.is_discarded()) << call.arguments;
      testing::MiniValidator validator((*fn)["parameters"]);
      EXPECT_TRUE(validator.Valid(args)) << call.name << " " << call.arguments << "\n" << *s;
    }
  }
  EXPECT_GE(finished, 40);
}

TEST(DsmlToolGbnf, RequiredSentencesParseIntoValidCalls) { CheckSentences(std::nullopt, false); }
TEST(DsmlToolGbnf, RequiredWithWhitespace) { CheckSentences(std::nullopt, true); }
TEST(DsmlToolGbnf, NamedSentencesCallThatTool) {
  CheckSentences(std::string("search"), false);
  CheckSentences(std::string("mixed"), false);
}

// Random tools (parameters of random property schemas): sentences parse into valid calls.
TEST(DsmlToolGbnf, RandomTools) {
  std::mt19937 rng(17);
  int calls = 0;
  for (int i = 0; i < 60; ++i) {
    ordered_json tools = ordered_json::array();
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int t = 0; t < n; ++t) {
      ordered_json props = ordered_json::object();
      ordered_json required = ordered_json::array();
      for (int p = 0; p < 3; ++p) {
        const std::string name = absl::StrCat("p", rng() % 5);
        if (props.contains(name)) continue;
        props[name] = testing::RandomSchema(&rng, 2);
        if (rng() % 2) required.push_back(name);
      }
      tools.push_back({{"type", "function"},
                       {"function",
                        {{"name", absl::StrCat("f", t)},
                         {"parameters",
                          {{"type", "object"}, {"properties", props}, {"required", required}}}}}});
    }
    SCOPED_TRACE(tools.dump());
    absl::StatusOr<std::string> gbnf =
        DsmlToolCallGbnf(tools, std::nullopt, JsonGrammarOptions{i % 2 == 1});
    ASSERT_TRUE(gbnf.ok()) << gbnf.status();
    auto g = Compile(*gbnf);
    ASSERT_NE(g, nullptr) << *gbnf;
    for (int k = 0; k < 4; ++k) {
      std::optional<std::string> s = testing::RandomSentence(g, &rng, 20000);
      if (!s) continue;
      const chat::ParsedCompletion parsed = chat::ParseCompletion(*s, chat::ThinkingMode::kChat);
      EXPECT_EQ(parsed.content, "") << *s;
      ASSERT_FALSE(parsed.tool_calls.empty()) << *s;
      for (const chat::ParsedToolCall& call : parsed.tool_calls) {
        ++calls;
        const ordered_json* params = nullptr;
        for (const auto& t : tools) {
          if (t["function"]["name"] == call.name) params = &t["function"]["parameters"];
        }
        ASSERT_NE(params, nullptr) << call.name;
        nlohmann::json args = nlohmann::json::parse(call.arguments, nullptr, false);
        ASSERT_FALSE(args.is_discarded()) << call.arguments;
        EXPECT_TRUE(testing::MiniValidator(*params).Valid(args)) << call.arguments << "\n"
                                                                 << *s << "\n"
                                                                 << *gbnf;
      }
    }
  }
  EXPECT_GE(calls, 150);
}

// The block the chat encoder writes for an assistant's tool calls is a sentence.
TEST(DsmlToolGbnf, EncoderRenderingIsASentence) {
  const ordered_json messages = ordered_json::parse(R"([
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather",
        "arguments": "{\"city\": \"Paris \\\"Left\\\" Bank\", \"days\": 3, \"unit\": \"c\"}"}},
      {"type": "function", "function": {"name": "search",
        "arguments": "{\"query\": \"x<y\", \"filters\": [\"a\", \"b\"], \"limit\": null, \"opts\": {\"exact\": true}}"}},
      {"type": "function", "function": {"name": "now", "arguments": "{}"}},
      {"type": "function", "function": {"name": "mixed", "arguments": "{\"v\": 2.5}"}},
      {"type": "function", "function": {"name": "mixed", "arguments": "{\"v\": \"abc\", \"when\": \"2024-02-29\"}"}}
    ]}
  ])");
  absl::StatusOr<std::string> prompt = chat::EncodeMessages(messages, {});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  const size_t begin = prompt->find("\n\n<｜DSML｜tool_calls>");
  const std::string close = "</｜DSML｜tool_calls>";
  const size_t end = prompt->find(close);
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  const std::string block = prompt->substr(begin, end + close.size() - begin);
  absl::StatusOr<std::string> gbnf = DsmlToolCallGbnf(Tools(), std::nullopt, {});
  ASSERT_TRUE(gbnf.ok()) << gbnf.status();
  auto g = Compile(*gbnf);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Accepts(g, block)) << block;
  // Not parallel: one call only.
  auto single =
      Compile(*DsmlToolCallGbnf(Tools(), std::nullopt, {}, /*parallel_tool_calls=*/false));
  ASSERT_NE(single, nullptr);
  EXPECT_FALSE(Accepts(single, block));
  // Named: only one call of that tool.
  auto named = Compile(*DsmlToolCallGbnf(Tools(), std::string("get_weather"), {}));
  ASSERT_NE(named, nullptr);
  EXPECT_FALSE(Accepts(named, block));
  const size_t first_end =
      block.find("</｜DSML｜invoke>") + std::string("</｜DSML｜invoke>").size();
  EXPECT_TRUE(Accepts(named, absl::StrCat(block.substr(0, first_end), "\n", close))) << block;
  EXPECT_TRUE(Accepts(single, absl::StrCat(block.substr(0, first_end), "\n", close))) << block;
}

TEST(DsmlToolGbnf, RejectsWhatTheParserWouldNotTakeBack) {
  auto g = Compile(*DsmlToolCallGbnf(Tools(), std::nullopt, {}));
  ASSERT_NE(g, nullptr);
  const std::string head = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n";
  const std::string tail = "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  auto param = [](const std::string& name, const std::string& str, const std::string& value) {
    return absl::StrCat("<｜DSML｜parameter name=\"", name, "\" string=\"", str, "\">", value,
                        "</｜DSML｜parameter>\n");
  };
  EXPECT_TRUE(Accepts(g, head + param("city", "true", "Oslo") + tail));
  EXPECT_FALSE(Accepts(g, head + tail));                                        // city required
  EXPECT_FALSE(Accepts(g, head + param("city", "true", "a｜DSML｜b") + tail));  // markup in value
  EXPECT_FALSE(Accepts(g, head + param("city", "true", "a｜b") + tail));
  EXPECT_FALSE(Accepts(g, head + param("city", "false", "\"Oslo\"") + tail));  // strings are raw
  EXPECT_FALSE(Accepts(g, head + param("city", "true", "Oslo") + param("days", "false", "15") +
                              tail));  // maximum 14
  EXPECT_TRUE(
      Accepts(g, head + param("city", "true", "Oslo") + param("days", "false", "14") + tail));
  EXPECT_FALSE(Accepts(g, head + param("city", "true", "Oslo") + param("hours", "false", "1") +
                              tail));  // unknown parameter
  EXPECT_FALSE(Accepts(
      g, absl::StrCat("Sure!", head, param("city", "true", "Oslo"), tail)));  // nothing before
  // A JSON string value writes ｜ as an escape.
  const std::string search = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">\n" +
                             param("query", "true", "q") + param("filters", "false", "[\"a｜b\"]") +
                             tail;
  EXPECT_FALSE(Accepts(g, search));
  std::string escaped = search;
  escaped.replace(escaped.find("a｜b"), std::string("a｜b").size(), "a\\uff5cb");
  EXPECT_TRUE(Accepts(g, escaped)) << escaped;
}

// Every property optional: the call without any, as the encoder writes it (">\n\n"), or tighter.
TEST(DsmlToolGbnf, AllOptionalWithoutParameters) {
  const ordered_json tools = ordered_json::parse(
      R"([{"name": "opt", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}])");
  auto g = Compile(*DsmlToolCallGbnf(tools, std::nullopt, {}));
  ASSERT_NE(g, nullptr);
  const std::string head = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"opt\">\n";
  const std::string tail = "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  EXPECT_TRUE(Accepts(g, absl::StrCat(head, "\n", tail)));
  EXPECT_TRUE(Accepts(g, absl::StrCat(head, tail)));
  EXPECT_FALSE(Accepts(g, absl::StrCat(head, "\n\n", tail)));
  absl::StatusOr<std::string> prompt = chat::EncodeMessages(
      ordered_json::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant",
          "content": "", "tool_calls": [{"type": "function",
          "function": {"name": "opt", "arguments": "{}"}}]}])"),
      {});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_NE(prompt->find(absl::StrCat(head, "\n", tail)), std::string::npos) << *prompt;
}

TEST(DsmlToolGbnf, Errors) {
  EXPECT_EQ(DsmlToolCallGbnf(Tools(), std::string("missing"), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(DsmlToolCallGbnf(ordered_json::array(), std::nullopt, {}).ok());
  EXPECT_FALSE(DsmlToolCallGbnf(ordered_json::object(), std::nullopt, {}).ok());
  EXPECT_FALSE(DsmlToolCallGbnf(ordered_json::parse(R"([{"type": "function", "function": {}}])"),
                                std::nullopt, {})
                   .ok());
  EXPECT_FALSE(
      DsmlToolCallGbnf(ordered_json::parse(R"([{"name": "a｜DSML｜b"}])"), std::nullopt, {}).ok());
  absl::StatusOr<std::string> bad =
      DsmlToolCallGbnf(ordered_json::parse(R"([{"name": "f", "parameters": {"type": "object",
        "properties": {"n": {"type": "number", "multipleOf": 3}}}}])"),
                       std::nullopt, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("multipleOf"), std::string::npos) << bad.status();
  EXPECT_FALSE(DsmlToolCallGbnf(ordered_json::parse(R"([{"name": "f", "parameters":
        {"type": "string"}}])"),
                                std::nullopt, {})
                   .ok());
}

}  // namespace
}  // namespace ss::grammar
