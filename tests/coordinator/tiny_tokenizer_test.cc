// The bundled tiny tokenizer (models/tiny/tokenizer.json, coordinator/tools/tiny_tokenizer.h):
// regenerating it gives the committed file byte for byte, it has DeepSeek's format, fits the
// tiny model's 1024 ids, round-trips text exactly and keeps every chat-format special token whole.
#include "coordinator/tools/tiny_tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/chat_encoding.h"
#include "coordinator/dsv4_format.h"
#include "coordinator/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace ss {
namespace {

using Json = nlohmann::ordered_json;

constexpr int32_t kTinyVocab = 1024;  // tests/data/tiny-a/config.json vocab_size

using testing_util::ReadAll;

class TinyTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = Tokenizer::Load(SS_MODELS_DIR "/tiny/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = tok->release();
  }
  static void TearDownTestSuite() { delete tokenizer_; }

  static void ExpectRoundTrip(const std::string& text) {
    auto ids = tokenizer_->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    for (int32_t id : *ids) ASSERT_LT(id, kTinyVocab) << text;
    auto back = tokenizer_->Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
  }

  static inline Tokenizer* tokenizer_ = nullptr;
};

TEST_F(TinyTokenizerTest, RegeneratesIdentically) {
  const std::string corpus = ReadAll(SS_MODELS_DIR "/tiny/corpus.txt");
  auto json = tools::MakeTinyTokenizerJson(corpus, kTinyVocab);
  ASSERT_TRUE(json.ok()) << json.status();
  // On a mismatch: build/bin/make_tiny_tokenizer rewrites models/tiny/tokenizer.json.
  EXPECT_TRUE(*json == ReadAll(SS_MODELS_DIR "/tiny/tokenizer.json"))
      << "models/tiny/tokenizer.json is stale: run make_tiny_tokenizer";
}

TEST_F(TinyTokenizerTest, SameFormatAsDeepSeek) {
  // Unordered: an ordered_json of DeepSeek's 128000-entry vocab takes seconds to build.
  const nlohmann::json tiny = nlohmann::json::parse(ReadAll(SS_MODELS_DIR "/tiny/tokenizer.json"));
  const nlohmann::json ds = nlohmann::json::parse(ReadAll(SS_TOKENIZER_JSON));
  for (const char* key : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) {
    EXPECT_EQ(tiny[key], ds[key]) << key;
  }
  for (const auto& [key, value] : ds["model"].items()) {
    ASSERT_TRUE(tiny["model"].contains(key)) << key;
    if (key != "vocab" && key != "merges") {
      EXPECT_EQ(tiny["model"][key], value) << key;
    }
  }
  // The 256 byte tokens sit at DeepSeek's ids (3..258).
  for (const auto& [token, id] : ds["model"]["vocab"].items()) {
    if (id.get<int>() < 259) {
      EXPECT_EQ(tiny["model"]["vocab"][token], id) << token;
    }
  }
  // Every id is used and below the model's vocab_size.
  EXPECT_EQ(tokenizer_->vocab_size(), kTinyVocab);
  for (int32_t id = 0; id < kTinyVocab; ++id) {
    EXPECT_TRUE(tokenizer_->TokenBytes(id).has_value()) << id;
  }
}

TEST_F(TinyTokenizerTest, SpecialTokensAreSingleIds) {
  // BOS and EOS at tiny-a's bos_token_id / eos_token_id.
  EXPECT_EQ(tokenizer_->TokenId(chat::kBosToken), 0);
  EXPECT_EQ(tokenizer_->TokenId(chat::kEosToken), 1);
  const std::vector<std::string_view> specials = {
      chat::kBosToken,      chat::kEosToken,    chat::kUserToken,  chat::kAssistantToken,
      chat::kThinkingStart, chat::kThinkingEnd, chat::kDsmlToken,  chat::kLatestReminderToken,
      "<｜action｜>",       "<｜query｜>",      "<｜authority｜>", "<｜domain｜>",
      "<｜title｜>",        "<｜read_url｜>"};
  for (std::string_view s : specials) {
    auto ids = tokenizer_->Encode(s);
    ASSERT_TRUE(ids.ok());
    ASSERT_EQ(ids->size(), 1u) << s;
    EXPECT_TRUE(tokenizer_->IsAddedToken((*ids)[0])) << s;
    EXPECT_LT((*ids)[0], kTinyVocab);
  }
  for (const auto& t : tools::TinySpecialTokens(kTinyVocab)) {
    EXPECT_EQ(tokenizer_->TokenId(t.content), t.id) << t.content;
  }
}

TEST_F(TinyTokenizerTest, RoundTripsText) {
  ExpectRoundTrip(ReadAll(SS_MODELS_DIR "/tiny/corpus.txt"));
  ExpectRoundTrip("Hello, world! 2+2=4. 你好 🎉 Ελληνικά \t\r\n  trailing  ");
  ExpectRoundTrip(std::string("\0\x01\x7f", 3));
  // Every text of the DeepSeek tokenizer's golden cases.
  std::ifstream cases(SS_TOKENIZER_DATA "/cases_v4.jsonl");
  ASSERT_TRUE(cases);
  std::string line;
  int n = 0;
  while (std::getline(cases, line)) {
    ExpectRoundTrip(Json::parse(line)["text"].get<std::string>());
    ++n;
  }
  EXPECT_GT(n, 200);
}

TEST_F(TinyTokenizerTest, ChatPromptKeepsItsMarkup) {
  const Json messages = Json::parse(R"([
    {"role": "system", "content": "You are helpful.", "tools": [{"type": "function",
     "function": {"name": "get_weather", "parameters": {"type": "object",
     "properties": {"city": {"type": "string"}}}}}]},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
  ])");
  chat::EncodeOptions opts;
  opts.mode = chat::ThinkingMode::kThinking;
  auto prompt = chat::EncodeMessages(messages, opts);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  ExpectRoundTrip(*prompt);
  auto ids = tokenizer_->Encode(*prompt);
  ASSERT_TRUE(ids.ok());
  auto count = [&](std::string_view token) {
    const int32_t id = *tokenizer_->TokenId(token);
    return std::count(ids->begin(), ids->end(), id);
  };
  EXPECT_EQ(count(chat::kBosToken), 1);
  EXPECT_GE(count(chat::kDsmlToken), 4);
  EXPECT_EQ(count(chat::kUserToken), 2);  // the tool result is a user turn
  EXPECT_GE(count(chat::kAssistantToken), 1);
  EXPECT_EQ(ids->back(), *tokenizer_->TokenId(chat::kThinkingStart));
}

}  // namespace
}  // namespace ss
