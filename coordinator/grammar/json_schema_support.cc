#include "coordinator/grammar/json_schema_support.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "coordinator/grammar/json_schema_gbnf.h"

namespace ss::grammar::json_schema {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "#" + pointer, as error messages name a place.
std::string Where(absl::string_view pointer) {
  return pointer.empty() ? "#" : absl::StrCat("#", pointer);
}

// A non-negative integer keyword (minLength …): -1 when absent.
absl::StatusOr<int64_t> CountKeyword(const Json& s, absl::string_view key, absl::string_view ptr) {
  auto it = s.find(key);
  if (it == s.end()) return -1;
  if (!MatchesType(*it, "integer") || it->get<double>() < 0) {
    return Invalid(PointerJoin(ptr, key), "expected a non-negative integer");
  }
  const double d = it->get<double>();
  return d > 1e15 ? int64_t{1000000000000000} : static_cast<int64_t>(d);
}

}  // namespace

bool Unsupported(absl::string_view key, const Json& value) {
  if (key == "uniqueItems" && value == false) return false;
  if (key == "minProperties" && value == 0) return false;
  return std::find(std::begin(kUnsupported), std::end(kUnsupported), key) != std::end(kUnsupported);
}

std::string PointerJoin(absl::string_view pointer, absl::string_view key) {
  return absl::StrCat(pointer, "/", absl::StrReplaceAll(key, {{"~", "~0"}, {"/", "~1"}}));
}

absl::Status Invalid(absl::string_view pointer, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("JSON schema at ", Where(pointer), ": ", what));
}

bool MatchesType(const Json& v, absl::string_view type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "string") return v.is_string();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    return std::isfinite(d) && d == std::floor(d);
  }
  return false;
}

absl::StatusOr<std::pair<const Json*, std::string>> ResolveRef(const Json& doc,
                                                               absl::string_view ref,
                                                               absl::string_view where) {
  if (!absl::StartsWith(ref, "#")) {
    return Invalid(where,
                   absl::StrCat("$ref \"", ref, "\": only local refs (\"#…\") are supported"));
  }
  std::string fragment;
  for (size_t i = 1; i < ref.size(); ++i) {
    if (ref[i] == '%' && i + 2 < ref.size() && HexDigit(ref[i + 1]) >= 0 &&
        HexDigit(ref[i + 2]) >= 0) {
      fragment.push_back(static_cast<char>(HexDigit(ref[i + 1]) * 16 + HexDigit(ref[i + 2])));
      i += 2;
    } else {
      fragment.push_back(ref[i]);
    }
  }
  if (!fragment.empty() && fragment[0] != '/') {
    return Invalid(where, absl::StrCat("$ref \"", ref, "\": not a JSON pointer"));
  }
  const Json* node = &doc;
  std::string pointer;
  size_t pos = 0;
  while (pos < fragment.size()) {
    const size_t next = std::min(fragment.find('/', pos + 1), fragment.size());
    std::string token =
        absl::StrReplaceAll(fragment.substr(pos + 1, next - pos - 1), {{"~1", "/"}, {"~0", "~"}});
    pos = next;
    pointer = PointerJoin(pointer, token);
    if (node->is_object()) {
      auto it = node->find(token);
      if (it == node->end()) {
        return Invalid(where, absl::StrCat("$ref \"", ref, "\" does not resolve"));
      }
      node = &*it;
    } else if (node->is_array() && !token.empty() &&
               token.find_first_not_of("0123456789") == std::string::npos && token.size() < 10 &&
               std::stoul(token) < node->size()) {
      node = &(*node)[std::stoul(token)];
    } else {
      return Invalid(where, absl::StrCat("$ref \"", ref, "\" does not resolve"));
    }
  }
  return std::make_pair(node, pointer);
}

std::string Alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  return absl::StrCat("( ", absl::StrJoin(alts, " | "), " )");
}

std::string Repeat(absl::string_view x, int64_t min, int64_t max) {
  if (max == 0) return "\"\"";
  const std::string g = absl::StrCat("( ", x, " )");
  if (max < 0) {
    if (min == 0) return g + "*";
    if (min == 1) return g + "+";
    return absl::StrCat(g, "{", min, ",}");
  }
  if (min == 0 && max == 1) return g + "?";
  if (min == max) return min == 1 ? std::string(x) : absl::StrCat(g, "{", min, "}");
  return absl::StrCat(g, "{", min, ",", max, "}");
}

absl::Status RepeatBounds(const Json& s, absl::string_view min_key, absl::string_view max_key,
                          absl::string_view ptr, int64_t* min, int64_t* max) {
  absl::StatusOr<int64_t> lo = CountKeyword(s, min_key, ptr);
  if (!lo.ok()) return lo.status();
  absl::StatusOr<int64_t> hi = CountKeyword(s, max_key, ptr);
  if (!hi.ok()) return hi.status();
  *min = std::max<int64_t>(*lo, 0);
  *max = *hi;
  if (*max >= 0 && *max < *min) {
    return Invalid(ptr, absl::StrCat(max_key, " is below ", min_key, ": nothing is valid"));
  }
  if (*min > kMaxJsonRepeat) {
    return Invalid(PointerJoin(ptr, min_key), absl::StrCat("above the supported ", kMaxJsonRepeat));
  }
  if (*max > kMaxJsonRepeat) *max = kMaxJsonRepeat;
  return absl::OkStatus();
}

}  // namespace ss::grammar::json_schema
