// GBNF parsing: the accepted dialect (llama.cpp's) and every error with its line and column, plus
// the automaton builder's compile-time errors (left recursion, limits, token terminals).
#include <memory>
#include <string>

#include "coordinator/grammar/compiled_grammar.h"
#include "coordinator/grammar/gbnf.h"
#include "gtest/gtest.h"

namespace ss::grammar {
namespace {

using Kind = GrammarExpr::Kind;

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
  v->stop_ids = {257};
  return v;
}

std::string ErrorOf(std::string_view gbnf) {
  absl::StatusOr<Grammar> g = ParseGbnf(gbnf);
  if (g.ok()) return "OK";
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(g.status().message());
}

std::string CompileErrorOf(std::string_view gbnf) {
  auto g = CompileGrammar(gbnf, SmallVocab());
  if (g.ok()) return "OK";
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(g.status().message());
}

TEST(GbnfTest, AcceptedForms) {
  absl::StatusOr<Grammar> g = ParseGbnf(R"(# a comment
root ::= item ("," item)* | empty   # trailing comment
item ::= "a\n\t\"\\\x41\u00e9\U0001F600" [a-z0-9_] [^"\\] . <｜DSML｜> <[256]>
  x{2} x{2,} x{1,3} x? x+
empty ::=
x ::= [\[\]] | "q"
  | "r"
)");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->rule_names.size(), 4u);
  EXPECT_EQ(g->rule_names[g->root], "root");
  // item's sequence: literal, two classes, any, two tokens, five repetitions.
  const GrammarExpr& item = g->exprs[g->rule_body[1]];
  ASSERT_EQ(item.kind, Kind::kSequence);
  ASSERT_EQ(item.children.size(), 11u);
  const GrammarExpr& lit = g->exprs[item.children[0]];
  EXPECT_EQ(lit.kind, Kind::kLiteral);
  EXPECT_EQ(lit.text, "a\n\t\"\\A\xC3\xA9\xF0\x9F\x98\x80");
  const GrammarExpr& cls = g->exprs[item.children[1]];
  EXPECT_EQ(cls.kind, Kind::kCharClass);
  EXPECT_EQ(cls.ranges,
            (std::vector<std::pair<uint32_t, uint32_t>>{{'0', '9'}, {'_', '_'}, {'a', 'z'}}));
  const GrammarExpr& neg = g->exprs[item.children[2]];
  ASSERT_EQ(neg.ranges.size(), 4u);  // [0,!] [#,[] []-D7FF] [E000-10FFFF]
  EXPECT_EQ(neg.ranges[0], (std::pair<uint32_t, uint32_t>{0, '"' - 1}));
  EXPECT_EQ(neg.ranges[3], (std::pair<uint32_t, uint32_t>{0xE000, 0x10FFFF}));
  const GrammarExpr& tok = g->exprs[item.children[4]];
  EXPECT_EQ(tok.kind, Kind::kToken);
  EXPECT_EQ(tok.text, "<｜DSML｜>");
  EXPECT_EQ(g->exprs[item.children[5]].token_id, 256);
  const GrammarExpr& rep = g->exprs[item.children[8]];
  EXPECT_EQ(rep.kind, Kind::kRepeat);
  EXPECT_EQ(rep.min, 1u);
  EXPECT_EQ(rep.max, 3u);
  EXPECT_EQ(g->exprs[item.children[7]].max, kUnbounded);
  // `empty ::=` is the empty sequence; x spans three lines.
  const GrammarExpr& empty = g->exprs[g->rule_body[2]];
  EXPECT_EQ(empty.kind, Kind::kSequence);
  EXPECT_TRUE(empty.children.empty());
  EXPECT_EQ(g->exprs[g->rule_body[3]].children.size(), 3u);
  EXPECT_EQ(CompileErrorOf(R"(root ::= item ("," item)*
item ::= "a" <｜DSML｜> | <[256]>)"),
            "OK");
}

TEST(GbnfTest, ErrorsNameLineAndColumn) {
  EXPECT_EQ(ErrorOf("root ::= foo"), "GBNF line 1, column 10: undefined rule 'foo'");
  EXPECT_EQ(ErrorOf("a ::= \"x\""), "GBNF line 1, column 10: no 'root' rule");
  EXPECT_EQ(ErrorOf("root ::= \"x\"\nroot ::= \"y\""),
            "GBNF line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(ErrorOf("root ::= \"abc"), "GBNF line 1, column 10: unterminated literal");
  EXPECT_EQ(ErrorOf("root ::= \"a\\q\""), "GBNF line 1, column 12: unknown escape '\\q'");
  EXPECT_EQ(ErrorOf("root ::= [a-"), "GBNF line 1, column 10: unterminated character class");
  EXPECT_EQ(ErrorOf("root ::= [z-a]"),
            "GBNF line 1, column 11: character range with end before start");
  EXPECT_EQ(ErrorOf("root ::= (\"a\""), "GBNF line 1, column 10: unclosed '('");
  EXPECT_EQ(ErrorOf("root ::= \"a\" )"), "GBNF line 1, column 14: expected a rule name");
  EXPECT_EQ(ErrorOf("root = \"a\""), "GBNF line 1, column 6: expected '::=' after rule name");
  EXPECT_EQ(ErrorOf("root ::=\n  \"a\" @"), "GBNF line 2, column 7: unexpected character '@'");
  EXPECT_EQ(ErrorOf("root ::= \"\\U00110000\""),
            "GBNF line 1, column 11: code point above U+10FFFF");
  EXPECT_EQ(ErrorOf("root ::= \"\\uD800\""),
            "GBNF line 1, column 11: surrogate code point in literal");
  EXPECT_EQ(ErrorOf("root ::= \"\xff\""), "GBNF line 1, column 11: invalid UTF-8");
  EXPECT_EQ(ErrorOf("root ::= <abc"), "GBNF line 1, column 10: unterminated token terminal '<'");
  EXPECT_EQ(ErrorOf("root ::= \"a\"{3,2}"), "GBNF line 1, column 13: repetition {m,n} with n < m");
  EXPECT_EQ(ErrorOf("root ::= \"a\"{2"), "GBNF line 1, column 15: expected '}' in repetition");
  EXPECT_EQ(ErrorOf("root ::= \"a\"**"), "GBNF line 1, column 14: unexpected character '*'");
}

TEST(GbnfTest, Limits) {
  EXPECT_EQ(ErrorOf("root ::= \"a\"{10001}"),
            "GBNF line 1, column 14: repetition bound above 10000");
  EXPECT_EQ(ErrorOf("root ::= \"a\"{1,99999999999999999999}"),
            "GBNF line 1, column 16: repetition bound above 10000");
  EXPECT_EQ(ErrorOf("root ::= \"a\"{10000}"), "OK");
  std::string deep = "root ::= ";
  deep.append(65, '(').append("\"a\"").append(65, ')');
  EXPECT_EQ(ErrorOf(deep), "GBNF line 1, column 74: parentheses nested more than 64 deep");
  std::string ok = "root ::= ";
  ok.append(64, '(').append("\"a\"").append(64, ')');
  EXPECT_EQ(ErrorOf(ok), "OK");
  std::string big = "root ::= \"";
  big.append(kMaxGbnfBytes, 'a').append("\"");
  EXPECT_EQ(ErrorOf(big), "GBNF text of 1048587 bytes exceeds the limit of 1048576");
  std::string many = "root ::= r0\n";
  for (int i = 0; i < kMaxRules; ++i) {
    many.append("r").append(std::to_string(i)).append(" ::= \"x\"\n");
  }
  EXPECT_NE(ErrorOf(many).find("more than 10000 rules"), std::string::npos);
  // Expansion: 10000 * 10000 copies of a class is far above the automaton's limit.
  EXPECT_EQ(CompileErrorOf("root ::= ([a-z]{10000}){10000}"),
            "grammar too large: more than 131072 automaton states");
}

TEST(GbnfTest, CompileErrors) {
  EXPECT_EQ(CompileErrorOf("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]"),
            "left recursion in rule 'expr' (it can reach itself without consuming input); "
            "rewrite it with repetition, e.g. `a ::= b (\"x\" b)*`");
  // Through a nullable prefix and another rule.
  EXPECT_NE(CompileErrorOf("root ::= a\na ::= opt b \"x\" | \"y\"\nopt ::= \"z\"?\nb ::= a \"w\"")
                .find("left recursion in rule"),
            std::string::npos);
  // Right recursion is fine.
  EXPECT_EQ(CompileErrorOf("root ::= \"(\" root \")\" | \"x\""), "OK");
  EXPECT_EQ(CompileErrorOf("root ::= <nope>"),
            "token terminal <nope> is not an added token of the vocabulary");
  EXPECT_EQ(CompileErrorOf("root ::= <[65]>"), "token terminal <[65]> is not an added token");
  EXPECT_EQ(CompileErrorOf("root ::= <[999]>"), "token terminal <[999]> is not an added token");
}

}  // namespace
}  // namespace ss::grammar
