#include "coordinator/grammar/gbnf.h"

#include <algorithm>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/grammar/utf8_ranges.h"
#include "coordinator/utf8.h"

namespace ss::grammar {
namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  absl::StatusOr<Grammar> Run() {
    SkipSpace();
    while (!Eof()) {
      const size_t name_at = pos_;
      std::string_view name = Name();
      if (name.empty()) return Error(pos_, "expected a rule name");
      SkipSpace();
      if (s_.substr(pos_, 3) != "::=") return Error(pos_, "expected '::=' after rule name");
      pos_ += 3;
      absl::StatusOr<int32_t> id = RuleId(name, name_at);
      if (!id.ok()) return id.status();
      if (g_.rule_body[*id] >= 0) {
        return Error(name_at, absl::StrCat("rule '", std::string(name), "' is defined twice"));
      }
      absl::StatusOr<int32_t> body = Alternation(0);
      if (!body.ok()) return body.status();
      g_.rule_body[*id] = *body;
      SkipSpace();
    }
    for (size_t r = 0; r < g_.rule_names.size(); ++r) {
      if (g_.rule_body[r] < 0) {
        return Error(first_ref_[r], absl::StrCat("undefined rule '", g_.rule_names[r], "'"));
      }
    }
    auto root = ids_.find("root");
    if (root == ids_.end()) return Error(s_.size(), "no 'root' rule");
    g_.root = root->second;
    return std::move(g_);
  }

 private:
  bool Eof() const { return pos_ >= s_.size(); }

  absl::Status Error(size_t at, std::string_view msg) const {
    at = std::min(at, s_.size());
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at; ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("GBNF line ", line, ", column ", col, ": ", std::string(msg)));
  }

  void SkipSpace() {
    while (!Eof()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else if (c == '#') {
        while (!Eof() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string_view Name() {
    size_t b = pos_;
    while (!Eof() && IsNameChar(s_[pos_])) ++pos_;
    return s_.substr(b, pos_ - b);
  }

  // Whether a `name ::=` starts at pos_ (the next rule's definition).
  bool AtRuleStart() const {
    size_t p = pos_;
    while (p < s_.size() && IsNameChar(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    return s_.substr(p, 3) == "::=";
  }

  absl::StatusOr<int32_t> RuleId(std::string_view name, size_t at) {
    auto it = ids_.find(std::string(name));
    if (it != ids_.end()) return it->second;
    if (g_.rule_names.size() >= static_cast<size_t>(kMaxRules)) {
      return Error(at, absl::StrCat("more than ", kMaxRules, " rules"));
    }
    int32_t id = static_cast<int32_t>(g_.rule_names.size());
    g_.rule_names.emplace_back(name);
    g_.rule_body.push_back(-1);
    first_ref_.push_back(at);
    ids_.emplace(std::string(name), id);
    return id;
  }

  int32_t Add(GrammarExpr e) {
    g_.exprs.push_back(std::move(e));
    return static_cast<int32_t>(g_.exprs.size() - 1);
  }

  absl::StatusOr<int32_t> Alternation(int depth) {
    std::vector<int32_t> alts;
    absl::StatusOr<int32_t> first = Sequence(depth);
    if (!first.ok()) return first.status();
    alts.push_back(*first);
    SkipSpace();
    while (!Eof() && s_[pos_] == '|') {
      ++pos_;
      absl::StatusOr<int32_t> next = Sequence(depth);
      if (!next.ok()) return next.status();
      alts.push_back(*next);
      SkipSpace();
    }
    if (alts.size() == 1) return alts[0];
    GrammarExpr e;
    e.kind = GrammarExpr::Kind::kAlternation;
    e.children = std::move(alts);
    return Add(std::move(e));
  }

  absl::StatusOr<int32_t> Sequence(int depth) {
    GrammarExpr seq;
    seq.kind = GrammarExpr::Kind::kSequence;
    while (true) {
      SkipSpace();
      if (Eof()) break;
      char c = s_[pos_];
      if (c == '|' || c == ')') break;
      if (AtRuleStart()) break;
      absl::StatusOr<int32_t> item = Element(depth);
      if (!item.ok()) return item.status();
      absl::StatusOr<int32_t> rep = Postfix(*item);
      if (!rep.ok()) return rep.status();
      seq.children.push_back(*rep);
    }
    if (seq.children.size() == 1) return seq.children[0];
    return Add(std::move(seq));
  }

  // At most one postfix operator per element (as llama.cpp), so the IR's depth stays bounded by
  // the parentheses' nesting.
  absl::StatusOr<int32_t> Postfix(int32_t item) {
    if (!Eof()) {
      const size_t at = pos_;
      char c = s_[pos_];
      uint32_t lo, hi;
      if (c == '*') {
        lo = 0, hi = kUnbounded, ++pos_;
      } else if (c == '+') {
        lo = 1, hi = kUnbounded, ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++pos_;
      } else if (c == '{') {
        ++pos_;
        SkipBlanks();
        absl::StatusOr<uint32_t> m = Number();
        if (!m.ok()) return m.status();
        lo = hi = *m;
        SkipBlanks();
        if (!Eof() && s_[pos_] == ',') {
          ++pos_;
          SkipBlanks();
          if (!Eof() && s_[pos_] == '}') {
            hi = kUnbounded;
          } else {
            absl::StatusOr<uint32_t> n = Number();
            if (!n.ok()) return n.status();
            hi = *n;
            SkipBlanks();
          }
        }
        if (Eof() || s_[pos_] != '}') return Error(pos_, "expected '}' in repetition");
        ++pos_;
        if (hi != kUnbounded && hi < lo) return Error(at, "repetition {m,n} with n < m");
      } else {
        return item;
      }
      GrammarExpr e;
      e.kind = GrammarExpr::Kind::kRepeat;
      e.children = {item};
      e.min = lo;
      e.max = hi;
      item = Add(std::move(e));
    }
    return item;
  }

  void SkipBlanks() {
    while (!Eof() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }

  absl::StatusOr<uint32_t> Number() {
    const size_t at = pos_;
    uint64_t v = 0;
    while (!Eof() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(s_[pos_] - '0');
      if (v > kMaxRepeat) return Error(at, absl::StrCat("repetition bound above ", kMaxRepeat));
      ++pos_;
    }
    if (pos_ == at) return Error(at, "expected a number in repetition");
    return static_cast<uint32_t>(v);
  }

  // One code point of the grammar text (raw UTF-8 or an escape) at pos_.
  absl::StatusOr<uint32_t> CodePoint() {
    const size_t at = pos_;
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\\') {
      if (pos_ + 1 >= s_.size()) return Error(at, "unterminated escape");
      char e = s_[pos_ + 1];
      pos_ += 2;
      int digits = 0;
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case '\\':
          return uint32_t{'\\'};
        case '"':
          return uint32_t{'"'};
        case '[':
          return uint32_t{'['};
        case ']':
          return uint32_t{']'};
        case 'x':
          digits = 2;
          break;
        case 'u':
          digits = 4;
          break;
        case 'U':
          digits = 8;
          break;
        default:
          return Error(at, absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
      }
      uint64_t v = 0;
      for (int i = 0; i < digits; ++i) {
        int h = Eof() ? -1 : HexValue(s_[pos_]);
        if (h < 0) return Error(pos_, "expected a hex digit in escape");
        v = v * 16 + static_cast<uint64_t>(h);
        ++pos_;
      }
      if (v > 0x10FFFF) return Error(at, "code point above U+10FFFF");
      return static_cast<uint32_t>(v);
    }
    uint32_t cp = 0;
    size_t len = DecodeUtf8(s_.substr(pos_), &cp);
    if (len == 0) return Error(at, "invalid UTF-8");
    pos_ += len;
    return cp;
  }

  absl::StatusOr<int32_t> Element(int depth) {
    const size_t at = pos_;
    char c = s_[pos_];
    if (c == '"') {
      ++pos_;
      GrammarExpr e;
      e.kind = GrammarExpr::Kind::kLiteral;
      while (true) {
        if (Eof()) return Error(at, "unterminated literal");
        if (s_[pos_] == '"') break;
        const size_t cp_at = pos_;
        absl::StatusOr<uint32_t> cp = CodePoint();
        if (!cp.ok()) return cp.status();
        if (*cp >= 0xD800 && *cp <= 0xDFFF) return Error(cp_at, "surrogate code point in literal");
        utf8::Append(*cp, &e.text);
      }
      ++pos_;
      return Add(std::move(e));
    }
    if (c == '[') {
      ++pos_;
      bool negated = false;
      if (!Eof() && s_[pos_] == '^') {
        negated = true;
        ++pos_;
      }
      std::vector<std::pair<uint32_t, uint32_t>> ranges;
      while (true) {
        if (Eof()) return Error(at, "unterminated character class");
        if (s_[pos_] == ']') break;
        const size_t lo_at = pos_;
        absl::StatusOr<uint32_t> lo = CodePoint();
        if (!lo.ok()) return lo.status();
        uint32_t hi = *lo;
        if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          absl::StatusOr<uint32_t> h = CodePoint();
          if (!h.ok()) return h.status();
          hi = *h;
          if (hi < *lo) return Error(lo_at, "character range with end before start");
        }
        ranges.emplace_back(*lo, hi);
      }
      ++pos_;
      GrammarExpr e;
      e.kind = GrammarExpr::Kind::kCharClass;
      e.ranges = NormalizeRanges(std::move(ranges), negated);
      return Add(std::move(e));
    }
    if (c == '.') {
      ++pos_;
      GrammarExpr e;
      e.kind = GrammarExpr::Kind::kCharClass;
      e.ranges = NormalizeRanges({}, /*negated=*/true);
      return Add(std::move(e));
    }
    if (c == '(') {
      if (depth + 1 > kMaxNesting) {
        return Error(at, absl::StrCat("parentheses nested more than ", kMaxNesting, " deep"));
      }
      ++pos_;
      absl::StatusOr<int32_t> inner = Alternation(depth + 1);
      if (!inner.ok()) return inner.status();
      SkipSpace();
      if (Eof() || s_[pos_] != ')') return Error(at, "unclosed '('");
      ++pos_;
      return *inner;
    }
    if (c == '<') {
      size_t end = pos_ + 1;
      while (end < s_.size() && s_[end] != '>' && s_[end] != '\n') ++end;
      if (end >= s_.size() || s_[end] != '>') return Error(at, "unterminated token terminal '<'");
      std::string_view inner = s_.substr(pos_ + 1, end - pos_ - 1);
      GrammarExpr e;
      e.kind = GrammarExpr::Kind::kToken;
      if (inner.size() >= 3 && inner.front() == '[' && inner.back() == ']') {
        int64_t v = 0;
        std::string_view digits = inner.substr(1, inner.size() - 2);
        for (char d : digits) {
          if (d < '0' || d > '9') return Error(at, "token id must be a decimal number");
          v = v * 10 + (d - '0');
          if (v > 0x7fffffff) return Error(at, "token id too large");
        }
        e.token_id = static_cast<int32_t>(v);
      } else {
        if (inner.empty()) return Error(at, "empty token terminal '<>'");
        e.text = std::string(s_.substr(pos_, end - pos_ + 1));
      }
      pos_ = end + 1;
      return Add(std::move(e));
    }
    if (IsNameChar(c)) {
      std::string_view name = Name();
      absl::StatusOr<int32_t> id = RuleId(name, at);
      if (!id.ok()) return id.status();
      GrammarExpr e;
      e.kind = GrammarExpr::Kind::kRuleRef;
      e.rule = *id;
      return Add(std::move(e));
    }
    return Error(at, absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  std::string_view s_;
  size_t pos_ = 0;
  Grammar g_;
  absl::flat_hash_map<std::string, int32_t> ids_;
  std::vector<size_t> first_ref_;
};

}  // namespace

absl::StatusOr<Grammar> ParseGbnf(std::string_view text) {
  if (text.size() > kMaxGbnfBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("GBNF text of ", text.size(), " bytes exceeds the limit of ", kMaxGbnfBytes));
  }
  return Parser(text).Run();
}

}  // namespace ss::grammar
