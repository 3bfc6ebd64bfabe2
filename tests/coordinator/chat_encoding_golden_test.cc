// The official DeepSeek-V4 encoding conformance files (tests/data/encoding, see its README):
// byte-exact prompts for the four cases, and every assistant turn of them parsed back.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/chat_encoding.h"
#include "coordinator/completion_parser.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ss::chat {
namespace {

using Json = nlohmann::ordered_json;

std::string ReadFile(const std::string& name) {
  std::ifstream in(std::string(SS_ENCODING_DATA) + "/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ThinkingMode CaseMode(int n) { return n == 4 ? ThinkingMode::kChat : ThinkingMode::kThinking; }

// The calling conventions of the golden README.
Json CaseMessages(int n) {
  Json input = Json::parse(ReadFile("test_input_" + std::to_string(n) + ".json"));
  if (input.is_object()) {
    Json messages = input["messages"];
    messages[0]["tools"] = input["tools"];
    return messages;
  }
  return input;
}

std::string FirstDifference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return "first difference at byte " + std::to_string(i) + ":\n got: ..." +
         got.substr(i > 40 ? i - 40 : 0, 120) + "\nwant: ..." +
         want.substr(i > 40 ? i - 40 : 0, 120);
}

class GoldenCase : public ::testing::TestWithParam<int> {};

TEST_P(GoldenCase, PromptIsByteExact) {
  const int n = GetParam();
  EncodeOptions opts;
  opts.mode = CaseMode(n);
  absl::StatusOr<std::string> prompt = EncodeMessages(CaseMessages(n), opts);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  const std::string want = ReadFile("test_output_" + std::to_string(n) + ".txt");
  EXPECT_EQ(*prompt, want) << FirstDifference(*prompt, want);
}

// One rendered assistant turn: its text after `<｜Assistant｜>` and the opening `<think>` /
// `</think>` (and task token), through its EOS, and the mode to parse it in.
struct Turn {
  std::string text;
  ThinkingMode mode;
};

std::vector<Turn> AssistantTurns(const std::string& prompt) {
  const std::string assistant(kAssistantToken);
  std::vector<Turn> turns;
  for (size_t at = prompt.find(assistant); at != std::string::npos;
       at = prompt.find(assistant, at + 1)) {
    size_t begin = at + assistant.size();
    ThinkingMode mode = ThinkingMode::kChat;
    if (prompt.compare(begin, kThinkingStart.size(), kThinkingStart) == 0) {
      mode = ThinkingMode::kThinking;
      begin += kThinkingStart.size();
    } else if (prompt.compare(begin, kThinkingEnd.size(), kThinkingEnd) == 0) {
      begin += kThinkingEnd.size();
    }
    for (std::string_view task : {"<｜action｜>", "<｜query｜>"}) {
      if (prompt.compare(begin, task.size(), task) == 0) begin += task.size();
    }
    const size_t eos = prompt.find(kEosToken, begin);
    if (eos == std::string::npos) break;
    turns.push_back({prompt.substr(begin, eos + kEosToken.size() - begin), mode});
  }
  return turns;
}

TEST_P(GoldenCase, AssistantTurnsParseBack) {
  const int n = GetParam();
  const std::string prompt = ReadFile("test_output_" + std::to_string(n) + ".txt");
  std::vector<Json> assistants;
  for (const Json& m : CaseMessages(n)) {
    if (m["role"] == "assistant") assistants.push_back(m);
  }
  const std::vector<Turn> turns = AssistantTurns(prompt);
  ASSERT_EQ(turns.size(), assistants.size());
  for (size_t i = 0; i < turns.size(); ++i) {
    SCOPED_TRACE("assistant turn " + std::to_string(i));
    const Json& want = assistants[i];
    const ParsedCompletion got = ParseCompletion(turns[i].text, turns[i].mode);
    // A turn rendered without `<think>` had its reasoning dropped (or was chat mode).
    const std::string reasoning = turns[i].mode == ThinkingMode::kThinking
                                      ? want.value("reasoning_content", std::string())
                                      : std::string();
    EXPECT_EQ(got.reasoning_content, reasoning);
    EXPECT_EQ(got.content, want.value("content", std::string()));
    const Json calls = want.value("tool_calls", Json::array());
    ASSERT_EQ(got.tool_calls.size(), calls.size());
    for (size_t c = 0; c < calls.size(); ++c) {
      EXPECT_EQ(got.tool_calls[c].name, calls[c]["function"]["name"]);
      // The golden arguments are written the way Python's json.dumps writes them.
      EXPECT_EQ(got.tool_calls[c].arguments, calls[c]["function"]["arguments"]);
      EXPECT_FALSE(got.tool_calls[c].id.has_value());
    }

    // The streaming parser agrees at every split point.
    for (size_t cut = 0; cut <= turns[i].text.size(); ++cut) {
      CompletionStreamParser parser(turns[i].mode);
      ParsedCompletion streamed;
      for (const CompletionDelta& d :
           {parser.Feed(std::string_view(turns[i].text).substr(0, cut)),
            parser.Feed(std::string_view(turns[i].text).substr(cut)), parser.Finish()}) {
        streamed.reasoning_content += d.reasoning_content;
        streamed.content += d.content;
        streamed.tool_calls.insert(streamed.tool_calls.end(), d.tool_calls.begin(),
                                   d.tool_calls.end());
      }
      ASSERT_EQ(streamed, got) << "split at " << cut;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Encoding, GoldenCase, ::testing::Values(1, 2, 3, 4));

// The checks of the official test file, as the golden README lists them.
TEST(GoldenEncoding, OfficialParseChecks) {
  const std::string p1 = ReadFile("test_output_1.txt");
  const std::string open = std::string(kAssistantToken) + std::string(kThinkingStart);
  const size_t first = p1.find(open) + open.size();
  const ParsedCompletion call = ParseCompletion(
      p1.substr(first, p1.find(kUserToken, first) - first), ThinkingMode::kThinking);
  EXPECT_EQ(call.reasoning_content,
            "The user wants to know the weather in Beijing. I should use the get_weather tool.");
  EXPECT_EQ(call.content, "");
  ASSERT_EQ(call.tool_calls.size(), 1u);
  EXPECT_EQ(call.tool_calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(call.tool_calls[0].arguments),
            Json::parse(R"({"location": "Beijing", "unit": "celsius"})"));

  const ParsedCompletion answer =
      ParseCompletion(p1.substr(p1.rfind(open) + open.size()), ThinkingMode::kThinking);
  EXPECT_EQ(answer.reasoning_content, "Got the weather data. Let me format a nice response.");
  EXPECT_NE(answer.content.find("22°C"), std::string::npos);
  EXPECT_TRUE(answer.tool_calls.empty());

  const std::string p2 = ReadFile("test_output_2.txt");
  const ParsedCompletion last =
      ParseCompletion(p2.substr(p2.rfind(open) + open.size()), ThinkingMode::kThinking);
  EXPECT_EQ(last.reasoning_content, "The user asks about the capital of France. It is Paris.");
  EXPECT_EQ(last.content, "The capital of France is Paris.");
  EXPECT_EQ(p2.find("The user said hello"), std::string::npos);
}

// The fixed texts the four cases do not exercise come from prompt_strings.json.
TEST(GoldenEncoding, FixedStringsMatchPromptStrings) {
  const Json strings = Json::parse(ReadFile("prompt_strings.json"))["strings"];
  const Json messages = Json::parse(R"([
    {"role": "system", "content": "S", "response_format": {"type": "object", "x": [1, 2.5]}},
    {"role": "user", "content": "U"}])");
  EncodeOptions opts;
  opts.mode = ThinkingMode::kThinking;
  opts.reasoning_effort = "max";
  absl::StatusOr<std::string> prompt = EncodeMessages(messages, opts);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  std::string format = strings["response_format_template"];
  format.replace(format.find("{schema}"), 8, R"({"type": "object", "x": [1, 2.5]})");
  EXPECT_EQ(*prompt, std::string(kBosToken) + strings["REASONING_EFFORT_MAX"].get<std::string>() +
                         "S\n\n" + format + "<｜User｜>U<｜Assistant｜><think>");

  for (const char* name :
       {"bos_token", "eos_token", "thinking_start_token", "thinking_end_token", "dsml_token",
        "USER_SP_TOKEN", "ASSISTANT_SP_TOKEN", "LATEST_REMINDER_SP_TOKEN"}) {
    const std::string s = strings[name];
    EXPECT_TRUE(s == kBosToken || s == kEosToken || s == kThinkingStart || s == kThinkingEnd ||
                s == kDsmlToken || s == kUserToken || s == kAssistantToken ||
                s == kLatestReminderToken)
        << name;
  }
  // Every task token, through the encoder (a non-action task follows the message directly).
  for (const auto& [task, token] : strings["DS_TASK_SP_TOKENS"].items()) {
    if (task == "action") continue;
    const Json m = Json::array({{{"role", "user"}, {"content", "q"}, {"task", task}}});
    absl::StatusOr<std::string> p = EncodeMessages(m, EncodeOptions{});
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, std::string(kBosToken) + "<｜User｜>q" + token.get<std::string>()) << task;
  }
}

}  // namespace
}  // namespace ss::chat
