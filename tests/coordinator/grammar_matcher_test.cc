// The grammar matcher on strings and on a small synthetic vocabulary: JSON-like grammars,
// classes, repetition bounds, UTF-8 (multi-byte classes, tokens ending inside a character),
// token terminals, stop tokens, limits; and masks against a brute-force reference.
#include "coordinator/grammar/grammar_matcher.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/grammar/compiled_grammar.h"
#include "gtest/gtest.h"

namespace ss::grammar {
namespace {

constexpr int32_t kDsml = 256;
constexpr int32_t kEos = 257;
constexpr int32_t kUnused = 258;

// Ids 0..255: single bytes; 256 <｜DSML｜> (added); 257 <eos> (added, stop); 258 unused; then
// multi-byte tokens.
std::shared_ptr<const TokenVocab> SmallVocab() {
  auto v = std::make_shared<TokenVocab>();
  for (int b = 0; b < 256; ++b) {
    v->bytes.emplace_back(1, static_cast<char>(b));
    v->kind.push_back(TokenVocab::Kind::kNormal);
  }
  v->bytes.push_back("<｜DSML｜>");
  v->kind.push_back(TokenVocab::Kind::kAdded);
  v->bytes.push_back("<eos>");
  v->kind.push_back(TokenVocab::Kind::kAdded);
  v->bytes.push_back("");
  v->kind.push_back(TokenVocab::Kind::kUnused);
  for (const char* t : {"{\"", "\":", "\",", "\"}", "ab", "abc", "12", "1,", "\xC3", "\xA9x", "é",
                        "\xC3\xA9\xE2", "\x82\xAC", "true", "null", "]}", ", ", "<eos>x"}) {
    v->bytes.emplace_back(t);
    v->kind.push_back(TokenVocab::Kind::kNormal);
  }
  v->stop_ids = {kEos};
  return v;
}

std::shared_ptr<const CompiledGrammar> Compile(std::string_view gbnf) {
  auto g = CompileGrammar(gbnf, SmallVocab());
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) std::abort();
  return *g;
}

// Whether `s` is a complete sentence of the grammar.
bool Matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view s) {
  GrammarMatcher m(g);
  return m.AcceptString(s) && m.CanTerminate();
}
bool IsPrefix(const std::shared_ptr<const CompiledGrammar>& g, std::string_view s) {
  GrammarMatcher m(g);
  return m.AcceptString(s);
}

constexpr char kJson[] = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

TEST(GrammarMatcherTest, JsonStrings) {
  auto g = Compile(kJson);
  EXPECT_TRUE(Matches(g, R"({"a":1,"b":[true,null,"x\n\u00e9y"],"c":{"d":-2.5e+10}})"));
  EXPECT_TRUE(Matches(g, "{ \"a\": [1, 2, {}], \"b\": \"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"}"));
  EXPECT_TRUE(Matches(g, "{}"));
  EXPECT_TRUE(Matches(g, "{\n  \"k\": []}"));
  EXPECT_FALSE(Matches(g, "{\"a\":1,}"));
  EXPECT_FALSE(Matches(g, "{\"a\":01}"));
  EXPECT_FALSE(Matches(g, "{\"a\":\"\x01\"}"));          // control character
  EXPECT_FALSE(Matches(g, "{\"a\":\"\\q\"}"));           // bad escape
  EXPECT_FALSE(Matches(g, "{\"a\":\"\xC3\"}"));          // truncated character
  EXPECT_FALSE(Matches(g, "{\"a\":\"\xED\xA0\x80\"}"));  // surrogate
  EXPECT_FALSE(Matches(g, "{\"a\":\"\xC0\xAF\"}"));      // overlong
  EXPECT_FALSE(Matches(g, "[1]"));
  EXPECT_FALSE(Matches(g, "{\"a\":1"));
  EXPECT_TRUE(IsPrefix(g, "{\"a\":1"));
  EXPECT_TRUE(IsPrefix(g, "{\"a\":[{\"b\":\"x"));
  EXPECT_FALSE(IsPrefix(g, "{\"a\":}"));
  EXPECT_FALSE(Matches(g, "{}  "));  // ws is one " " at most
  EXPECT_TRUE(Matches(g, "{}\n\t\t"));
  // 16-digit integers at most.
  EXPECT_TRUE(Matches(g, "{\"a\":1234567890123456}"));
  EXPECT_FALSE(Matches(g, "{\"a\":12345678901234567}"));
}

TEST(GrammarMatcherTest, ClassesAndRepetitionBounds) {
  auto g = Compile(R"(root ::= [a-c]{2,4} "-" [^a-z]? "." x{3} y*
x ::= [0-9]
y ::= "z")");
  EXPECT_TRUE(Matches(g, "ab-.123"));
  EXPECT_TRUE(Matches(g, "abca-A.123zzz"));
  EXPECT_FALSE(Matches(g, "a-.123"));              // fewer than 2
  EXPECT_FALSE(Matches(g, "abcab-.123"));          // more than 4
  EXPECT_FALSE(Matches(g, "ab-q.123"));            // negated class
  EXPECT_TRUE(Matches(g, "ab-\xE2\x82\xAC.123"));  // any non a-z code point
  EXPECT_FALSE(Matches(g, "ab-.12"));
  EXPECT_FALSE(Matches(g, "ab-.1234"));
  auto exact = Compile("root ::= \"ab\"{3}");
  EXPECT_TRUE(Matches(exact, "ababab"));
  EXPECT_FALSE(Matches(exact, "abab"));
  EXPECT_FALSE(IsPrefix(exact, "abababa"));
  auto zero = Compile("root ::= \"x\" \"y\"{0} \"z\"{0,}");
  EXPECT_TRUE(Matches(zero, "x"));
  EXPECT_TRUE(Matches(zero, "xzzz"));
  EXPECT_FALSE(IsPrefix(zero, "xy"));
}

TEST(GrammarMatcherTest, Utf8) {
  // Greek lower case, CJK, emoji, and `.` = any single code point.
  auto g = Compile(R"(root ::= [α-ω]+ "|" [一-龥] "|" [\U0001F600-\U0001F64F] "|" . .)");
  EXPECT_TRUE(Matches(g, "αβγ|中|😀|a€"));
  EXPECT_FALSE(Matches(g, "αβΓ|中|😀|ab"));     // capital gamma outside the class
  EXPECT_FALSE(Matches(g, "α|中|🙐|ab"));  // U+1F650 outside the class
  EXPECT_FALSE(Matches(g, "α|中|😀|abc"));
  EXPECT_FALSE(Matches(g, "α|中|😀|a\xC3"));  // a truncated code point is not one
  // A token ending inside a code point: the next token continues it.
  GrammarMatcher m(g);
  ASSERT_TRUE(m.AcceptString("\xCE"));  // first byte of α
  EXPECT_FALSE(m.CanTerminate());
  GrammarMatcher copy = m;
  EXPECT_FALSE(copy.AcceptString("a"));  // not a continuation byte
  EXPECT_TRUE(m.AcceptString("\xB1|\xE4\xB8"));
  EXPECT_TRUE(m.AcceptString("\xAD|\xF0\x9F\x99"));
  EXPECT_FALSE(GrammarMatcher(m).AcceptString("\x90"));  // U+1F650
  EXPECT_TRUE(m.AcceptString("\x8F|"));                  // U+1F64F
  EXPECT_TRUE(m.AcceptString("\xE2\x82"));
  EXPECT_FALSE(m.CanTerminate());
  EXPECT_TRUE(m.AcceptString("\xAC\xC3"));
  EXPECT_TRUE(m.AcceptString("\xA9"));
  EXPECT_TRUE(m.CanTerminate());
}

// Token ids of the small vocabulary by their bytes.
int32_t Id(std::string_view bytes) {
  static const auto v = SmallVocab();
  for (int32_t id = 0; id < v->size(); ++id) {
    if (v->kind[id] == TokenVocab::Kind::kNormal && v->bytes[id] == bytes) return id;
  }
  ADD_FAILURE() << "no token " << bytes;
  return -1;
}

// The reference: for each id, a copy of the matcher tries AcceptToken.
// `limited` (optional) gets the ids AcceptToken rejected because of the stack limits.
std::vector<uint32_t> BruteMask(const GrammarMatcher& m, int32_t vocab_size,
                                std::vector<uint32_t>* limited = nullptr) {
  std::vector<uint32_t> mask((vocab_size + 31) / 32, 0);
  if (limited != nullptr) limited->assign(mask.size(), 0);
  for (int32_t id = 0; id < vocab_size; ++id) {
    GrammarMatcher c = m;
    if (c.AcceptToken(id)) {
      mask[id / 32] |= 1u << (id % 32);
    } else if (limited != nullptr && c.last_rejection_hit_limit()) {
      (*limited)[id / 32] |= 1u << (id % 32);
    }
  }
  return mask;
}

std::vector<uint32_t> Mask(const GrammarMatcher& m, int32_t vocab_size) {
  std::vector<uint32_t> mask((vocab_size + 31) / 32, 0xdeadbeef);
  m.FillNextTokenBitmask(mask);
  return mask;
}

bool Allowed(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[id / 32] >> (id % 32)) & 1;
}

TEST(GrammarMatcherTest, TokensAndMasks) {
  auto g = Compile(kJson);
  const int32_t n = g->vocab().size();
  GrammarMatcher m(g);
  std::vector<uint32_t> mask = Mask(m, n);
  EXPECT_EQ(mask, BruteMask(m, n));
  EXPECT_TRUE(Allowed(mask, '{'));
  EXPECT_TRUE(Allowed(mask, Id("{\"")));
  EXPECT_FALSE(Allowed(mask, '['));
  EXPECT_FALSE(Allowed(mask, kEos));
  EXPECT_FALSE(Allowed(mask, kDsml));
  EXPECT_FALSE(Allowed(mask, kUnused));
  EXPECT_FALSE(m.AcceptToken('['));
  EXPECT_FALSE(m.AcceptToken(kUnused));
  EXPECT_FALSE(m.AcceptToken(-1));
  EXPECT_FALSE(m.AcceptToken(n));
  // Drive a document token by token, checking the mask at every step.
  for (std::string_view t : {"{\"", "ab", "\":", "1,", " ", "\"", "abc", "\":", "[", "true", ", ",
                             "null", "]}", "\xC3", "\xA9x"}) {
    SCOPED_TRACE(std::string(t));
    const int32_t id = Id(t);
    mask = Mask(m, n);
    ASSERT_EQ(mask, BruteMask(m, n));
    if (std::string_view(t) == "\xC3") {
      // After the document: only whitespace (one byte of it) and the stop token; é is no JSON.
      EXPECT_TRUE(Allowed(mask, kEos));
      EXPECT_FALSE(Allowed(mask, id));
      EXPECT_FALSE(m.AcceptToken(id));
      break;
    }
    ASSERT_TRUE(Allowed(mask, id));
    ASSERT_TRUE(m.AcceptToken(id));
  }
  EXPECT_TRUE(m.CanTerminate());
  EXPECT_TRUE(m.AcceptToken(kEos));
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_FALSE(m.CanTerminate());
  EXPECT_EQ(Mask(m, n), std::vector<uint32_t>((n + 31) / 32, 0));
  EXPECT_FALSE(m.AcceptToken(' '));
  EXPECT_FALSE(m.AcceptToken(kEos));
  EXPECT_FALSE(m.AcceptString(" "));
}

TEST(GrammarMatcherTest, TokenTerminalsAndStops) {
  auto g = Compile(R"(root ::= "x" <｜DSML｜> "y"? | "é" <[256]> "é")");
  const int32_t n = g->vocab().size();
  GrammarMatcher m(g);
  EXPECT_FALSE(m.AcceptToken(kDsml));
  ASSERT_TRUE(m.AcceptToken('x'));
  std::vector<uint32_t> mask = Mask(m, n);
  EXPECT_EQ(mask, BruteMask(m, n));
  EXPECT_TRUE(Allowed(mask, kDsml));
  EXPECT_FALSE(Allowed(mask, '<'));  // the text of an added token is not the token
  EXPECT_FALSE(m.AcceptString("<｜DSML｜>"));
  EXPECT_FALSE(m.CanTerminate());
  EXPECT_FALSE(m.AcceptToken(kEos));
  ASSERT_TRUE(m.AcceptToken(kDsml));
  EXPECT_TRUE(m.CanTerminate());
  mask = Mask(m, n);
  EXPECT_EQ(mask, BruteMask(m, n));
  EXPECT_TRUE(Allowed(mask, 'y'));
  EXPECT_TRUE(Allowed(mask, kEos));
  EXPECT_FALSE(Allowed(mask, Id("<eos>x")));  // an ordinary token spelling the stop token
  ASSERT_TRUE(m.AcceptToken('y'));
  ASSERT_TRUE(m.AcceptToken(kEos));
  EXPECT_TRUE(m.IsTerminated());
  // The token terminal between two halves of characters.
  GrammarMatcher u(g);
  ASSERT_TRUE(u.AcceptToken(Id("\xC3")));
  EXPECT_FALSE(Allowed(Mask(u, n), kDsml));
  ASSERT_TRUE(u.AcceptToken(0xA9));
  mask = Mask(u, n);
  EXPECT_EQ(mask, BruteMask(u, n));
  EXPECT_TRUE(Allowed(mask, kDsml));
  ASSERT_TRUE(u.AcceptToken(kDsml));
  EXPECT_TRUE(u.AcceptToken(Id("é")));
  EXPECT_TRUE(u.CanTerminate());
}

TEST(GrammarMatcherTest, RandomWalksMatchBruteForce) {
  // Recursive grammars with calls that return mid-token: the mask cache's uncertain tokens.
  for (const char* gbnf : {kJson,
                           R"g(root ::= item+
item ::= "(" item* ")" | "ab" | [0-9] tail
tail ::= "," | "1," | "é")g",
                           R"(root ::= a | b
a ::= "a" ("b" | c)* ":"
b ::= "ab" c "}"
c ::= "c"? "]}" | "\"" [^"]* "\"")"}) {
    SCOPED_TRACE(gbnf);
    auto g = Compile(gbnf);
    // Some tokens leave their rule mid-token: the run-time check of uncertain tokens is used.
    EXPECT_GT(g->uncertain_total(), 0u);
    const int32_t n = g->vocab().size();
    std::mt19937 rng(7);
    for (int walk = 0; walk < 20; ++walk) {
      GrammarMatcher m(g);
      for (int step = 0; step < 30 && !m.IsTerminated(); ++step) {
        std::vector<uint32_t> mask = Mask(m, n);
        ASSERT_EQ(mask, BruteMask(m, n)) << "walk " << walk << " step " << step;
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < n; ++id) {
          if (Allowed(mask, id)) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        ASSERT_TRUE(m.AcceptToken(allowed[rng() % allowed.size()]));
      }
    }
  }
}

TEST(GrammarMatcherTest, LongRepetitionsAndUncachedNodesMatchBruteForce) {
  // Copies of [^"]{0,60} far from its end share a mask cache entry (the longest token here is 12
  // bytes); with no compile budget every node is checked at run time. Both must give the
  // brute-force masks, including near the repetition's end.
  constexpr char kGbnf[] = R"(root ::= "{\"" [^"]{0,60} "\":" ("12" | "1"){3,40} "}")";
  std::vector<std::shared_ptr<const CompiledGrammar>> grammars = {Compile(kGbnf)};
  CompileOptions no_budget;
  no_budget.mask_cache_budget = 0;
  auto uncached = CompileGrammar(kGbnf, SmallVocab(), no_budget);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  grammars.push_back(*uncached);
  // A budget that runs out part-way: some nodes cached, the one whose walk passed it and the
  // rest not.
  CompileOptions small_budget;
  small_budget.mask_cache_budget = 3000;
  auto partial = CompileGrammar(kGbnf, SmallVocab(), small_budget);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_GT((*partial)->mask_cache_work(), 3000u);
  grammars.push_back(*partial);
  // Unshared, the 60 copies of [^"] alone would need about 7 entries each.
  EXPECT_LT(grammars[0]->cached_nodes(), 200u);
  for (const auto& g : grammars) {
    const int32_t n = g->vocab().size();
    std::mt19937 rng(3);
    for (int walk = 0; walk < 10; ++walk) {
      GrammarMatcher m(g);
      for (int step = 0; step < 120 && !m.IsTerminated(); ++step) {
        std::vector<uint32_t> mask = Mask(m, n);
        ASSERT_EQ(mask, BruteMask(m, n)) << "walk " << walk << " step " << step;
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < n; ++id) {
          // Prefer the quote so that walks reach the second half.
          if (Allowed(mask, id)) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        int32_t pick = allowed[rng() % allowed.size()];
        if (step > 20 && Allowed(mask, '"')) pick = '"';
        ASSERT_TRUE(m.AcceptToken(pick));
      }
    }
  }
  GrammarMatcher m(grammars[0]);
  EXPECT_TRUE(m.AcceptString("{\"" + std::string(60, 'x') + "\":111}"));
  EXPECT_TRUE(m.CanTerminate());
  EXPECT_FALSE(GrammarMatcher(grammars[0]).AcceptString("{\"" + std::string(61, 'x')));
}

// Concatenation without operator+ (GCC 12's -Wrestrict misfires on chains of it).
std::string Cat(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& p : parts) out += p;
  return out;
}

// Random grammars over a small alphabet against a vocabulary of all short strings over it: masks
// (with inlining, tail calls, repetition copies and FOLLOW-based rejection in play) must equal the
// brute-force reference at every state of random walks.
TEST(GrammarMatcherTest, RandomGrammarsMatchBruteForce) {
  auto v = std::make_shared<TokenVocab>(*SmallVocab());
  const std::string alphabet = "abc\"";
  for (int len = 2; len <= 4; ++len) {
    for (int code = 0; code < (1 << (2 * len)); code += (len == 4 ? 3 : 1)) {
      std::string t;
      for (int i = 0, c = code; i < len; ++i, c >>= 2) t.push_back(alphabet[c & 3]);
      v->bytes.push_back(t);
      v->kind.push_back(TokenVocab::Kind::kNormal);
    }
  }
  std::mt19937 rng(11);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  // An expression of depth <= d over rules r0..r3.
  std::function<std::string(int)> expr = [&](int d) -> std::string {
    switch (d <= 0 ? pick(3) : pick(8)) {
      case 0: {
        static const char* lits[] = {"\"a\"", "\"b\"", "\"ab\"", "\"c\\\"\"", "\"\""};
        return lits[pick(5)];
      }
      case 1:
        return pick(2) ? "[a-b]" : "[^a]";
      case 2:
        return Cat({"r", std::to_string(pick(4))});
      case 3:
        return Cat({expr(d - 1), " ", expr(d - 1)});
      case 4:
        return Cat({"(", expr(d - 1), " | ", expr(d - 1), ")"});
      case 5: {
        static const char* ops[] = {"*", "+", "?", "{2}", "{1,3}", "{0,12}", "{2,}"};
        return Cat({"(", expr(d - 1), ")", ops[pick(7)]});
      }
      case 6:
        return "<｜DSML｜>";
      default:
        return Cat({expr(d - 1), " ", expr(d - 1), " ", expr(d - 1)});
    }
  };
  int compiled = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string gbnf = "root ::= r0 (\"c\" r1)* r2?\n";
    for (int r = 0; r < 4; ++r) gbnf += Cat({"r", std::to_string(r), " ::= ", expr(3), "\n"});
    auto g = CompileGrammar(gbnf, v);
    if (!g.ok()) {
      // Only left recursion may fail here.
      ASSERT_NE(g.status().message().find("left recursion"), std::string_view::npos)
          << g.status() << "\n"
          << gbnf;
      continue;
    }
    ++compiled;
    const int32_t n = v->size();
    for (int walk = 0; walk < 3; ++walk) {
      GrammarMatcher m(*g);
      for (int step = 0; step < 12 && !m.IsTerminated(); ++step) {
        std::vector<uint32_t> mask = Mask(m, n);
        std::vector<uint32_t> limited;
        const std::vector<uint32_t> brute = BruteMask(m, n, &limited);
        // Where AcceptToken hit the stack limits the mask may allow the token (grammar_matcher.h);
        // everywhere else they agree.
        for (size_t w = 0; w < mask.size(); ++w) {
          ASSERT_EQ((mask[w] ^ brute[w]) & ~limited[w], 0u)
              << gbnf << "walk " << walk << " step " << step << ", word " << w << ", "
              << m.num_stacks() << " stacks";
          ASSERT_EQ(brute[w] & ~mask[w], 0u);
        }
        mask = brute;
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < n; ++id) {
          if (Allowed(mask, id)) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        ASSERT_TRUE(m.AcceptToken(allowed[pick(static_cast<int>(allowed.size()))]));
      }
    }
  }
  EXPECT_GE(compiled, 100);
}

TEST(GrammarMatcherTest, Limits) {
  // Every "a" doubles the live stacks (two ways to close each); past kMaxStacks the token is
  // rejected instead of the state growing without bound.
  auto g = Compile(R"(root ::= s
s ::= "a" s "b" | "a" s "c" | "")");
  GrammarMatcher m(g);
  const int32_t n = g->vocab().size();
  int accepted = 0;
  for (int i = 0; i < 40; ++i) {
    // Below the limit the mask is exact (from 9 stacks on, one walk from all of them); at the
    // limit it may allow more than AcceptToken (grammar_matcher.h), never less.
    std::vector<uint32_t> mask = Mask(m, n), brute = BruteMask(m, n);
    if (i < 9) {
      EXPECT_EQ(mask, brute) << i << " a, " << m.num_stacks() << " stacks";
    }
    for (size_t w = 0; w < mask.size(); ++w) EXPECT_EQ(brute[w] & ~mask[w], 0u);
    if (!m.AcceptToken('a')) break;
    ++accepted;
  }
  EXPECT_GE(accepted, 8);
  EXPECT_LT(accepted, 40);
  EXPECT_LE(m.num_stacks(), kMaxStacks);
  GrammarMatcher small(g);
  EXPECT_TRUE(small.AcceptString("aaabcb"));
  EXPECT_TRUE(small.CanTerminate());
  // Deep right recursion (tail calls push nothing) and deep nesting of a recursive rule.
  auto paren = Compile(R"g(root ::= "(" root ")" | "x" | "y" root)g");
  GrammarMatcher p(paren);
  ASSERT_TRUE(p.AcceptString(std::string(100000, 'y')));
  EXPECT_EQ(p.num_stacks(), 1u);  // tail calls: one frame however many y
  ASSERT_TRUE(p.AcceptString(std::string(20000, '(')));
  ASSERT_TRUE(p.AcceptString("x"));
  ASSERT_TRUE(p.AcceptString(std::string(20000, ')')));
  EXPECT_TRUE(p.CanTerminate());
  // Random bracket nesting makes new frames all the time (each level's return point differs);
  // the dead ones are dropped once the arena grows past its threshold, and the state stays right.
  auto brackets = Compile(R"g(root ::= item*
item ::= "(" item* ")" | "[" item* "]" | "x")g");
  GrammarMatcher b(brackets);
  std::mt19937 rng(5);
  size_t max_frames = 0;
  for (int round = 0; round < 150; ++round) {
    std::string open, close;
    for (int d = 0; d < 1500; ++d) {
      const bool paren = rng() & 1;
      open.push_back(paren ? '(' : '[');
      close.insert(close.begin(), paren ? ')' : ']');
    }
    ASSERT_TRUE(b.AcceptString(open));
    ASSERT_FALSE(b.CanTerminate());
    const char wrong = close[0] == ')' ? ']' : ')';
    ASSERT_FALSE(GrammarMatcher(b).AcceptString(std::string(1, wrong)));
    ASSERT_TRUE(b.AcceptString("x" + close));
    ASSERT_TRUE(b.CanTerminate());
    max_frames = std::max(max_frames, b.num_frames());
  }
  // About 1000 new frames a round: 150,000 without compaction; compaction at 65,536.
  EXPECT_LT(max_frames, 70000u);
  EXPECT_EQ(Mask(b, brackets->vocab().size()), BruteMask(b, brackets->vocab().size()));
  // A long document keeps the frame arena compacted (no crash, still correct).
  auto g2 = Compile(kJson);
  GrammarMatcher big(g2);
  ASSERT_TRUE(big.AcceptString("{\"a\":["));
  for (int i = 0; i < 30000; ++i) ASSERT_TRUE(big.AcceptString("[1],"));
  ASSERT_TRUE(big.AcceptString("2]}"));
  EXPECT_TRUE(big.CanTerminate());
}

// Many threads share one cache (and the compiled grammars it hands out) while it evicts.
TEST(GrammarMatcherTest, CacheAcrossThreads) {
  GrammarCache cache(SmallVocab(), 2);
  const std::vector<std::string> grammars = {R"(root ::= "a"+)", R"(root ::= [a-c]{2,5})", kJson};
  const std::vector<std::string> texts = {"aaa", "abcab", R"({"k":[1,"x"]})"};
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 60; ++i) {
        const size_t k = static_cast<size_t>(i + t) % grammars.size();
        auto g = cache.Get(grammars[k]);
        if (!g.ok()) continue;
        GrammarMatcher m(*g);
        if (m.AcceptString(texts[k]) && m.CanTerminate()) ++ok[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(ok, std::vector<int>(4, 60));
  EXPECT_LE(cache.size(), 2u);
}

}  // namespace
}  // namespace ss::grammar
