// Building GBNF text (the dialect of grammar_api.md / llama.cpp's grammars/README.md) from
// program-generated pieces: escaped literals, code point classes, and a rule table that names
// rules, shares identical ones and bounds the size of what it holds. Used by the converters
// (json_schema_gbnf.h, regex_gbnf.h, dsml_tool_gbnf.h); the parser and matcher never see it.
//
// Not thread-safe: one GbnfRules per conversion. Pure functions otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/grammar/gbnf.h"

namespace ss::grammar {

// This absl build has its own string_view, which StrCat and the Status factories need.
inline absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

// A conversion's output has at most the parser's kMaxGbnfBytes bytes and kMaxRules rules
// (gbnf.h); more is ResourceExhausted.

// `utf8` as a GBNF string literal, quotes included. Printable ASCII stays as is (with `"` and `\`
// escaped); controls and DEL become \xHH; other code points stay as UTF-8 text. InvalidArgument
// when `utf8` is not valid UTF-8 (a literal matches code points, not bytes).
absl::StatusOr<std::string> GbnfLiteral(std::string_view utf8);

// A set of Unicode scalar values (surrogates are never members), as sorted, disjoint,
// non-adjacent inclusive ranges.
class CodepointSet {
 public:
  static constexpr uint32_t kMax = 0x10FFFF;

  CodepointSet() = default;
  static CodepointSet Range(uint32_t lo, uint32_t hi);
  static CodepointSet Of(uint32_t cp) { return Range(cp, cp); }
  static CodepointSet All() { return Range(0, kMax); }

  void Add(uint32_t lo, uint32_t hi);
  void AddSet(const CodepointSet& other);
  CodepointSet Complement() const;
  CodepointSet Intersect(const CodepointSet& other) const;
  CodepointSet Minus(const CodepointSet& other) const { return Intersect(other.Complement()); }
  bool Contains(uint32_t cp) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

 private:
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

// A non-empty set as one GBNF character class `[...]`, every member written as an escape or a
// printable ASCII character that has no meaning inside a class.
std::string GbnfClass(const CodepointSet& set);

// Rule names are [a-zA-Z0-9_-]+: other characters of `hint` become '-', an empty hint "r".
std::string SanitizeRuleName(std::string_view hint);

// The rules of one grammar, written in the order they were added (`root` first when it is
// added first). A name is taken at most once: Add/Reserve derive a fresh name from the hint
// (hint, hint-1, hint-2, …) unless an identical rule already exists under a name derived from
// that hint, which is then shared.
class GbnfRules {
 public:
  // Defines a rule with `body` (GBNF alternatives) and returns its name.
  std::string Add(std::string_view hint, std::string body);
  // Takes a fresh name for a rule defined later with Define (recursive rules).
  std::string Reserve(std::string_view hint);
  void Define(const std::string& name, std::string body);
  // OK, or ResourceExhausted once the rules together passed kMaxGbnfBytes or kMaxRules.
  absl::Status status() const;
  // The grammar text, one `name ::= body` line per rule. Every reserved rule must be defined.
  absl::StatusOr<std::string> Render() const;

 private:
  std::string FreshName(std::string_view hint);

  struct Rule {
    std::string name;
    std::string body;
    bool defined = false;
  };
  std::vector<Rule> rules_;
  absl::flat_hash_map<std::string, size_t> index_;        // name -> rules_ index
  absl::flat_hash_map<std::string, std::string> shared_;  // hint "\n" body -> name
  absl::flat_hash_map<std::string, size_t> next_suffix_;  // base name -> last suffix tried
  size_t bytes_ = 0;
};

}  // namespace ss::grammar
