// RegexToGbnf and ChoiceToGbnf through the grammar matcher. Regexes are cross-checked against
// std::regex (ECMAScript grammar, whole-string match): on random ASCII strings both must agree,
// and random sentences of the grammar must match.
#include "coordinator/grammar/regex_gbnf.h"

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "coordinator/grammar/json_schema_gbnf.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grammar_test_util.h"

namespace ss::grammar {
namespace {

using testing::Accepts;
using testing::Compile;

std::shared_ptr<const CompiledGrammar> RegexGrammar(const std::string& re) {
  absl::StatusOr<std::string> gbnf = RegexToGbnf(re);
  EXPECT_TRUE(gbnf.ok()) << re << ": " << gbnf.status();
  if (!gbnf.ok()) return nullptr;
  auto g = Compile(*gbnf);
  EXPECT_NE(g, nullptr) << *gbnf;
  return g;
}

TEST(RegexGbnf, AgreesWithStdRegex) {
  const std::vector<std::string> patterns = {
      "[a-c]+x?",
      "(ab|cd)*e",
      "\\d{2,4}",
      "a.b",
      "[^a-c]{1,3}",
      "(?:x|y|)z",
      "colou?r",
      "\\w+@\\w+\\.com",
      "[\\d-]+",
      "a{2}b{0,1}c{1,}",
      "^(foo|bar)$",
      "[.]\\.",
      "\\x41\\u0042",
      "[\\s]+",
      "a|",
      "(a|b){3}",
      "[-a]",
      "a\\/b",
      "x{2,}?y",
      "(a(b(c)?)?)+",
      "\\D\\W\\S",
      "[A-Za-z_][\\w]*",
      "-?\\d+(\\.\\d+)?",
      "[^\\n]*",
      "(?<name>ab)c|(?P<n>x)",
      "\\t\\n",
      "[\\b]",
      "",
  };
  const std::string alphabet = "abcdexyz019-@._ \t\nAB/{},";
  std::mt19937 rng(11);
  for (const std::string& p : patterns) {
    SCOPED_TRACE(p);
    auto g = RegexGrammar(p);
    ASSERT_NE(g, nullptr);
    // std::regex lacks named groups: the same pattern with plain ones.
    std::string plain = p;
    for (const char* named : {"?<name>", "?P<n>"}) {
      if (size_t at = plain.find(named); at != std::string::npos) {
        plain.erase(at, std::string(named).size());
      }
    }
    const std::regex re(plain, std::regex::ECMAScript);
    for (int i = 0; i < 400; ++i) {
      std::string s;
      const int len = std::uniform_int_distribution<int>(0, 8)(rng);
      for (int k = 0; k < len; ++k) {
        s.push_back(alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)]);
      }
      EXPECT_EQ(Accepts(g, s), std::regex_match(s, re)) << "\"" << s << "\"";
    }
    int finished = 0;
    for (int i = 0; i < 30; ++i) {
      std::optional<std::string> s = testing::RandomSentence(g, &rng);
      if (!s) continue;
      ++finished;
      // std::regex works on bytes: check the ASCII sentences.
      if (std::all_of(s->begin(), s->end(), [](char c) { return (c & 0x80) == 0; })) {
        EXPECT_TRUE(std::regex_match(*s, re)) << "\"" << *s << "\"";
      }
    }
    EXPECT_GE(finished, 15);
  }
}

// Annex B: a brace that does not start a quantifier is literal (std::regex refuses these).
TEST(RegexGbnf, LiteralBraces) {
  auto g = RegexGrammar("a{,2}b{x}c{");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Accepts(g, "a{,2}b{x}c{"));
  EXPECT_FALSE(Accepts(g, "aab{x}c{"));
}

// A JSON Schema `pattern` matches the decoded string: the grammar writes it JSON-escaped. Random
// strings with quotes, backslashes and controls, dumped as JSON, are accepted exactly when
// std::regex matches the raw string.
TEST(RegexGbnf, JsonStringContentAgreesWithStdRegex) {
  const std::vector<std::string> patterns = {
      "[\"\\\\]+",      "[a\\n]+b?", "[^a]*", ".\\t?",          "\\s+",
      "[\\x00-\\x1f]+", "\\W*",      "x|\"",  "(a|\\\\)*\\x01",
  };
  const std::string alphabet = std::string(
                                   "\"\\\n\t\x01\x08"
                                   "ab x/") +
                               '\0';
  std::mt19937 rng(13);
  for (const std::string& p : patterns) {
    SCOPED_TRACE(p);
    absl::StatusOr<std::string> gbnf = JsonSchemaToGbnf(
        nlohmann::ordered_json{{"type", "string"}, {"pattern", "^(?:" + p + ")$"}}, {});
    ASSERT_TRUE(gbnf.ok()) << gbnf.status();
    auto g = Compile(*gbnf);
    ASSERT_NE(g, nullptr) << *gbnf;
    const std::regex re(p, std::regex::ECMAScript);
    int matched = 0;
    for (int i = 0; i < 400; ++i) {
      std::string s;
      const int len = std::uniform_int_distribution<int>(0, 5)(rng);
      for (int k = 0; k < len; ++k) {
        s.push_back(alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)]);
      }
      const bool match = std::regex_match(s, re);
      matched += match;
      EXPECT_EQ(Accepts(g, nlohmann::json(s).dump()), match) << nlohmann::json(s).dump();
    }
    EXPECT_GT(matched, 0);
  }
}

TEST(RegexGbnf, Unicode) {
  auto g = RegexGrammar("[α-ω]+é\\u00e8.\\uD83D\\uDE00");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Accepts(g, "βγéèx😀"));
  EXPECT_TRUE(Accepts(g, "ωéè€😀"));
  EXPECT_FALSE(Accepts(g, "aéèx😀"));
  EXPECT_FALSE(Accepts(g, "βéè\n😀"));  // `.` excludes line terminators
  EXPECT_FALSE(Accepts(g, "βéè\xe2\x80\xa8😀"));
}

TEST(RegexGbnf, Errors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a)\\1", "backreference"},
      {"\\k<x>", "backreference"},
      {"(?=a)", "lookaround"},
      {"(?<!a)b", "lookaround"},
      {"(?i)a", "flags"},
      {"a\\b", "word boundary"},
      {"\\Ba", "word boundary"},
      {"a**", "nothing to repeat"},
      {"*a", "nothing to repeat"},
      {"a*+", "possessive"},
      {"a{3,2}", "n < m"},
      {"(a", "missing ')'"},
      {"a)", "unmatched ')'"},
      {"[b-a]", "out of order"},
      {"\\p{L}", "property"},
      {"a^b", "'^'"},
      {"a$b", "'$'"},
      {"(^a)", "'^'"},
      {"[]", "matches nothing"},
      {"\\uD800", "surrogate"},
      {"a{1001}", "repetition count"},
      {"\\q", "unknown escape"},
      {"[a", "missing ']'"},
      {"\\", "trailing backslash"},
  };
  for (const auto& [re, what] : cases) {
    absl::StatusOr<std::string> g = RegexToGbnf(re);
    ASSERT_FALSE(g.ok()) << re << "\n" << *g;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(what), std::string::npos)
        << re << ": " << g.status().message();
  }
  std::string deep;
  for (int i = 0; i <= kMaxRegexDepth + 1; ++i) deep = "(" + deep + "a)";
  EXPECT_FALSE(RegexToGbnf(deep).ok());
  std::string ok_depth;
  for (int i = 0; i < kMaxRegexDepth; ++i) ok_depth = "(" + ok_depth + "a)";
  auto g = RegexGrammar(ok_depth);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Accepts(g, std::string(kMaxRegexDepth, 'a')));
}

TEST(ChoiceGbnf, ExactlyOneChoice) {
  const std::vector<std::string> choices = {"yes", "no", "may\"be\\", "", "über", "line\nbreak"};
  absl::StatusOr<std::string> gbnf = ChoiceToGbnf(choices);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status();
  auto g = Compile(*gbnf);
  ASSERT_NE(g, nullptr) << *gbnf;
  for (const std::string& c : choices) EXPECT_TRUE(Accepts(g, c)) << c;
  for (const char* bad : {"y", "yesno", "no ", "NO", "uber", "line"}) {
    EXPECT_FALSE(Accepts(g, bad)) << bad;
  }
  EXPECT_FALSE(ChoiceToGbnf({}).ok());
  EXPECT_FALSE(ChoiceToGbnf({"ok", "\xff"}).ok());
}

}  // namespace
}  // namespace ss::grammar
