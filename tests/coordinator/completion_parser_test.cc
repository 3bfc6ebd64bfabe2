// Completion parsing: the grammar, graceful degradation on malformed output, round trips through
// the encoder, and the streaming parser's independence from how the text is split.
#include "coordinator/completion_parser.h"

#include <random>
#include <string>
#include <vector>

#include "coordinator/chat_encoding.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ss::chat {
namespace {

using Json = nlohmann::ordered_json;

const std::string kEos(kEosToken);
const std::string kBlock = "\n\n<｜DSML｜tool_calls>\n";
const std::string kBlockEnd = "</｜DSML｜tool_calls>";

std::string Invoke(const std::string& name, const std::string& params) {
  return "<｜DSML｜invoke name=\"" + name + "\">\n" + params + "</｜DSML｜invoke>\n";
}
std::string Param(const std::string& name, bool is_str, const std::string& value) {
  return "<｜DSML｜parameter name=\"" + name + "\" string=\"" + (is_str ? "true" : "false") +
         "\">" + value + "</｜DSML｜parameter>\n";
}

void Absorb(const CompletionDelta& d, ParsedCompletion* into) {
  into->reasoning_content += d.reasoning_content;
  into->content += d.content;
  into->tool_calls.insert(into->tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
}

// True when `s` does not end inside a UTF-8 sequence.
bool EndsOnCharBoundary(const std::string& s) {
  for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;
    const size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    return need <= back;
  }
  return true;
}

// Feeds `text` in the given pieces and checks what every delta may contain.
ParsedCompletion Stream(std::string_view text, ThinkingMode mode, const std::vector<size_t>& cuts) {
  CompletionStreamParser parser(mode);
  ParsedCompletion out;
  size_t begin = 0;
  for (size_t cut : cuts) {
    const CompletionDelta d = parser.Feed(text.substr(begin, cut - begin));
    EXPECT_TRUE(EndsOnCharBoundary(d.reasoning_content) && EndsOnCharBoundary(d.content));
    Absorb(d, &out);
    begin = cut;
  }
  Absorb(parser.Feed(text.substr(begin)), &out);
  Absorb(parser.Finish(), &out);
  EXPECT_TRUE(parser.Finish().empty());
  EXPECT_TRUE(parser.done());
  return out;
}

// The streaming parser agrees with ParseCompletion for every 2-way split, byte-by-byte feeding
// and random chunkings.
void ExpectSplitInvariant(std::string_view text, ThinkingMode mode, std::mt19937* rng) {
  const ParsedCompletion whole = ParseCompletion(text, mode);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ASSERT_EQ(Stream(text, mode, {cut}), whole) << "split at " << cut << " of: " << text;
  }
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  ASSERT_EQ(Stream(text, mode, bytes), whole) << "byte by byte: " << text;
  for (int round = 0; round < 20; ++round) {
    std::vector<size_t> cuts;
    for (size_t at = 0; at < text.size();) {
      at += 1 + (*rng)() % 12;
      if (at < text.size()) cuts.push_back(at);
    }
    ASSERT_EQ(Stream(text, mode, cuts), whole) << "random chunks of: " << text;
  }
}

TEST(CompletionParser, ThinkingAndContent) {
  const ParsedCompletion p =
      ParseCompletion("Let me think.</think>The answer." + kEos, ThinkingMode::kThinking);
  EXPECT_EQ(p.reasoning_content, "Let me think.");
  EXPECT_EQ(p.content, "The answer.");
  EXPECT_TRUE(p.tool_calls.empty());

  // Chat mode: all content; no EOS needed.
  EXPECT_EQ(ParseCompletion("plain", ThinkingMode::kChat).content, "plain");
  // Thinking cut off by the length limit: all reasoning.
  const ParsedCompletion cut = ParseCompletion("still thinking", ThinkingMode::kThinking);
  EXPECT_EQ(cut.reasoning_content, "still thinking");
  EXPECT_EQ(cut.content, "");
  // EOS ends the message; anything after it is dropped.
  EXPECT_EQ(ParseCompletion("a" + kEos + "b", ThinkingMode::kChat).content, "a");
}

TEST(CompletionParser, ToolCalls) {
  const std::string text = "r</think>Checking." + kBlock +
                           Invoke("get_weather", Param("location", true, "北京 \"city\"\nx") +
                                                     Param("days", false, "3") +
                                                     Param("opts", false, "{\"a\": [1, 2.5]}")) +
                           Invoke("now", "") + kBlockEnd + kEos;
  const ParsedCompletion p = ParseCompletion(text, ThinkingMode::kThinking);
  EXPECT_EQ(p.reasoning_content, "r");
  EXPECT_EQ(p.content, "Checking.");
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.tool_calls[0].arguments,
            R"({"location": "北京 \"city\"\nx", "days": 3, "opts": {"a": [1, 2.5]}})");
  EXPECT_EQ(p.tool_calls[1].name, "now");
  EXPECT_EQ(p.tool_calls[1].arguments, "{}");
  // The encoder's own form for a call without parameters ("\n\n" inside the invoke).
  const ParsedCompletion empty =
      ParseCompletion(kBlock + "<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n" + kBlockEnd,
                      ThinkingMode::kChat);
  ASSERT_EQ(empty.tool_calls.size(), 1u);
  EXPECT_EQ(empty.tool_calls[0].arguments, "{}");
  EXPECT_EQ(empty.content, "");
}

TEST(CompletionParser, WithoutToolCallsTheMarkupIsText) {
  const std::string block = kBlock + Invoke("now", "") + kBlockEnd;
  const std::string text = "r</think>Checking." + block + kEos + "after";
  const ParsedCompletion p = ParseCompletion(text, ThinkingMode::kThinking, /*tool_calls=*/false);
  EXPECT_EQ(p.reasoning_content, "r");
  EXPECT_EQ(p.content, "Checking." + block);
  EXPECT_TRUE(p.tool_calls.empty());
  // Streamed in pieces of one byte: the same.
  CompletionStreamParser s(ThinkingMode::kThinking, false);
  std::string content;
  for (char c : text) content += s.Feed(std::string(1, c)).content;
  content += s.Finish().content;
  EXPECT_EQ(content, p.content);
}

TEST(CompletionParser, ToolBlockInsideReasoningEndsIt) {
  const ParsedCompletion p =
      ParseCompletion("thinking" + kBlock + Invoke("f", Param("k", true, "v")) + kBlockEnd + kEos,
                      ThinkingMode::kThinking);
  EXPECT_EQ(p.reasoning_content, "thinking");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"k": "v"})");
}

TEST(CompletionParser, BadJsonParameterBecomesAString) {
  const ParsedCompletion p = ParseCompletion(
      kBlock + Invoke("f", Param("n", false, "12 apples") + Param("e", false, "")) + kBlockEnd,
      ThinkingMode::kChat);
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"n": "12 apples", "e": ""})");
  EXPECT_TRUE(nlohmann::json::accept(p.tool_calls[0].arguments));
}

// Malformed blocks keep every byte as text, in the channel they interrupted.
TEST(CompletionParser, MalformedBlocksStayText) {
  const std::string good = kBlock + Invoke("f", Param("k", true, "v")) + kBlockEnd;
  const std::vector<std::string> malformed = {
      kBlock + Invoke("f", Param("k", true, "v")),  // unclosed
      kBlock + "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"k\" string=\"true\">v",
      "\n\n<｜DSML｜tool_calls",                  // just the marker
      "\n\n<｜DSML｜tool_callsX>\n" + kBlockEnd,  // wrong tag
      kBlock + "junk" + kBlockEnd,                // junk inside
      kBlock + Invoke("f", Param("k", true, "1") + Param("k", true, "2")) + kBlockEnd,  // dup
      kBlock +
          Invoke("f", "<｜DSML｜parameter name=\"k\" string=\"maybe\">v</｜DSML｜parameter>\n") +
          kBlockEnd,                                                           // bad string=
      kBlock + "<｜DSML｜invoke nom=\"f\">\n</｜DSML｜invoke>\n" + kBlockEnd,  // bad header
  };
  for (const std::string& block : malformed) {
    const ParsedCompletion chat = ParseCompletion("before" + block, ThinkingMode::kChat);
    EXPECT_EQ(chat.content, "before" + block);
    EXPECT_TRUE(chat.tool_calls.empty());
    const ParsedCompletion think = ParseCompletion("r" + block + kEos, ThinkingMode::kThinking);
    EXPECT_EQ(think.reasoning_content, "r" + block);
    EXPECT_EQ(think.content, "");
    // A well-formed block after a malformed one is still found.
    const ParsedCompletion later = ParseCompletion("x" + block + good + kEos, ThinkingMode::kChat);
    EXPECT_EQ(later.content, "x" + block) << block;
    EXPECT_EQ(later.tool_calls.size(), 1u) << block;
  }
}

TEST(CompletionParser, TextAfterABlockIsContent) {
  const ParsedCompletion p = ParseCompletion(
      "a" + kBlock + Invoke("f", "") + kBlockEnd + " trailing" + kEos, ThinkingMode::kChat);
  EXPECT_EQ(p.content, "a trailing");
  EXPECT_EQ(p.tool_calls.size(), 1u);
}

TEST(CompletionParser, SpecialTokensInsideContentAreKept) {
  const std::string weird =
      "<think>x</think><｜begin▁of▁sentence｜><｜User｜>｜DSML｜<｜DSML｜invoke name=\"f\">";
  EXPECT_EQ(ParseCompletion(weird, ThinkingMode::kChat).content, weird);
  const ParsedCompletion t = ParseCompletion("r</think>" + weird, ThinkingMode::kThinking);
  EXPECT_EQ(t.reasoning_content, "r");
  EXPECT_EQ(t.content, weird);
}

TEST(CompletionStreamParser, HoldsBackWhatMayBeMarkup) {
  CompletionStreamParser p(ThinkingMode::kThinking);
  CompletionDelta d = p.Feed("abc</thi");
  EXPECT_EQ(d.reasoning_content, "abc");
  d = p.Feed("nk>Hello\n");
  EXPECT_EQ(d.reasoning_content, "");
  EXPECT_EQ(d.content, "Hello");
  d = p.Feed("\n<｜DSML｜tool");
  EXPECT_TRUE(d.empty());
  d = p.Feed("_calls>\n" + Invoke("f", Param("k", false, "1")));
  EXPECT_TRUE(d.empty());  // the block is held whole until it closes
  d = p.Feed(kBlockEnd + "<｜end▁of");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"k": 1})");
  EXPECT_EQ(d.content, "");
  d = p.Feed("▁sentence｜>ignored");
  EXPECT_TRUE(d.empty());
  EXPECT_TRUE(p.done());
  EXPECT_TRUE(p.Feed("more").empty());
}

TEST(CompletionStreamParser, FinishReleasesHeldText) {
  CompletionStreamParser p(ThinkingMode::kChat);
  EXPECT_EQ(p.Feed("end\n\n<｜DSML").content, "end");
  EXPECT_EQ(p.Finish().content, "\n\n<｜DSML");
}

TEST(CompletionStreamParser, NeverSplitsAUtf8Character) {
  const std::string ni = "你";  // 3 bytes
  CompletionStreamParser p(ThinkingMode::kChat);
  EXPECT_EQ(p.Feed(ni.substr(0, 1)).content, "");
  EXPECT_EQ(p.Feed(ni.substr(1, 1)).content, "");
  EXPECT_EQ(p.Feed(ni.substr(2) + "a").content, ni + "a");
}

TEST(CompletionStreamParser, MatchesOneShotAtEverySplit) {
  std::mt19937 rng(7);
  const std::string call = kBlock + Invoke("f", Param("s", true, "北京") + Param("n", false, "2")) +
                           Invoke("g", "") + kBlockEnd;
  const std::vector<std::pair<std::string, ThinkingMode>> texts = {
      {"思考中</think>答案" + call + kEos, ThinkingMode::kThinking},
      {"r</think>" + call, ThinkingMode::kThinking},
      {"r" + call + "c" + kEos, ThinkingMode::kThinking},
      {"a\n\nb\n\n<｜DSML｜c</thinkd" + kEos + "x", ThinkingMode::kThinking},
      {"x" + kBlock + Invoke("f", Param("k", true, "v")) + "more" + call, ThinkingMode::kChat},
      {"x" + kBlock + "junk" + call + "\n\n", ThinkingMode::kChat},
      {kBlock + Invoke("f", Param("k", true, "1") + Param("k", true, "2")) + kBlockEnd,
       ThinkingMode::kChat},
      {"<think>x</think><｜User｜>" + kEos.substr(0, 8), ThinkingMode::kChat},
      {"", ThinkingMode::kThinking},
  };
  for (const auto& [text, mode] : texts) ExpectSplitInvariant(text, mode, &rng);
}

// Random texts built from markup fragments: no crash, split invariance, and when no block can
// have closed and no EOS was written, every byte comes back.
TEST(CompletionStreamParser, RandomFragments) {
  std::mt19937 rng(99);
  const std::vector<std::string> fragments = {"a",
                                              "你好",
                                              " ",
                                              "\n",
                                              "\n\n",
                                              ">",
                                              "\"",
                                              "</think>",
                                              "</thi",
                                              "<think>",
                                              "\n\n<｜DSML｜",
                                              "\n\n<｜DSML｜tool_calls",
                                              ">\n",
                                              "<｜DSML｜invoke",
                                              " name=\"f\">\n",
                                              "<｜DSML｜parameter",
                                              " name=\"k\" string=\"true\">",
                                              " string=\"false\">",
                                              "1",
                                              "</｜DSML｜parameter>",
                                              "</｜DSML｜invoke>",
                                              "</｜DSML｜tool_calls>",
                                              "<｜end▁of▁sentence｜>",
                                              "<｜end▁"};
  for (int iter = 0; iter < 400; ++iter) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 14);
    for (int i = 0; i < n; ++i) text += fragments[rng() % fragments.size()];
    const ThinkingMode mode = rng() % 2 ? ThinkingMode::kThinking : ThinkingMode::kChat;
    ExpectSplitInvariant(text, mode, &rng);
    if (text.find(kBlockEnd) != std::string::npos || text.find(kEos) != std::string::npos) continue;
    const ParsedCompletion p = ParseCompletion(text, mode);
    if (mode == ThinkingMode::kChat) {
      EXPECT_EQ(p.content, text);
    } else if (const size_t end = text.find("</think>"); end != std::string::npos) {
      EXPECT_EQ(p.reasoning_content, text.substr(0, end));
      EXPECT_EQ(p.content, text.substr(end + 8));
    } else {
      EXPECT_EQ(p.reasoning_content, text);
      EXPECT_EQ(p.content, "");
    }
  }
}

// Encode an assistant turn, cut its rendered text out of the prompt and parse it back.
TEST(CompletionParser, RoundTripThroughTheEncoder) {
  const Json assistants = Json::parse(R"([
    {"role": "assistant", "reasoning_content": "想一想", "content": "答案是 42。"},
    {"role": "assistant", "reasoning_content": "", "content": "", "tool_calls": [
      {"id": "1", "function": {"name": "search", "arguments":
        "{\"q\": \"a \\\"quoted\\\"\\nline\", \"n\": 10, \"f\": 0.5, \"deep\": {\"x\": [true, null, \"二\"]}}"}},
      {"id": "2", "function": {"name": "noop", "arguments": "{}"}}]},
    {"role": "assistant", "reasoning_content": "r\n\nwith blank lines", "content": "c <b>html</b>",
     "tool_calls": [{"function": {"name": "f", "arguments": {"list": [], "obj": {}, "s": ""}}}]}
  ])");
  for (const Json& assistant : assistants) {
    for (const ThinkingMode mode : {ThinkingMode::kThinking, ThinkingMode::kChat}) {
      Json messages = Json::array({{{"role", "user"}, {"content", "q"}}, assistant});
      EncodeOptions opts;
      opts.mode = mode;
      absl::StatusOr<std::string> prompt = EncodeMessages(messages, opts);
      ASSERT_TRUE(prompt.ok()) << prompt.status();
      const std::string head =
          std::string(kAssistantToken) +
          std::string(mode == ThinkingMode::kThinking ? kThinkingStart : kThinkingEnd);
      const std::string turn = prompt->substr(prompt->find(head) + head.size());
      const ParsedCompletion p = ParseCompletion(turn, mode);
      EXPECT_EQ(p.reasoning_content, mode == ThinkingMode::kThinking
                                         ? assistant["reasoning_content"].get<std::string>()
                                         : "");
      EXPECT_EQ(p.content, assistant["content"].get<std::string>());
      const Json calls = assistant.value("tool_calls", Json::array());
      ASSERT_EQ(p.tool_calls.size(), calls.size());
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(p.tool_calls[i].name, calls[i]["function"]["name"]);
        const Json& args = calls[i]["function"]["arguments"];
        EXPECT_EQ(Json::parse(p.tool_calls[i].arguments),
                  args.is_string() ? Json::parse(args.get<std::string>()) : args);
      }
      std::mt19937 rng(3);
      ExpectSplitInvariant(turn, mode, &rng);
    }
  }
}

}  // namespace
}  // namespace ss::chat
