// The converters' grammars on the real DeepSeek-V4 vocabulary (129,280 ids with the V4 added
// tokens): the chat encoder's DSML tool-call block and JSON instances, tokenised as the model
// would produce them (｜DSML｜ as the special token 128825), are accepted token by token, and
// the stop token only at the end.
#include <memory>
#include <string>
#include <vector>

#include "coordinator/chat_encoding.h"
#include "coordinator/grammar/compiled_grammar.h"
#include "coordinator/grammar/dsml_tool_gbnf.h"
#include "coordinator/grammar/grammar_matcher.h"
#include "coordinator/grammar/json_schema_gbnf.h"
#include "coordinator/grammar/regex_gbnf.h"
#include "coordinator/grammar/token_vocab.h"
#include "coordinator/tokenizer.h"
#include "gtest/gtest.h"

namespace ss::grammar {
namespace {

using nlohmann::ordered_json;

struct V4 {
  std::unique_ptr<Tokenizer> tok;
  std::shared_ptr<const TokenVocab> vocab;
  int32_t eos = -1;
};

const V4& Get() {
  static const V4* v4 = [] {
    auto* r = new V4;
    auto t = Tokenizer::Load(SS_TOKENIZER_JSON);
    if (!t.ok()) std::abort();
    auto added = ReadAddedTokensFile(SS_TOKENIZER_DATA "/v4_added_tokens.json");
    if (!added.ok() || !(*t)->AddSpecialTokens(*added).ok()) std::abort();
    r->tok = std::move(*t);
    r->eos = r->tok->TokenId("<｜end▁of▁sentence｜>").value_or(-1);
    r->vocab =
        std::make_shared<const TokenVocab>(TokenVocab::FromTokenizer(*r->tok, {r->eos}, 129280));
    return r;
  }();
  return *v4;
}

// Feeds `text`'s tokens one by one; true when all are accepted and only then EOS is allowed.
void ExpectTokensAccepted(const std::string& gbnf, const std::string& text) {
  const V4& v4 = Get();
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = CompileGrammar(gbnf, v4.vocab);
  ASSERT_TRUE(g.ok()) << g.status() << "\n" << gbnf;
  absl::StatusOr<std::vector<int32_t>> ids = v4.tok->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  GrammarMatcher m(*g);
  for (size_t i = 0; i < ids->size(); ++i) {
    EXPECT_FALSE(m.CanTerminate()) << "complete before token " << i;
    ASSERT_TRUE(m.AcceptToken((*ids)[i])) << "token " << i << " id " << (*ids)[i] << " of\n"
                                          << text;
  }
  EXPECT_TRUE(m.CanTerminate());
  EXPECT_TRUE(m.AcceptToken(v4.eos));
  EXPECT_TRUE(m.IsTerminated());
}

TEST(GrammarConvertV4, DsmlBlockOfTheEncoder) {
  const ordered_json tools = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                     "hours": {"type": "array", "items": {"type": "integer"}}},
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object",
      "properties": {}}}}
  ])");
  const ordered_json messages = ordered_json::parse(R"([
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather",
        "arguments": "{\"city\": \"São Paulo\", \"days\": 3, \"hours\": [1, 2]}"}},
      {"type": "function", "function": {"name": "now", "arguments": "{}"}}]}
  ])");
  absl::StatusOr<std::string> prompt = chat::EncodeMessages(messages, {});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  const std::string close = "</｜DSML｜tool_calls>";
  const size_t begin = prompt->find("\n\n<｜DSML｜tool_calls>");
  const size_t end = prompt->find(close);
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  absl::StatusOr<std::string> gbnf = DsmlToolCallGbnf(tools, std::nullopt, {});
  ASSERT_TRUE(gbnf.ok()) << gbnf.status();
  ExpectTokensAccepted(*gbnf, prompt->substr(begin, end + close.size() - begin));
}

TEST(GrammarConvertV4, JsonInstances) {
  const ordered_json schema = ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "when": {"type": "string", "format": "date-time"},
      "score": {"type": "number", "minimum": 0, "maximum": 1},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
      "id": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"}},
      "required": ["name", "when", "score", "tags", "id"], "additionalProperties": false})");
  absl::StatusOr<std::string> compact = JsonSchemaToGbnf(schema, {});
  ASSERT_TRUE(compact.ok()) << compact.status();
  ExpectTokensAccepted(
      *compact,
      R"({"name":"Zoë \"Z\"","when":"2024-02-29T23:59:59Z","score":0.75,"tags":["a","b"],"id":"ABC-12"})");
  absl::StatusOr<std::string> spaced = JsonSchemaToGbnf(schema, {true});
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  ExpectTokensAccepted(*spaced, R"({
  "name": "x",
  "when": "2024-01-01T00:00:00+01:00",
  "score": 1,
  "tags": [],
  "id": "XYZ-9"
})");
  ExpectTokensAccepted(JsonObjectGbnf({}), R"({"k":[1,{"n":null}],"s":"t"})");
}

TEST(GrammarConvertV4, RegexAndChoice) {
  ExpectTokensAccepted(*RegexToGbnf("(\\d{3}-){2}\\d{4}"), "555-123-4567");
  ExpectTokensAccepted(*ChoiceToGbnf({"positive", "negative", "neutral"}), "negative");
}

}  // namespace
}  // namespace ss::grammar
