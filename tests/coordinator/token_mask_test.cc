// Token masks on the real DeepSeek-V4 vocabulary (129,280 ids with the V4 added tokens), checked
// against the brute-force reference (a copy of the matcher tries AcceptToken for each id) at the
// states of a JSON-schema grammar that a document goes through token by token; token terminals
// (<｜DSML｜>) and the stop token.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "coordinator/grammar/compiled_grammar.h"
#include "coordinator/grammar/grammar_matcher.h"
#include "coordinator/grammar/token_vocab.h"
#include "coordinator/tokenizer.h"
#include "gtest/gtest.h"

namespace ss::grammar {
namespace {

struct V4 {
  std::unique_ptr<Tokenizer> tok;
  std::shared_ptr<const TokenVocab> vocab;
  int32_t eos = -1;
};

const V4& Get() {
  static const V4* v4 = [] {
    auto* r = new V4;
    auto t = Tokenizer::Load(SS_TOKENIZER_JSON);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) std::abort();
    auto added = ReadAddedTokensFile(SS_TOKENIZER_DATA "/v4_added_tokens.json");
    EXPECT_TRUE(added.ok()) << added.status();
    EXPECT_TRUE((*t)->AddSpecialTokens(*added).ok());
    r->tok = std::move(*t);
    r->eos = r->tok->TokenId("<｜end▁of▁sentence｜>").value_or(-1);
    r->vocab =
        std::make_shared<const TokenVocab>(TokenVocab::FromTokenizer(*r->tok, {r->eos}, 129280));
    return r;
  }();
  return *v4;
}

// What llama.cpp's json-schema-to-grammar writes for an object with string, integer, enum and
// array-of-string fields and an optional one.
constexpr char kSchemaGbnf[] =
    R"(root ::= "{" space name-kv "," space age-kv "," space role-kv "," space tags-kv ( "," space email-kv )? "}" space
name-kv ::= "\"name\"" space ":" space string
age-kv ::= "\"age\"" space ":" space integer
role-kv ::= "\"role\"" space ":" space role
role ::= ("\"admin\"" | "\"user\"" | "\"guest\"") space
tags-kv ::= "\"tags\"" space ":" space tags
tags ::= "[" space ( string ( "," space string )* )? "]" space
email-kv ::= "\"email\"" space ":" space string
string ::= "\"" char* "\"" space
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
integer ::= ("-"? integral-part) space
integral-part ::= [0] | [1-9] [0-9]{0,15}
space ::= | " " | "\n" [ \t]{0,20}
)";

std::vector<uint32_t> Mask(const GrammarMatcher& m, int32_t n) {
  std::vector<uint32_t> mask((n + 31) / 32, 0xffffffffu);
  m.FillNextTokenBitmask(mask);
  return mask;
}
bool Allowed(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[id / 32] >> (id % 32)) & 1;
}

// Compares the mask with AcceptToken on copies, over all ids or over `sample` random ids plus
// every id the mask allows.
void CheckMask(const GrammarMatcher& m, int32_t n, int sample, std::mt19937& rng) {
  std::vector<uint32_t> mask = Mask(m, n);
  std::vector<int32_t> ids;
  if (sample == 0) {
    for (int32_t id = 0; id < n; ++id) ids.push_back(id);
  } else {
    for (int i = 0; i < sample; ++i) ids.push_back(static_cast<int32_t>(rng() % n));
    for (int32_t id = 0; id < n; ++id) {
      if (Allowed(mask, id)) ids.push_back(id);
    }
  }
  int wrong = 0;
  for (int32_t id : ids) {
    GrammarMatcher c = m;
    const bool ref = c.AcceptToken(id);
    if (ref != Allowed(mask, id) && ++wrong <= 5) {
      ADD_FAILURE() << "id " << id << " '" << Get().vocab->bytes[id] << "': mask "
                    << Allowed(mask, id) << ", AcceptToken " << ref;
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(TokenMaskTest, JsonSchemaDocumentMatchesBruteForce) {
  const V4& v = Get();
  ASSERT_EQ(v.vocab->size(), 129280);
  ASSERT_GE(v.eos, 0);
  auto g = CompileGrammar(kSchemaGbnf, v.vocab);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string doc =
      "{\"name\": \"Zoë Smith-Jones \\\"Z\\\"\", \"age\": 42, \"role\": \"admin\", \"tags\": "
      "[\"a b\", \"日本語のテキスト\", \"x\\u00e9\"],\n  \"email\": \"zoe@example.com\"}";
  auto ids = v.tok->Encode(doc);
  ASSERT_TRUE(ids.ok()) << ids.status();
  GrammarMatcher m(*g);
  std::mt19937 rng(1);
  const int32_t n = v.vocab->size();
  for (size_t i = 0; i < ids->size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    // Full vocabulary at a few states (start, inside a string, after a key, in the array, at the
    // end); a sample plus every allowed id elsewhere.
    CheckMask(m, n, (i == 0 || i == 3 || i % 9 == 5) ? 0 : 3000, rng);
    std::vector<uint32_t> mask = Mask(m, n);
    ASSERT_TRUE(Allowed(mask, (*ids)[i])) << "token " << v.vocab->bytes[(*ids)[i]];
    ASSERT_FALSE(Allowed(mask, v.eos));
    ASSERT_TRUE(m.AcceptToken((*ids)[i]));
  }
  EXPECT_TRUE(m.CanTerminate());
  CheckMask(m, n, 0, rng);
  std::vector<uint32_t> mask = Mask(m, n);
  EXPECT_TRUE(Allowed(mask, v.eos));
  EXPECT_FALSE(Allowed(mask, 128825));
  ASSERT_TRUE(m.AcceptToken(v.eos));
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_EQ(Mask(m, n), std::vector<uint32_t>((n + 31) / 32, 0u));
}

TEST(TokenMaskTest, TokenTerminalAndStop) {
  const V4& v = Get();
  const int32_t n = v.vocab->size();
  auto g = CompileGrammar(R"(root ::= "call:" <｜DSML｜> [a-z]+ ("!" <[128825]>)?)", v.vocab);
  ASSERT_TRUE(g.ok()) << g.status();
  GrammarMatcher m(*g);
  ASSERT_TRUE(m.AcceptString("call:"));
  std::vector<uint32_t> mask = Mask(m, n);
  int allowed = 0;
  for (int32_t id = 0; id < n; ++id) allowed += Allowed(mask, id);
  EXPECT_EQ(allowed, 1);
  EXPECT_TRUE(Allowed(mask, 128825));
  std::mt19937 rng(2);
  CheckMask(m, n, 0, rng);
  // The same text as ordinary text (the tokenizer's plain-text ranges).
  const std::string dsml = "<｜DSML｜>";
  const std::vector<std::pair<size_t, size_t>> plain = {{0, dsml.size()}};
  auto dsml_text = v.tok->Encode(dsml, plain);
  ASSERT_TRUE(dsml_text.ok());
  EXPECT_FALSE(GrammarMatcher(m).AcceptToken((*dsml_text)[0]));
  ASSERT_TRUE(m.AcceptToken(128825));
  EXPECT_FALSE(m.CanTerminate());
  EXPECT_FALSE(Allowed(Mask(m, n), v.eos));
  ASSERT_TRUE(m.AcceptString("abc"));
  EXPECT_TRUE(m.CanTerminate());
  CheckMask(m, n, 0, rng);
  mask = Mask(m, n);
  EXPECT_TRUE(Allowed(mask, v.eos));
  EXPECT_FALSE(Allowed(mask, 128825));
  EXPECT_TRUE(Allowed(mask, v.tok->TokenId("xyz").value()));
  ASSERT_TRUE(m.AcceptToken(v.eos));
  EXPECT_FALSE(m.AcceptToken(v.eos));
}

TEST(TokenMaskTest, CacheReturnsTheSameCompiledGrammar) {
  const V4& v = Get();
  GrammarCache cache(v.vocab, 2);
  auto a = cache.Get(R"(root ::= "a"+)");
  auto b = cache.Get(R"(root ::= "b"+)");
  auto a2 = cache.Get(R"(root ::= "a"+)");
  ASSERT_TRUE(a.ok() && b.ok() && a2.ok());
  EXPECT_EQ(a->get(), a2->get());
  auto c = cache.Get(R"(root ::= "c"+)");  // evicts "b" (least recently used)
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(cache.size(), 2u);
  auto b2 = cache.Get(R"(root ::= "b"+)");
  ASSERT_TRUE(b2.ok());
  EXPECT_NE(b->get(), b2->get());
  EXPECT_FALSE(cache.Get("root ::= nope").ok());
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace ss::grammar
