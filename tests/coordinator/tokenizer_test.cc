// Tokenizer behaviour beyond the golden files: streaming decode, errors, limits, threads, and the
// loader's handling of every supported (and unsupported) tokenizer.json feature, on a small
// synthetic file as well as the real DeepSeek one.
#include "coordinator/tokenizer.h"

#include <chrono>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace ss {
namespace {

using nlohmann::json;
using testing_util::TempDir;

const Tokenizer& V3() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::Load(SS_TOKENIZER_JSON);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->release() : nullptr;
  }();
  if (tok == nullptr) std::abort();
  return *tok;
}

std::unique_ptr<Tokenizer> V4() {
  auto t = Tokenizer::Load(SS_TOKENIZER_JSON);
  EXPECT_TRUE(t.ok()) << t.status();
  auto added = ReadAddedTokensFile(SS_TOKENIZER_DATA "/v4_added_tokens.json");
  EXPECT_TRUE(added.ok()) << added.status();
  EXPECT_TRUE((*t)->AddSpecialTokens(*added).ok());
  return std::move(*t);
}

std::vector<int32_t> Enc(const Tokenizer& t, std::string_view s) {
  auto ids = t.Encode(s);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

bool IsValidUtf8(const std::string& s) { return utf8::Lossy(s) == s; }

// Streams `ids` one at a time; checks every chunk is whole UTF-8 and returns the concatenation.
std::string Stream(const Tokenizer& t, const std::vector<int32_t>& ids) {
  StreamDecoder d(t);
  std::string all;
  for (int32_t id : ids) {
    auto chunk = d.Add(id);
    EXPECT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk.ok()) continue;
    EXPECT_TRUE(IsValidUtf8(*chunk)) << "partial character emitted after id " << id;
    EXPECT_LE(d.pending_bytes(), 3u);
    all += *chunk;
  }
  return all + d.Flush();
}

TEST(TokenizerTest, Basics) {
  const Tokenizer& t = V3();
  EXPECT_EQ(Enc(t, "Hello world"), (std::vector<int32_t>{19923, 2058}));
  EXPECT_EQ(Enc(t, ""), std::vector<int32_t>{});
  EXPECT_EQ(t.vocab_size(), 128815);
  EXPECT_EQ(t.TokenId("Ġworld"), 2058);
  EXPECT_EQ(t.TokenId("<｜User｜>"), 128803);
  EXPECT_EQ(t.TokenId("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_EQ(t.TokenId(" world"), std::nullopt);
  EXPECT_EQ(t.TokenBytes(2058), " world");
  EXPECT_EQ(t.TokenBytes(128815), std::nullopt);
  EXPECT_TRUE(t.IsAddedToken(1));
  EXPECT_TRUE(t.IsAddedToken(128803));
  EXPECT_FALSE(t.IsAddedToken(2058));
  auto pieces = t.PreTokenize("Hello world 123456<｜User｜>中文x");
  ASSERT_TRUE(pieces.ok());
  EXPECT_EQ(*pieces, (std::vector<std::string_view>{"Hello", " world", " ", "123", "456",
                                                    "<｜User｜>", "中文", "x"}));
}

TEST(TokenizerTest, StreamingNeverSplitsACharacter) {
  const Tokenizer& t = V3();
  // 😀 is two ids: F0 9F 98 and 80.
  const std::vector<int32_t> ids = Enc(t, "😀");
  ASSERT_EQ(ids, (std::vector<int32_t>{28927, 225}));
  StreamDecoder d(t);
  auto first = d.Add(ids[0]);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, "");
  EXPECT_EQ(d.pending_bytes(), 3u);
  auto second = d.Add(ids[1]);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, "😀");
  EXPECT_EQ(d.Flush(), "");

  const std::string text = "a😀b🎉 c 👨‍👩‍👧 中文 𝔘𝔫𝔦 ok";
  EXPECT_EQ(Stream(t, Enc(t, text)), text);
}

TEST(TokenizerTest, StreamingMatchesLossyDecode) {
  const Tokenizer& t = V3();
  // Half an emoji, then a lone continuation byte, then text; and half an emoji at the end.
  for (const std::vector<int32_t>& ids :
       {std::vector<int32_t>{28927}, std::vector<int32_t>{28927, 19923},
        std::vector<int32_t>{225, 225, 2058}, std::vector<int32_t>{2058, 28927, 128803, 225}}) {
    auto whole = t.Decode(ids);
    ASSERT_TRUE(whole.ok());
    EXPECT_EQ(Stream(t, ids), *whole);
    EXPECT_TRUE(IsValidUtf8(*whole));
  }
  EXPECT_EQ(*t.Decode(std::vector<int32_t>{28927}), "\xEF\xBF\xBD");
  StreamDecoder d(t);
  EXPECT_FALSE(d.Add(-1).ok());
  EXPECT_FALSE(d.Add(t.vocab_size()).ok());
}

TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8::Lossy("a\x80z"), "a" + r + "z");
  EXPECT_EQ(utf8::Lossy("\xE2\x82z"), r + "z");               // truncated 3-byte
  EXPECT_EQ(utf8::Lossy("\xED\xA0\x80"), r + r + r);          // surrogate
  EXPECT_EQ(utf8::Lossy("\xF0\x9F\x98"), r);                  // cut at the end
  EXPECT_EQ(utf8::Lossy("\xC0\xAF"), r + r);                  // overlong
  EXPECT_EQ(utf8::Lossy("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(utf8::Lossy("ok 中 😀"), "ok 中 😀");
  EXPECT_EQ(utf8::FirstInvalid("ok 中 😀"), std::string_view::npos);
  EXPECT_EQ(utf8::FirstInvalid("ok\xF0\x9F"), 2u);
}

TEST(Utf8Test, CompletePrefixMakesStreamingExact) {
  EXPECT_EQ(utf8::CompletePrefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8::CompletePrefix("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(utf8::CompletePrefix("ab\x80\x80\x80"), 5u);
  EXPECT_EQ(utf8::CompletePrefix("ab\xE2\x28"), 4u);  // invalid, not truncated
  // Random byte soup cut at random points: the prefix rule reproduces whole-string Lossy.
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {"a",    "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
                                          "\x80", "\xF0",     "\xE2\x82",     "\xED\xA0",
                                          "\xFF", " "};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string all;
    for (int k = 0; k < 12; ++k) all += atoms[rng() % atoms.size()];
    std::string pending, streamed;
    for (size_t i = 0; i < all.size();) {
      const size_t step = 1 + rng() % 4;
      pending += all.substr(i, step);
      i += step;
      const size_t n = utf8::CompletePrefix(pending);
      streamed += utf8::Lossy(pending.substr(0, n));
      pending.erase(0, n);
      ASSERT_LE(pending.size(), 3u);
    }
    streamed += utf8::Lossy(pending);
    ASSERT_EQ(streamed, utf8::Lossy(all)) << trial;
  }
}

TEST(TokenizerTest, StreamDecoderEqualsDecodeOnRandomIds) {
  const Tokenizer& t = V3();
  // Ids whose bytes are not whole characters (byte-level pieces of multi-byte characters).
  std::vector<int32_t> partial;
  for (int32_t id = 0; id < 128000; ++id) {
    if (utf8::FirstInvalid(*t.TokenBytes(id)) != std::string_view::npos) partial.push_back(id);
  }
  ASSERT_GT(partial.size(), 100u);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> ids;
    for (int k = 0, n = 1 + rng() % 8; k < n; ++k) {
      ids.push_back(rng() % 3 ? partial[rng() % partial.size()] : int32_t(rng() % 128815));
    }
    auto whole = t.Decode(ids);
    ASSERT_TRUE(whole.ok());
    ASSERT_EQ(Stream(t, ids), *whole) << trial;
  }
}

TEST(TokenizerTest, DecodeRejectsUnknownIds) {
  const Tokenizer& t = V3();
  for (int32_t bad : {-1, t.vocab_size(), 1 << 30}) {
    auto s = t.Decode(std::vector<int32_t>{19923, bad});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(std::to_string(bad)), absl::string_view::npos);
    EXPECT_NE(s.status().message().find("position 1"), absl::string_view::npos);
  }
  // With the V4 table added, ids between the V4 specials are unused.
  auto v4 = V4();
  EXPECT_TRUE(v4->Decode(std::vector<int32_t>{128821}).ok());
  EXPECT_FALSE(v4->Decode(std::vector<int32_t>{128815}).ok());
  EXPECT_EQ(v4->vocab_size(), 128846);
}

TEST(TokenizerTest, InvalidUtf8InputIsAnError) {
  const Tokenizer& t = V3();
  for (std::string_view bad : {std::string_view("ok\xFFno"), std::string_view("ab\xE2\x82"),
                               std::string_view("\xED\xA0\x80"), std::string_view("x\xC0\x80")}) {
    auto ids = t.Encode(bad);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("UTF-8"), absl::string_view::npos);
  }
  auto ids = t.Encode("ok\xFFno");
  EXPECT_NE(ids.status().message().find("offset 2"), absl::string_view::npos);
  EXPECT_EQ(Enc(t, std::string("a\0b", 3)), Enc(t, std::string("a\0b", 3)));  // NUL is valid
}

TEST(TokenizerTest, LongRunsStayFastAndExact) {
  const Tokenizer& t = V3();
  for (std::string unit : {"a", "ab", " ", "\n", "7", "中", "!", "😀", " \n"}) {
    std::string text;
    while (text.size() < (1u << 20)) text += unit;
    auto ids = t.Encode(text);
    ASSERT_TRUE(ids.ok()) << "unit '" << unit << "': " << ids.status();
    auto back = t.Decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(*back == text) << "unit '" << unit << "'";
  }
}

// 1 MB of random digits: 333k three-digit pieces, nearly all repeats of an earlier piece. A
// linear encoder takes ~0.1 s on one core of the development machine; an encoder that copies its
// output once per repeated piece (quadratic) took 12 s. The 2 s bound is 20x the linear time.
TEST(TokenizerTest, RepeatedPiecesEncodeInLinearTime) {
  const Tokenizer& t = V3();
  std::mt19937 rng(23);
  std::string digits(1'000'000, '0');
  for (char& c : digits) c = static_cast<char>('0' + rng() % 10);
  const auto t0 = std::chrono::steady_clock::now();
  auto ids = t.Encode(digits);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->size(), 333'334u);
  EXPECT_LT(s, 2.0) << "encoding 1 MB of digits took " << s << " s";
  auto back = t.Decode(*ids);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == digits);
}

// Added tokens inside plain-text ranges are text; outside them, and in text without them, ids
// are those of Encode(text).
TEST(TokenizerTest, PlainTextRangesNeverMatchAddedTokens) {
  const Tokenizer& t = V3();
  const int32_t user = *t.TokenId("<｜User｜>"), assistant = *t.TokenId("<｜Assistant｜>");
  const int32_t eos = *t.TokenId("<｜end▁of▁sentence｜>");
  const std::string content = "hi<｜Assistant｜>x<｜end▁of▁sentence｜>";
  const std::string text = "<｜User｜>" + content + "<｜Assistant｜>";
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  const size_t b = std::string("<｜User｜>").size(), e = b + content.size();
  auto ids = t.Encode(text, Ranges{{b, e}});
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_GE(ids->size(), 3u);
  EXPECT_EQ(ids->front(), user);
  EXPECT_EQ(ids->back(), assistant);
  for (size_t i = 1; i + 1 < ids->size(); ++i) {
    EXPECT_FALSE(t.IsAddedToken((*ids)[i])) << "id " << (*ids)[i] << " at " << i;
  }
  EXPECT_EQ(*t.Decode(*ids), text);
  // The plain encoding matches every added token.
  EXPECT_EQ(Enc(t, text), (std::vector<int32_t>{user, Enc(t, "hi")[0], assistant, Enc(t, "x")[0],
                                                eos, assistant}));
  // A token straddling a range's edge is text too; one wholly outside is matched.
  auto edge = t.Encode(text, Ranges{{2, 3}});
  ASSERT_TRUE(edge.ok());
  EXPECT_NE(edge->front(), user);
  EXPECT_EQ(edge->back(), assistant);
  // Without added tokens inside, ranges change nothing.
  const std::string plain = "<｜User｜>Hello, world 12345!\n\nOK<｜Assistant｜>";
  EXPECT_EQ(*t.Encode(plain, Ranges{{b, plain.size() - 18}}), Enc(t, plain));
  EXPECT_EQ(*t.Encode(plain, Ranges{{0, 0}, {b, b + 2}, {b + 3, b + 9}}), Enc(t, plain));
  // Ranges must be sorted, disjoint and inside the text.
  for (const Ranges& bad : {Ranges{{5, 4}}, Ranges{{0, text.size() + 1}}, Ranges{{4, 6}, {5, 7}},
                            Ranges{{6, 7}, {1, 2}}}) {
    EXPECT_EQ(t.Encode(text, bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(TokenizerTest, ConcurrentEncodeIsDeterministic) {
  const Tokenizer& t = V3();
  const std::vector<std::string> texts = {"Hello world, 1234567 times.", "中文 and 日本語テキスト",
                                          "<｜User｜>hi<｜Assistant｜>", "  spaces\n\n\ttabs  "};
  std::vector<std::vector<int32_t>> want;
  for (const auto& s : texts) want.push_back(Enc(t, s));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 500; ++i) {
        const size_t j = (i + k) % texts.size();
        auto ids = t.Encode(texts[j]);
        if (!ids.ok() || *ids != want[j]) ++mismatches[k];
        auto s = t.Decode(want[j]);
        if (!s.ok() || *s != texts[j]) ++mismatches[k];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(TokenizerTest, AddSpecialTokens) {
  auto t = Tokenizer::Load(SS_TOKENIZER_JSON);
  ASSERT_TRUE(t.ok());
  Tokenizer& tok = **t;
  EXPECT_EQ(Enc(tok, "<think>"), (std::vector<int32_t>{30, 37947, 32}));
  // Conflicts fail and change nothing.
  EXPECT_FALSE(
      tok.AddSpecialTokens(std::vector<AddedToken>{{"<think>", 128821}, {"<｜User｜>", 5}}).ok());
  EXPECT_FALSE(tok.AddSpecialTokens(std::vector<AddedToken>{{"<new>", 2058}}).ok());
  EXPECT_FALSE(
      tok.AddSpecialTokens(std::vector<AddedToken>{{"<a>", 130000}, {"<a>", 130001}}).ok());
  EXPECT_FALSE(tok.AddSpecialTokens(std::vector<AddedToken>{{"", 130000}}).ok());
  EXPECT_FALSE(tok.AddSpecialTokens(std::vector<AddedToken>{{"<b>", -3}}).ok());
  EXPECT_EQ(tok.TokenId("<think>"), std::nullopt);
  EXPECT_EQ(tok.vocab_size(), 128815);
  // The same (content, id) twice is fine.
  ASSERT_TRUE(
      tok.AddSpecialTokens(std::vector<AddedToken>{
                               {"<｜User｜>", 128803}, {"<think>", 128821}, {"<think>", 128821}})
          .ok());
  EXPECT_EQ(Enc(tok, "a<think>b"), (std::vector<int32_t>{67, 128821, 68}));
  EXPECT_TRUE(tok.IsAddedToken(128821));
}

TEST(TokenizerTest, ReadAddedTokensFile) {
  auto v4 = ReadAddedTokensFile(SS_TOKENIZER_DATA "/v4_added_tokens.json");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->size(), 14u);  // 4 already in V3 + 10 with status "v4"
  bool think = false, uncertain = false;
  for (const AddedToken& a : *v4) {
    think |= a.content == "<think>" && a.id == 128821;
    uncertain |= a.content == "<｜extracted_url｜>" || a.content == "<｜image｜>";
  }
  EXPECT_TRUE(think);
  EXPECT_FALSE(uncertain);

  TempDir dir("ss_tok");
  std::ofstream(dir / "list.json") << R"([{"content": "<x>", "id": 7}])";
  auto list = ReadAddedTokensFile(dir / "list.json");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].id, 7);
  for (const char* bad : {R"([{"content": "<x>"}])", R"([{"content": 3, "id": 1}])",
                          R"([{"content": "<x>", "id": -1}])", R"({"x": 1})", "[1", "[1]"}) {
    std::ofstream(dir / "bad.json", std::ios::trunc) << bad;
    auto r = ReadAddedTokensFile(dir / "bad.json");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("bad.json"), absl::string_view::npos);
    }
  }
  EXPECT_EQ(ReadAddedTokensFile(dir / "missing.json").status().code(), absl::StatusCode::kNotFound);
}

// ---- A small synthetic tokenizer.json, to test loader features the real file does not use.

std::string ByteChar(int b) {
  int cp = b, next = 256;
  for (int x = 0; x <= b; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    if (x == b) cp = printable ? b : next;
    if (!printable) ++next;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

json Mini() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["Ġa"] = 258;
  vocab["bc"] = 259;
  return json{
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"added_tokens", json::array({json{{"id", 300}, {"content", "<s>"}, {"normalized", false}},
                                    json{{"id", 301}, {"content", "<s>x"}, {"normalized", true}}})},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {json{{"type", "Split"},
                   {"pattern", {{"Regex", " ?[a-z]+|\\d"}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
              json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"vocab", vocab},
        {"merges", json::array({"a b", json::array({"ab", "c"}), "Ġ a", "b c"})}}}};
}

absl::StatusOr<std::unique_ptr<Tokenizer>> FromMini(const json& j) {
  return Tokenizer::FromJson(j.dump(), "mini.json");
}

std::vector<int32_t> EncMini(const json& j, std::string_view s) {
  auto t = FromMini(j);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? Enc(**t, s) : std::vector<int32_t>{};
}

TEST(TokenizerMiniTest, MergesAddedTokensAndSplits) {
  const json j = Mini();
  // "abc": a+b (rank 0) first, then ab+c (rank 1); never b+c.
  EXPECT_EQ(EncMini(j, "abc"), (std::vector<int32_t>{257}));
  // " abc": Ġ+a (rank 2) loses to a+b (rank 0), then ab+c.
  EXPECT_EQ(EncMini(j, " abc"), (std::vector<int32_t>{32, 257}));
  EXPECT_EQ(EncMini(j, "bc1"), (std::vector<int32_t>{259, '1'}));
  // The raw pass runs first: "<s>" wins over the longer normalized "<s>x".
  EXPECT_EQ(EncMini(j, "<s>x"), (std::vector<int32_t>{300, 'x'}));
  EXPECT_EQ(EncMini(j, "<<s>"), (std::vector<int32_t>{'<', 300}));
}

TEST(TokenizerMiniTest, LeftmostLongestAddedToken) {
  json j = Mini();
  j["added_tokens"] = json::array({json{{"id", 300}, {"content", "<s>"}, {"normalized", false}},
                                   json{{"id", 301}, {"content", "<s>x"}, {"normalized", false}},
                                   json{{"id", 302}, {"content", "s>xy"}, {"normalized", false}}});
  EXPECT_EQ(EncMini(j, "<s>xy"), (std::vector<int32_t>{301, 'y'}));
  EXPECT_EQ(EncMini(j, "<s>"), (std::vector<int32_t>{300}));
}

TEST(TokenizerMiniTest, StringPatternRemovedAndInvert) {
  json j = Mini();
  auto& split = j["pre_tokenizer"]["pretokenizers"][0];
  split["pattern"] = {{"String", "-"}};
  split["behavior"] = "Removed";
  auto t = FromMini(j);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->PreTokenize("ab-c--d"), (std::vector<std::string_view>{"ab", "c", "d"}));
  split["invert"] = true;  // now the matches are kept
  t = FromMini(j);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->PreTokenize("ab-c--d"), (std::vector<std::string_view>{"-", "-", "-"}));
  split["behavior"] = "Isolated";  // invert does not matter to Isolated
  t = FromMini(j);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*(*t)->PreTokenize("ab-c"), (std::vector<std::string_view>{"ab", "-", "c"}));
}

TEST(TokenizerMiniTest, IgnoreMerges) {
  json j = Mini();
  j["model"]["merges"] = json::array({"a b"});
  EXPECT_EQ(EncMini(j, "abc"), (std::vector<int32_t>{256, 'c'}));
  j["model"]["ignore_merges"] = true;  // "abc" is in the vocab, so it is taken whole
  EXPECT_EQ(EncMini(j, "abc"), (std::vector<int32_t>{257}));
}

// Every malformed or unsupported file is an error naming the file and the field.
TEST(TokenizerMiniTest, LoadErrors) {
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"no model", [](json& j) { j.erase("model"); }, "model"},
      {"unigram", [](json& j) { j["model"]["type"] = "Unigram"; }, "Unigram"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "dropout"},
      {"byte_fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback"},
      {"vocab id string", [](json& j) { j["model"]["vocab"]["ab"] = "x"; }, "vocab 'ab'"},
      {"vocab id huge", [](json& j) { j["model"]["vocab"]["ab"] = 1ll << 40; }, "vocab 'ab'"},
      {"duplicate id", [](json& j) { j["model"]["vocab"]["ab"] = 5; }, "already used"},
      {"missing byte", [](json& j) { j["model"]["vocab"].erase("Ā"); }, "byte 0"},
      {"merge unknown", [](json& j) { j["model"]["merges"].push_back("x q"); }, "merge 4"},
      {"merge shape", [](json& j) { j["model"]["merges"].push_back("abc"); }, "merge 4"},
      {"merge array", [](json& j) { j["model"]["merges"].push_back(json::array({"a"})); },
       "merge 4"},
      {"merge number", [](json& j) { j["model"]["merges"].push_back(7); }, "merge 4"},
      {"normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "NFC"}};
       },
       "normalizer"},
      {"decoder",
       [](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder"},
      {"metaspace",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}};
       },
       "Metaspace"},
      {"whitespace pre_tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "Whitespace"},
      {"no pre_tokenizer", [](json& j) { j.erase("pre_tokenizer"); }, "pre_tokenizer"},
      {"bytelevel not last",
       [](json& j) {
         auto& p = j["pre_tokenizer"]["pretokenizers"];
         std::swap(p[0], p[1]);
       },
       "ByteLevel"},
      {"no bytelevel", [](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); }, "ByteLevel"},
      {"prefix space",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "add_prefix_space"},
      {"use_regex default",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][1].erase("use_regex"); }, "use_regex"},
      {"behavior",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious"; },
       "MergedWithPrevious"},
      {"bad regex",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(a"}};
       },
       "(a"},
      {"pattern type", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = "x"; },
       "pattern"},
      {"added lstrip", [](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip"},
      {"added no id", [](json& j) { j["added_tokens"][0].erase("id"); }, "added_tokens[0]"},
      {"added twice", [](json& j) { j["added_tokens"][1]["content"] = "<s>"; }, "twice"},
      {"added id clash", [](json& j) { j["added_tokens"][0]["id"] = 97; }, "already used"},
      {"added empty", [](json& j) { j["added_tokens"][0]["content"] = ""; }, "empty"},
  };
  for (const Case& c : cases) {
    json j = Mini();
    c.edit(j);
    auto t = FromMini(j);
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(t.status().message().find("mini.json"), absl::string_view::npos) << c.name;
    EXPECT_NE(t.status().message().find(c.needle), absl::string_view::npos)
        << c.name << ": " << t.status();
  }
  for (const char* text : {"", "{", "[1, 2]", "{\"model\": 1}", "null"}) {
    EXPECT_FALSE(Tokenizer::FromJson(text, "mini.json").ok()) << text;
  }
}

TEST(TokenizerMiniTest, FileErrors) {
  auto missing = Tokenizer::Load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/tokenizer.json"),
            absl::string_view::npos);

  TempDir dir("ss_tok");
  std::string text = Mini().dump();
  std::ofstream(dir / "cut.json") << text.substr(0, text.size() / 2);
  auto cut = Tokenizer::Load(dir / "cut.json");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("cut.json"), absl::string_view::npos);
  EXPECT_NE(cut.status().message().find("JSON"), absl::string_view::npos);
}

}  // namespace
}  // namespace ss
