// Regular expressions and fixed choices -> GBNF grammars (vLLM's guided_regex / guided_choice,
// and JSON Schema `pattern` through json_schema_gbnf.h).
//
// Regex dialect: the ECMAScript (ECMA-262) subset that JSON Schema patterns and guided_regex use,
// read with ECMAScript's meaning:
//   literals (UTF-8 text), `.` = any code point except the line terminators \n \r U+2028 U+2029;
//   escapes \d \D \w \W \s \S (ASCII \d and \w, ECMAScript's \s), \t \n \v \f \r \0, \cX,
//   \xHH, \uHHHH (a surrogate pair of two \u escapes is one code point), \u{H…}, and `\` before
//   any ASCII punctuation or non-ASCII character (that character);
//   classes [a-z0-9_] [^…] with ranges and the escapes above ([\b] is backspace; a `-` next to a
//   class escape is literal; [] matches nothing, [^] anything);
//   groups (…) (?:…) (?<name>…) (?P<name>…); alternation |;
//   quantifiers * + ? {m} {m,} {m,n}, each optionally lazy (`?` suffix: same language);
//   a `{` that does not start a quantifier is literal;
//   ^ only at the start and $ only at the end of a top-level alternative.
// InvalidArgument naming the construct for everything else: backreferences (\1, \k<…>),
// lookaround ((?=, (?!, (?<=, (?<!), inline flags ((?i) …), word boundaries (\b \B), \p{…}
// property escapes, possessive quantifiers, anchors elsewhere, lone surrogates, a class that
// matches nothing. Group nesting deeper than kMaxRegexDepth and counts above kMaxRegexRepeat
// are InvalidArgument too, so the parser's recursion and the output stay bounded.
//
// Matching is whole-string: the grammar's sentences are exactly the strings the regex matches
// from start to end, as if written ^(?:regex)$ (llama.cpp and XGrammar read JSON Schema patterns
// so). JSON Schema's `pattern` is unanchored by the spec; a whole match is also an unanchored
// match, so every sentence is valid, but strings that only contain a match are not generated.
//
// Pure functions, safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/grammar/gbnf_writer.h"

namespace ss::grammar {

inline constexpr int kMaxRegexDepth = 16;
inline constexpr int kMaxRegexRepeat = 1000;

// A grammar whose root matches exactly the strings `regex` matches whole (raw text).
absl::StatusOr<std::string> RegexToGbnf(std::string_view regex);

// A grammar whose root is exactly one of `choices` (vLLM guided_choice). Empty list, or a choice
// that is not valid UTF-8, is InvalidArgument. The empty string is a valid choice.
absl::StatusOr<std::string> ChoiceToGbnf(const std::vector<std::string>& choices);

// How a regex's strings are written in the generated text.
enum class RegexText {
  kRaw,                // as themselves
  kJsonStringContent,  // JSON-escaped, as the inside of a JSON string ("…" not included): `"` and
                       // `\` as \" and \\, controls as \b \t \n \f \r or \u00xx
};

// For the converters: `regex` as a GBNF expression, helper rules added to `rules` under names
// derived from `rule_hint`. `avoid` (when nonzero) is a code point never written as itself: with
// kRaw it is taken out of every class (InvalidArgument when the regex then matches nothing), with
// kJsonStringContent it is written as a \uXXXX escape. Errors as RegexToGbnf.
absl::StatusOr<std::string> RegexToGbnfExpr(std::string_view regex, RegexText text,
                                            std::string_view rule_hint, GbnfRules* rules,
                                            uint32_t avoid = 0);

}  // namespace ss::grammar
