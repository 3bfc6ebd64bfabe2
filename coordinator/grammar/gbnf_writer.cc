#include "coordinator/grammar/gbnf_writer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/utf8.h"

namespace ss::grammar {
namespace {

constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

uint32_t DecodeAt(const unsigned char* p, size_t len) {
  if (len == 1) return p[0];
  uint32_t cp = p[0] & (0xFF >> (len + 1));
  for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (p[i] & 0x3F);
  return cp;
}

void AppendClassMember(uint32_t cp, std::string* out) {
  const bool plain = cp >= 0x20 && cp < 0x7F &&
                     std::string_view("[]\\^-\"").find(static_cast<char>(cp)) == std::string::npos;
  if (plain) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x100) {
    absl::StrAppendFormat(out, "\\x%02X", cp);
  } else if (cp < 0x10000) {
    absl::StrAppendFormat(out, "\\u%04X", cp);
  } else {
    absl::StrAppendFormat(out, "\\U%08X", cp);
  }
}

}  // namespace

absl::StatusOr<std::string> GbnfLiteral(std::string_view utf8) {
  std::string out = "\"";
  const auto* p = reinterpret_cast<const unsigned char*>(utf8.data());
  size_t i = 0;
  while (i < utf8.size()) {
    const utf8::Step step = utf8::Next(p + i, utf8.size() - i);
    if (step.kind != utf8::Kind::kChar) {
      return absl::InvalidArgumentError(
          absl::StrCat("not valid UTF-8 at byte ", i, " of a literal"));
    }
    const uint32_t cp = DecodeAt(p + i, step.len);
    if (cp == '"' || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x20 || cp == 0x7F) {
      absl::StrAppendFormat(&out, "\\x%02X", cp);
    } else {
      out.append(utf8.substr(i, step.len));
    }
    i += step.len;
  }
  out.push_back('"');
  return out;
}

CodepointSet CodepointSet::Range(uint32_t lo, uint32_t hi) {
  CodepointSet s;
  s.Add(lo, hi);
  return s;
}

void CodepointSet::Add(uint32_t lo, uint32_t hi) {
  hi = std::min(hi, kMax);
  if (lo > hi) return;
  if (lo <= kSurrogateHi && hi >= kSurrogateLo) {  // split around the surrogates
    if (lo < kSurrogateLo) Add(lo, kSurrogateLo - 1);
    if (hi > kSurrogateHi) Add(kSurrogateHi + 1, hi);
    return;
  }
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  merged.reserve(ranges_.size() + 1);
  bool placed = false;
  for (const auto& r : ranges_) {
    if (r.second + 1 < lo) {
      merged.push_back(r);
    } else if (hi + 1 < r.first) {
      if (!placed) merged.emplace_back(lo, hi);
      placed = true;
      merged.push_back(r);
    } else {
      lo = std::min(lo, r.first);
      hi = std::max(hi, r.second);
    }
  }
  if (!placed) merged.emplace_back(lo, hi);
  ranges_ = std::move(merged);
}

void CodepointSet::AddSet(const CodepointSet& other) {
  for (const auto& r : other.ranges_) Add(r.first, r.second);
}

CodepointSet CodepointSet::Complement() const {
  CodepointSet out;
  uint32_t next = 0;
  for (const auto& r : ranges_) {
    if (r.first > next) out.Add(next, r.first - 1);
    next = r.second + 1;
  }
  if (next <= kMax) out.Add(next, kMax);
  return out;
}

CodepointSet CodepointSet::Intersect(const CodepointSet& other) const {
  CodepointSet out;
  size_t i = 0, j = 0;
  while (i < ranges_.size() && j < other.ranges_.size()) {
    const uint32_t lo = std::max(ranges_[i].first, other.ranges_[j].first);
    const uint32_t hi = std::min(ranges_[i].second, other.ranges_[j].second);
    if (lo <= hi) out.ranges_.emplace_back(lo, hi);
    if (ranges_[i].second < other.ranges_[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

bool CodepointSet::Contains(uint32_t cp) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(cp, kMax + 1));
  return it != ranges_.begin() && std::prev(it)->second >= cp;
}

std::string GbnfClass(const CodepointSet& set) {
  std::string out = "[";
  for (const auto& [lo, hi] : set.ranges()) {
    AppendClassMember(lo, &out);
    if (hi == lo) continue;
    if (hi > lo + 1) out.push_back('-');
    AppendClassMember(hi, &out);
  }
  out.push_back(']');
  return out;
}

std::string SanitizeRuleName(std::string_view hint) {
  std::string out;
  out.reserve(std::min<size_t>(hint.size(), 64));
  for (char c : hint.substr(0, 64)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    out.push_back(ok ? c : '-');
  }
  return out.empty() ? "r" : out;
}

std::string GbnfRules::FreshName(std::string_view hint) {
  const std::string base = SanitizeRuleName(hint);
  if (!index_.contains(base)) return base;
  size_t& next = next_suffix_[base];
  while (true) {
    std::string name = absl::StrCat(base, "-", ++next);
    if (!index_.contains(name)) return name;
  }
}

std::string GbnfRules::Add(std::string_view hint, std::string body) {
  std::string key = absl::StrCat(SanitizeRuleName(hint), "\n", body);
  if (auto it = shared_.find(key); it != shared_.end()) return it->second;
  std::string name = Reserve(hint);
  Define(name, std::move(body));
  shared_.emplace(std::move(key), name);
  return name;
}

std::string GbnfRules::Reserve(std::string_view hint) {
  std::string name = FreshName(hint);
  index_.emplace(name, rules_.size());
  rules_.push_back(Rule{name, "", false});
  return name;
}

void GbnfRules::Define(const std::string& name, std::string body) {
  auto it = index_.find(name);
  if (it == index_.end()) return;
  Rule& r = rules_[it->second];
  bytes_ += name.size() + body.size() + 6;
  r.body = std::move(body);
  r.defined = true;
}

absl::Status GbnfRules::status() const {
  if (bytes_ > kMaxGbnfBytes || rules_.size() > static_cast<size_t>(kMaxRules)) {
    return absl::ResourceExhaustedError(absl::StrCat("the grammar would exceed ", kMaxGbnfBytes,
                                                     " bytes or ", kMaxRules, " rules"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> GbnfRules::Render() const {
  if (absl::Status s = status(); !s.ok()) return s;
  std::string out;
  out.reserve(bytes_);
  for (const Rule& r : rules_) {
    if (!r.defined) return absl::InternalError(absl::StrCat("rule ", r.name, " never defined"));
    absl::StrAppend(&out, r.name, " ::= ", r.body, "\n");
  }
  return out;
}

}  // namespace ss::grammar
