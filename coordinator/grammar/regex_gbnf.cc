#include "coordinator/grammar/regex_gbnf.h"

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/utf8.h"

namespace ss::grammar {
namespace {

struct Node {
  enum class Kind { kEmpty, kSet, kConcat, kAlt, kRepeat };
  Kind kind = Kind::kEmpty;
  CodepointSet set;           // kSet
  std::vector<int> children;  // kConcat, kAlt; kRepeat: one
  int min = 0, max = -1;      // kRepeat; max -1 = unbounded
};

CodepointSet Digits() { return CodepointSet::Range('0', '9'); }
CodepointSet WordChars() {
  CodepointSet s = CodepointSet::Range('a', 'z');
  s.Add('A', 'Z');
  s.Add('0', '9');
  s.Add('_', '_');
  return s;
}
CodepointSet SpaceChars() {  // ECMAScript WhiteSpace and LineTerminator
  CodepointSet s = CodepointSet::Range('\t', '\r');
  for (uint32_t cp :
       {0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u, 0xFEFFu}) {
    s.Add(cp, cp);
  }
  s.Add(0x2000, 0x200A);
  return s;
}
CodepointSet DotChars() {
  CodepointSet s;
  for (uint32_t cp : {0x0Au, 0x0Du, 0x2028u, 0x2029u}) s.Add(cp, cp);
  return s.Complement();
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsAsciiAlnum(uint32_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view re) : re_(re) {}

  absl::StatusOr<int> Parse() {
    absl::StatusOr<int> root = ParseAlt(0);
    if (!root.ok()) return root;
    if (pos_ < re_.size()) return Error("unmatched ')'");
    return root;
  }

  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regex: ", AV(what), " at offset ", pos_, " of \"", AV(re_), "\""));
  }
  bool AtEnd() const { return pos_ >= re_.size(); }
  char Peek(size_t ahead = 0) const { return pos_ + ahead < re_.size() ? re_[pos_ + ahead] : '\0'; }
  bool LookingAt(std::string_view s) const { return re_.substr(pos_).starts_with(s); }

  int AddNode(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size()) - 1;
  }
  int AddSet(CodepointSet s) {
    Node n;
    n.kind = Node::Kind::kSet;
    n.set = std::move(s);
    return AddNode(std::move(n));
  }

  absl::StatusOr<uint32_t> NextCodepoint() {
    const auto* p = reinterpret_cast<const unsigned char*>(re_.data()) + pos_;
    const utf8::Step step = utf8::Next(p, re_.size() - pos_);
    if (step.kind != utf8::Kind::kChar) return Error("invalid UTF-8");
    uint32_t cp = step.len == 1 ? p[0] : (p[0] & (0xFF >> (step.len + 1)));
    for (size_t i = 1; i < step.len; ++i) cp = (cp << 6) | (p[i] & 0x3F);
    pos_ += step.len;
    return cp;
  }

  absl::StatusOr<int> ParseAlt(int depth) {
    if (depth > kMaxRegexDepth) return Error("groups nested too deeply");
    Node alt;
    alt.kind = Node::Kind::kAlt;
    while (true) {
      absl::StatusOr<int> seq = ParseConcat(depth);
      if (!seq.ok()) return seq;
      alt.children.push_back(*seq);
      if (Peek() != '|' || AtEnd()) break;
      ++pos_;
    }
    if (alt.children.size() == 1) return alt.children[0];
    return AddNode(std::move(alt));
  }

  absl::StatusOr<int> ParseConcat(int depth) {
    Node seq;
    seq.kind = Node::Kind::kConcat;
    const size_t start = pos_;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '^') {
        if (depth != 0 || pos_ != start) return Error("'^' not at the start of the pattern");
        ++pos_;
        continue;
      }
      if (Peek() == '$') {
        ++pos_;
        if (depth != 0 || !(AtEnd() || Peek() == '|')) {
          --pos_;
          return Error("'$' not at the end of the pattern");
        }
        continue;
      }
      absl::StatusOr<int> atom = ParseQuantified(depth);
      if (!atom.ok()) return atom;
      seq.children.push_back(*atom);
    }
    if (seq.children.empty()) return AddNode(Node{});
    if (seq.children.size() == 1) return seq.children[0];
    return AddNode(std::move(seq));
  }

  // A `{m}`, `{m,}` or `{m,n}` at pos_: sets the bounds and returns true, else false.
  absl::StatusOr<bool> ParseBraces(int* min, int* max) {
    size_t p = pos_ + 1;
    auto number = [&](int* out) -> std::optional<bool> {
      const size_t begin = p;
      int64_t v = 0;
      while (p < re_.size() && re_[p] >= '0' && re_[p] <= '9') {
        v = std::min<int64_t>(v * 10 + (re_[p] - '0'), int64_t{1} << 40);
        ++p;
      }
      if (p == begin) return std::nullopt;
      *out = static_cast<int>(std::min<int64_t>(v, int64_t{kMaxRegexRepeat} + 1));
      return true;
    };
    if (!number(min)) return false;
    *max = *min;
    if (p < re_.size() && re_[p] == ',') {
      ++p;
      *max = -1;
      if (p < re_.size() && re_[p] != '}' && !number(max)) return false;
    }
    if (p >= re_.size() || re_[p] != '}') return false;
    if (*min > kMaxRegexRepeat || *max > kMaxRegexRepeat) {
      return Error(absl::StrCat("repetition count above ", kMaxRegexRepeat));
    }
    if (*max >= 0 && *max < *min) return Error("repetition {m,n} with n < m");
    pos_ = p + 1;
    return true;
  }

  absl::StatusOr<bool> ParseQuantifier(int* min, int* max) {
    switch (Peek()) {
      case '*':
        *min = 0, *max = -1, ++pos_;
        return true;
      case '+':
        *min = 1, *max = -1, ++pos_;
        return true;
      case '?':
        *min = 0, *max = 1, ++pos_;
        return true;
      case '{':
        return ParseBraces(min, max);
      default:
        return false;
    }
  }

  absl::StatusOr<int> ParseQuantified(int depth) {
    int min = 0, max = 0;
    absl::StatusOr<bool> q = ParseQuantifier(&min, &max);
    if (!q.ok()) return q.status();
    if (*q) return Error("quantifier with nothing to repeat");
    absl::StatusOr<int> atom = ParseAtom(depth);
    if (!atom.ok()) return atom;
    q = ParseQuantifier(&min, &max);
    if (!q.ok()) return q.status();
    if (!*q) return atom;
    if (Peek() == '?') {
      ++pos_;  // lazy: same language
    } else if (Peek() == '+') {
      return Error("possessive quantifier");
    }
    absl::StatusOr<bool> again = ParseQuantifier(&min, &max);
    if (!again.ok()) return again.status();
    if (*again) return Error("quantifier with nothing to repeat");
    Node rep;
    rep.kind = Node::Kind::kRepeat;
    rep.children = {*atom};
    rep.min = min;
    rep.max = max;
    return AddNode(std::move(rep));
  }

  absl::StatusOr<int> ParseGroup(int depth) {
    ++pos_;  // '('
    if (Peek() == '?') {
      if (LookingAt("?:")) {
        pos_ += 2;
      } else if (LookingAt("?=") || LookingAt("?!") || LookingAt("?<=") || LookingAt("?<!")) {
        return Error("lookaround assertion");
      } else if (LookingAt("?<") || LookingAt("?P<")) {
        const size_t close = re_.find('>', pos_);
        if (close == std::string_view::npos) return Error("unterminated group name");
        pos_ = close + 1;
      } else if (LookingAt("?P=")) {
        return Error("backreference");
      } else {
        return Error("inline flags or an unknown group kind");
      }
    }
    absl::StatusOr<int> inner = ParseAlt(depth + 1);
    if (!inner.ok()) return inner;
    if (Peek() != ')' || AtEnd()) return Error("missing ')'");
    ++pos_;
    return inner;
  }

  // After a `\`: a class escape (\d …) as a set, or one code point.
  absl::StatusOr<CodepointSet> ParseEscape(bool in_class) {
    if (AtEnd()) return Error("trailing backslash");
    const char c = Peek();
    switch (c) {
      case 'd':
        ++pos_;
        return Digits();
      case 'D':
        ++pos_;
        return Digits().Complement();
      case 'w':
        ++pos_;
        return WordChars();
      case 'W':
        ++pos_;
        return WordChars().Complement();
      case 's':
        ++pos_;
        return SpaceChars();
      case 'S':
        ++pos_;
        return SpaceChars().Complement();
      case 'b':
        if (in_class) {
          ++pos_;
          return CodepointSet::Of(0x08);
        }
        return Error("word boundary assertion \\b");
      case 'B':
        return Error("word boundary assertion \\B");
      case 't':
        ++pos_;
        return CodepointSet::Of('\t');
      case 'n':
        ++pos_;
        return CodepointSet::Of('\n');
      case 'v':
        ++pos_;
        return CodepointSet::Of('\v');
      case 'f':
        ++pos_;
        return CodepointSet::Of('\f');
      case 'r':
        ++pos_;
        return CodepointSet::Of('\r');
      case '0':
        if (Peek(1) >= '0' && Peek(1) <= '9') return Error("octal escape");
        ++pos_;
        return CodepointSet::Of(0);
      case 'c': {
        const char l = Peek(1);
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) return Error("bad \\c escape");
        pos_ += 2;
        return CodepointSet::Of(static_cast<uint32_t>(l) % 32);
      }
      case 'x': {
        const int h = HexValue(Peek(1)), l = HexValue(Peek(2));
        if (h < 0 || l < 0) return Error("bad \\x escape");
        pos_ += 3;
        return CodepointSet::Of(static_cast<uint32_t>(h * 16 + l));
      }
      case 'u': {
        absl::StatusOr<uint32_t> cp = ParseUnicodeEscape();
        if (!cp.ok()) return cp.status();
        return CodepointSet::Of(*cp);
      }
      case 'k':
        return Error("backreference");
      case 'p':
      case 'P':
        return Error("unicode property escape");
      default:
        break;
    }
    if (c >= '1' && c <= '9') return Error("backreference");
    absl::StatusOr<uint32_t> cp = NextCodepoint();
    if (!cp.ok()) return cp.status();
    if (IsAsciiAlnum(*cp) || *cp == '_') {
      --pos_;
      return Error(absl::StrCat("unknown escape \\", std::string(1, c)));
    }
    return CodepointSet::Of(*cp);
  }

  // At "u" of \uHHHH, \uHHHH\uHHHH (surrogate pair) or \u{H…}.
  absl::StatusOr<uint32_t> ParseUnicodeEscape() {
    if (Peek(1) == '{') {
      size_t p = pos_ + 2;
      uint32_t cp = 0;
      while (p < re_.size() && HexValue(re_[p]) >= 0 && cp <= CodepointSet::kMax) {
        cp = cp * 16 + static_cast<uint32_t>(HexValue(re_[p++]));
      }
      if (p >= re_.size() || re_[p] != '}' || p == pos_ + 2 || cp > CodepointSet::kMax) {
        return Error("bad \\u{…} escape");
      }
      pos_ = p + 1;
      if (cp >= 0xD800 && cp <= 0xDFFF) return Error("lone surrogate");
      return cp;
    }
    auto hex4 = [&](size_t at) -> int {
      int v = 0;
      for (size_t i = 0; i < 4; ++i) {
        const int h = at + i < re_.size() ? HexValue(re_[at + i]) : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
      }
      return v;
    };
    const int hi = hex4(pos_ + 1);
    if (hi < 0) return Error("bad \\u escape");
    pos_ += 5;
    if (hi >= 0xD800 && hi <= 0xDBFF && LookingAt("\\u")) {
      const int lo = hex4(pos_ + 2);
      if (lo >= 0xDC00 && lo <= 0xDFFF) {
        pos_ += 6;
        return 0x10000 + ((static_cast<uint32_t>(hi) - 0xD800) << 10) +
               (static_cast<uint32_t>(lo) - 0xDC00);
      }
    }
    if (hi >= 0xD800 && hi <= 0xDFFF) return Error("lone surrogate");
    return static_cast<uint32_t>(hi);
  }

  // One class member: a single code point (*single set) or a class escape.
  absl::StatusOr<CodepointSet> ParseClassAtom(bool* single) {
    if (Peek() == '\\') {
      ++pos_;
      const char c = Peek();
      absl::StatusOr<CodepointSet> s =
          c == '-' ? (++pos_, CodepointSet::Of('-')) : ParseEscape(/*in_class=*/true);
      *single = s.ok() && std::string_view("dDwWsS").find(c) == std::string_view::npos;
      return s;
    }
    absl::StatusOr<uint32_t> cp = NextCodepoint();
    if (!cp.ok()) return cp.status();
    *single = true;
    return CodepointSet::Of(*cp);
  }

  absl::StatusOr<int> ParseClass() {
    ++pos_;  // '['
    bool negate = false;
    if (Peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodepointSet set;
    while (true) {
      if (AtEnd()) return Error("missing ']'");
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      bool single_lo = false;
      absl::StatusOr<CodepointSet> lo = ParseClassAtom(&single_lo);
      if (!lo.ok()) return lo.status();
      if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < re_.size()) {
        const size_t dash = pos_;
        ++pos_;
        bool single_hi = false;
        absl::StatusOr<CodepointSet> hi = ParseClassAtom(&single_hi);
        if (!hi.ok()) return hi.status();
        if (single_lo && single_hi) {
          const uint32_t a = lo->ranges()[0].first, b = hi->ranges()[0].first;
          if (a > b) {
            pos_ = dash;
            return Error("class range out of order");
          }
          set.Add(a, b);
        } else {  // a class escape next to '-': the dash is literal
          set.AddSet(*lo);
          set.Add('-', '-');
          set.AddSet(*hi);
        }
        continue;
      }
      set.AddSet(*lo);
    }
    if (negate) set = set.Complement();
    if (set.empty()) return Error("character class matches nothing");
    return AddSet(std::move(set));
  }

  absl::StatusOr<int> ParseAtom(int depth) {
    const char c = Peek();
    switch (c) {
      case '(':
        return ParseGroup(depth);
      case '[':
        return ParseClass();
      case '.':
        ++pos_;
        return AddSet(DotChars());
      case '\\': {
        ++pos_;
        absl::StatusOr<CodepointSet> s = ParseEscape(/*in_class=*/false);
        if (!s.ok()) return s.status();
        return AddSet(*std::move(s));
      }
      default:
        break;
    }
    absl::StatusOr<uint32_t> cp = NextCodepoint();
    if (!cp.ok()) return cp.status();
    return AddSet(CodepointSet::Of(*cp));
  }

  std::string_view re_;
  size_t pos_ = 0;
  std::vector<Node> nodes_;
};

// Writes the parsed regex as GBNF.
class RegexRenderer {
 public:
  RegexRenderer(const std::vector<Node>& nodes, RegexText text, std::string_view hint,
                GbnfRules* rules, uint32_t avoid)
      : nodes_(nodes), text_(text), hint_(hint), rules_(rules), avoid_(avoid) {}

  // Set by Render when a class lost its last member to `avoid`.
  bool impossible() const { return impossible_; }

  std::string Render(int id) const {
    const Node& n = nodes_[id];
    switch (n.kind) {
      case Node::Kind::kEmpty:
        return "\"\"";
      case Node::Kind::kSet:
        return RenderSet(n.set);
      case Node::Kind::kConcat: {
        std::string out;
        std::string pending;  // text of single code points in a row, one literal
        auto flush = [&] {
          if (pending.empty()) return;
          if (!out.empty()) out.push_back(' ');
          out += Literal(pending);
          pending.clear();
        };
        for (int child : n.children) {
          const Node& c = nodes_[child];
          if (c.kind == Node::Kind::kSet && c.set.ranges().size() == 1 &&
              c.set.ranges()[0].first == c.set.ranges()[0].second &&
              (avoid_ == 0 || c.set.ranges()[0].first != avoid_ ||
               text_ == RegexText::kJsonStringContent)) {
            AppendText(c.set.ranges()[0].first, &pending);
            continue;
          }
          flush();
          if (!out.empty()) out.push_back(' ');
          out += Render(child);
        }
        flush();
        return out;
      }
      case Node::Kind::kAlt: {
        std::string out = "(";
        for (size_t i = 0; i < n.children.size(); ++i) {
          absl::StrAppend(&out, i ? " | " : " ", Render(n.children[i]));
        }
        return out + " )";
      }
      case Node::Kind::kRepeat: {
        if (n.max == 0) return "\"\"";
        const std::string inner = absl::StrCat("( ", Render(n.children[0]), " )");
        if (n.min == 0 && n.max == -1) return inner + "*";
        if (n.min == 1 && n.max == -1) return inner + "+";
        if (n.min == 0 && n.max == 1) return inner + "?";
        if (n.max == -1) return absl::StrCat(inner, "{", n.min, ",}");
        if (n.min == n.max) return absl::StrCat(inner, "{", n.min, "}");
        return absl::StrCat(inner, "{", n.min, ",", n.max, "}");
      }
    }
    return "\"\"";
  }

 private:
  // Appends code point `cp` as it is written in the output text.
  void AppendText(uint32_t cp, std::string* out) const {
    if (text_ == RegexText::kJsonStringContent) {
      if (avoid_ != 0 && cp == avoid_) {
        absl::StrAppendFormat(out, "\\u%04x", cp);
        return;
      }
      switch (cp) {
        case '"':
          *out += "\\\"";
          return;
        case '\\':
          *out += "\\\\";
          return;
        case 0x08:
          *out += "\\b";
          return;
        case 0x09:
          *out += "\\t";
          return;
        case 0x0A:
          *out += "\\n";
          return;
        case 0x0C:
          *out += "\\f";
          return;
        case 0x0D:
          *out += "\\r";
          return;
        default:
          if (cp < 0x20) {
            absl::StrAppendFormat(out, "\\u%04x", cp);
            return;
          }
      }
    }
    utf8::Append(cp, out);
  }

  static std::string Literal(std::string_view text) {
    absl::StatusOr<std::string> lit = GbnfLiteral(text);
    return lit.ok() ? *lit : "\"\"";  // the text is built from scalar values: always valid
  }

  std::string RenderSet(const CodepointSet& set) const {
    if (text_ == RegexText::kRaw) {
      if (avoid_ == 0) return GbnfClass(set);
      const CodepointSet kept = set.Minus(CodepointSet::Of(avoid_));
      if (kept.empty()) {
        impossible_ = true;
        return "\"\"";
      }
      return GbnfClass(kept);
    }
    CodepointSet special = CodepointSet::Range(0, 0x1F);
    special.Add('"', '"');
    special.Add('\\', '\\');
    if (avoid_ != 0) special.Add(avoid_, avoid_);
    const CodepointSet plain = set.Minus(special);
    const CodepointSet escaped = set.Intersect(special);
    if (escaped.empty()) return GbnfClass(plain);
    std::vector<std::string> alts;
    if (!plain.empty()) alts.push_back(GbnfClass(plain));
    for (const auto& [lo, hi] : escaped.ranges()) {
      for (uint32_t cp = lo; cp <= hi; ++cp) {
        std::string text;
        AppendText(cp, &text);
        alts.push_back(Literal(text));
      }
    }
    if (alts.size() == 1) return alts[0];
    std::string body;
    for (size_t i = 0; i < alts.size(); ++i) absl::StrAppend(&body, i ? " | " : "", alts[i]);
    return rules_->Add(absl::StrCat(AV(hint_), "-char"), std::move(body));
  }

  const std::vector<Node>& nodes_;
  RegexText text_;
  std::string_view hint_;
  GbnfRules* rules_;
  uint32_t avoid_;
  mutable bool impossible_ = false;
};

}  // namespace

absl::StatusOr<std::string> RegexToGbnfExpr(std::string_view regex, RegexText text,
                                            std::string_view rule_hint, GbnfRules* rules,
                                            uint32_t avoid) {
  RegexParser parser(regex);
  absl::StatusOr<int> root = parser.Parse();
  if (!root.ok()) return root.status();
  RegexRenderer renderer(parser.nodes(), text, rule_hint, rules, avoid);
  std::string expr = renderer.Render(*root);
  if (renderer.impossible()) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex \"", AV(regex), "\": a class holds only U+",
                     absl::StrFormat("%04X", avoid), ", which this text cannot contain"));
  }
  return expr;
}

absl::StatusOr<std::string> RegexToGbnf(std::string_view regex) {
  GbnfRules rules;
  const std::string root = rules.Reserve("root");
  absl::StatusOr<std::string> expr = RegexToGbnfExpr(regex, RegexText::kRaw, "re", &rules);
  if (!expr.ok()) return expr.status();
  rules.Define(root, *std::move(expr));
  return rules.Render();
}

absl::StatusOr<std::string> ChoiceToGbnf(const std::vector<std::string>& choices) {
  if (choices.empty()) return absl::InvalidArgumentError("guided_choice: the list is empty");
  std::string body;
  for (size_t i = 0; i < choices.size(); ++i) {
    absl::StatusOr<std::string> lit = GbnfLiteral(choices[i]);
    if (!lit.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("guided_choice[", i, "]: ", lit.status().message()));
    }
    absl::StrAppend(&body, i ? " | " : "", *lit);
    if (body.size() > kMaxGbnfBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("guided_choice: the grammar would exceed ", kMaxGbnfBytes, " bytes"));
    }
  }
  GbnfRules rules;
  rules.Add("root", std::move(body));
  return rules.Render();
}

}  // namespace ss::grammar
