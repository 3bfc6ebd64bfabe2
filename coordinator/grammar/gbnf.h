// GBNF (llama.cpp's grammars/README.md dialect) parsed into a grammar IR: rules whose bodies are
// expression trees of literals, code point classes, rule references, token terminals, sequences,
// alternations and bounded/unbounded repetitions. The compiler (compiled_grammar.h) turns the IR
// into a pushdown automaton over bytes.
//
// Dialect:
//   name ::= alternatives      names [a-zA-Z0-9_-]+; `root` is the start rule; `#` comments run to
//                              the end of the line. A rule ends where the next `name ::=` starts
//                              (so it may span lines anywhere) or at the end of the text.
//   "literal"                  escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH (code points)
//   [a-z0-9_]  [^"\\]          code point classes: ranges, negation, the same escapes
//   .                          any one code point (U+0000..U+10FFFF except surrogates)
//   <｜DSML｜>  <[128825]>       token terminals: an added token by id, or by content: the one
//                              whose content is the whole text `<｜DSML｜>`, else the one whose
//                              content is the text inside the brackets (`｜DSML｜`)
//   ( )  |  * + ? {m} {m,} {m,n}
// An empty alternative (`a ::= | "x"`) is the empty string.
//
// Errors (InvalidArgument, "line L, column C: ..." with 1-based byte columns): syntax errors,
// invalid UTF-8, unknown escapes, code points above U+10FFFF or surrogates in literals, undefined
// rules, a rule defined twice, no `root`. Limits, checked before the work they bound: text at most
// kMaxGbnfBytes, at most kMaxRules rules, parentheses nested at most kMaxNesting deep, repetition
// bounds at most kMaxRepeat (and m <= n). The parser's recursion is bounded by kMaxNesting.
//
// Pure functions and plain values: any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ss::grammar {

inline constexpr size_t kMaxGbnfBytes = 1 << 20;
inline constexpr int kMaxRules = 10000;
inline constexpr int kMaxNesting = 64;
inline constexpr uint32_t kMaxRepeat = 10000;
inline constexpr uint32_t kUnbounded = 0xffffffffu;

struct GrammarExpr {
  enum class Kind : uint8_t {
    kSequence,     // children in order; empty = the empty string
    kAlternation,  // one of children (at least two)
    kLiteral,      // `text`, UTF-8 bytes (may be empty)
    kCharClass,    // one code point in `ranges` (sorted, disjoint, surrogates removed, negation
                   // applied); empty ranges match nothing
    kRuleRef,      // rule `rule`
    kToken,        // token terminal: `token_id` >= 0 (`<[N]>`) or the added token whose content
                   // is `text` (`<...>`, angle brackets included)
    kRepeat,       // children[0] repeated min..max times (max may be kUnbounded)
  };
  Kind kind = Kind::kSequence;
  std::vector<int32_t> children;  // indices into Grammar::exprs
  std::string text;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive code point ranges
  int32_t rule = -1;
  int32_t token_id = -1;
  uint32_t min = 0;
  uint32_t max = 0;
};

struct Grammar {
  std::vector<GrammarExpr> exprs;
  std::vector<std::string> rule_names;  // per rule
  std::vector<int32_t> rule_body;       // per rule: index into exprs
  int32_t root = -1;                    // index of the rule named `root`
};

absl::StatusOr<Grammar> ParseGbnf(std::string_view text);

}  // namespace ss::grammar
