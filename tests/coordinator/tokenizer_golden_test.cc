// Golden tokenizer cases (tests/data/tokenizer/README.md): every line of cases.jsonl with the V3
// tokenizer.json as is, every line of cases_v4.jsonl with the V4 special tokens added, and the two
// published vectors. Each line checks the ids, the token strings, Decode == text and streaming
// decode == Decode.
#include <fstream>
#include <string>
#include <vector>

#include "coordinator/tokenizer.h"
#include "coordinator/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ss {
namespace {

using nlohmann::json;

std::unique_ptr<Tokenizer> LoadTokenizer(bool v4) {
  auto t = Tokenizer::Load(SS_TOKENIZER_JSON);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  if (v4) {
    auto added = ReadAddedTokensFile(SS_TOKENIZER_DATA "/v4_added_tokens.json");
    EXPECT_TRUE(added.ok()) << added.status();
    if (!added.ok()) return nullptr;
    const absl::Status st = (*t)->AddSpecialTokens(*added);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return nullptr;
  }
  return std::move(*t);
}

std::vector<json> ReadLines(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    out.push_back(json::parse(line));
  }
  return out;
}

// Checks every case of `file`; *lines = the number of lines checked.
void CheckFile(const Tokenizer& tok, const std::string& file, size_t* lines) {
  const std::vector<json> cases = ReadLines(std::string(SS_TOKENIZER_DATA "/") + file);
  *lines = cases.size();
  size_t line = 0;
  for (const json& c : cases) {
    ++line;
    const std::string text = c.at("text").get<std::string>();
    const std::vector<int32_t> want = c.at("ids").get<std::vector<int32_t>>();
    const std::vector<std::string> tokens = c.at("tokens").get<std::vector<std::string>>();
    const std::string where = file + ":" + std::to_string(line) + " (" +
                              c.at("category").get<std::string>() + ") " + json(text).dump();
    auto ids = tok.Encode(text);
    ASSERT_TRUE(ids.ok()) << where << ": " << ids.status();
    EXPECT_EQ(*ids, want) << where;
    ASSERT_EQ(tokens.size(), want.size()) << where;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(tok.TokenId(tokens[i]), want[i]) << where << " token " << i;
    }
    auto decoded = tok.Decode(want);
    ASSERT_TRUE(decoded.ok()) << where << ": " << decoded.status();
    EXPECT_EQ(*decoded, text) << where;
    EXPECT_EQ(*decoded, c.at("decoded").get<std::string>()) << where;

    StreamDecoder stream(tok);
    std::string streamed;
    for (int32_t id : want) {
      auto chunk = stream.Add(id);
      ASSERT_TRUE(chunk.ok()) << where;
      EXPECT_EQ(utf8::Lossy(*chunk), *chunk) << where << ": partial character";
      streamed += *chunk;
    }
    streamed += stream.Flush();
    EXPECT_EQ(streamed, *decoded) << where;
  }
}

TEST(TokenizerGoldenTest, CasesV3) {
  auto tok = LoadTokenizer(false);
  ASSERT_NE(tok, nullptr);
  size_t lines = 0;
  CheckFile(*tok, "cases.jsonl", &lines);
  EXPECT_EQ(lines, 207u);
}

TEST(TokenizerGoldenTest, CasesV4) {
  auto tok = LoadTokenizer(true);
  ASSERT_NE(tok, nullptr);
  size_t lines = 0;
  CheckFile(*tok, "cases_v4.jsonl", &lines);
  EXPECT_EQ(lines, 238u);
}

TEST(TokenizerGoldenTest, PublishedVectors) {
  auto v3 = LoadTokenizer(false);
  auto v4 = LoadTokenizer(true);
  ASSERT_NE(v3, nullptr);
  ASSERT_NE(v4, nullptr);
  const std::string hello = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ";
  const std::vector<int32_t> hello_ids = {19923, 3,    223,   5464, 5008, 1175,  19,    940, 223,
                                          19,    438,  223,   20,   6113, 257,   76589, 131, 100,
                                          76032, 1628, 76589, 131,  108,  76589, 131,   98};
  EXPECT_EQ(*v3->Encode(hello), hello_ids);
  EXPECT_EQ(*v4->Encode(hello), hello_ids);
  EXPECT_EQ(*v3->Decode(hello_ids), hello);

  const std::string chat =
      "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
  const std::vector<int32_t> chat_ids = {128803, 30594, 128804, 128821, 36101, 128822, 7624, 1};
  EXPECT_EQ(*v4->Encode(chat), chat_ids);
  EXPECT_EQ(*v4->Decode(chat_ids), chat);
  // Plain V3 splits <think> into <, think, >.
  const std::vector<int32_t> v3_ids = *v3->Encode(chat);
  EXPECT_EQ(v3_ids.size(), 12u);
  EXPECT_EQ(*v3->Decode(v3_ids), chat);
}

}  // namespace
}  // namespace ss
