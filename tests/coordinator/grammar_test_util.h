// Test helpers for the GBNF converters: a byte-level vocabulary, whole-text acceptance through
// the grammar matcher, random sentences from a grammar, and a small JSON Schema validator for
// the keywords the converters support (with the spec's meaning, e.g. unanchored `pattern` and
// open objects when additionalProperties is absent) to check sentences against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/grammar/compiled_grammar.h"
#include "coordinator/grammar/grammar_matcher.h"
#include "coordinator/grammar/token_vocab.h"
#include "nlohmann/json.hpp"

namespace ss::grammar::testing {

// Ids 0..255: one byte each; kDsmlId: the added token ｜DSML｜; kEosId: the stop token.
inline constexpr int32_t kDsmlId = 256;
inline constexpr int32_t kEosId = 257;

inline std::shared_ptr<const TokenVocab> ByteVocab() {
  static const std::shared_ptr<const TokenVocab> vocab = [] {
    auto v = std::make_shared<TokenVocab>();
    for (int b = 0; b < 256; ++b) {
      v->bytes.push_back(std::string(1, static_cast<char>(b)));
      v->kind.push_back(TokenVocab::Kind::kNormal);
    }
    v->bytes.push_back("｜DSML｜");
    v->kind.push_back(TokenVocab::Kind::kAdded);
    v->bytes.push_back("<｜end▁of▁sentence｜>");
    v->kind.push_back(TokenVocab::Kind::kAdded);
    v->stop_ids = {kEosId};
    return v;
  }();
  return vocab;
}

inline std::shared_ptr<const CompiledGrammar> Compile(const std::string& gbnf) {
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = CompileGrammar(gbnf, ByteVocab());
  return g.ok() ? *g : nullptr;
}

// Feeds `text` (its "｜DSML｜" texts as the added token) and asks whether the root is complete.
inline bool Accepts(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  constexpr std::string_view kDsml = "｜DSML｜";
  while (true) {
    const size_t at = text.find(kDsml);
    if (!m.AcceptString(text.substr(0, at))) return false;
    if (at == std::string_view::npos) break;
    if (!m.AcceptToken(kDsmlId)) return false;
    text.remove_prefix(at + kDsml.size());
  }
  return m.CanTerminate();
}

// A random sentence: at each step one allowed token, often one that closes something (stop,
// `"`, `}`, `]`, or `<` `/` ｜DSML｜ towards a DSML closing tag) so that walks end; std::nullopt
// when no end was reached within `max_steps`.
inline std::optional<std::string> RandomSentence(const std::shared_ptr<const CompiledGrammar>& g,
                                                 std::mt19937* rng, int max_steps = 4000) {
  GrammarMatcher m(g);
  std::string out;
  std::vector<uint32_t> mask(static_cast<size_t>(g->bitmask_words()));
  std::uniform_real_distribution<double> coin(0, 1);
  auto pick_from = [&](const std::vector<int32_t>& ids) {
    return ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(*rng)];
  };
  for (int step = 0; step < max_steps; ++step) {
    std::fill(mask.begin(), mask.end(), 0);
    m.FillNextTokenBitmask(mask);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < g->vocab().size(); ++id) {
      if (id != kEosId && ((mask[id / 32] >> (id % 32)) & 1)) allowed.push_back(id);
    }
    if (m.CanTerminate() && (allowed.empty() || coin(*rng) < 0.4)) return out;
    if (allowed.empty()) return std::nullopt;
    auto is_allowed = [&](int32_t id) {
      return std::find(allowed.begin(), allowed.end(), id) != allowed.end();
    };
    int32_t pick = -1;
    if (coin(*rng) < 0.3) {
      if (out.ends_with("</") && is_allowed(kDsmlId)) {
        pick = kDsmlId;
      } else if (out.ends_with("<") && is_allowed('/')) {
        pick = '/';
      } else {
        std::vector<int32_t> closers;
        for (int32_t id : {'"', '}', ']', '<'}) {
          if (is_allowed(id)) closers.push_back(id);
        }
        if (!closers.empty()) pick = pick_from(closers);
      }
    }
    if (pick < 0) pick = pick_from(allowed);
    if (!m.AcceptToken(pick)) return std::nullopt;
    out += pick == kDsmlId ? std::string("｜DSML｜") : g->vocab().bytes[pick];
  }
  return std::nullopt;
}

// No whitespace outside JSON strings.
inline bool Compact(std::string_view json) {
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      return false;
    }
  }
  return true;
}

// A random schema of the supported keywords, `depth` levels at most.
inline nlohmann::ordered_json RandomSchema(std::mt19937* rng, int depth) {
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(*rng); };
  const int kind = depth <= 0 ? pick(6) : pick(11);
  nlohmann::ordered_json s = nlohmann::ordered_json::object();
  switch (kind) {
    case 0: {
      s["type"] = "string";
      const int v = pick(5);
      if (v == 1) s["maxLength"] = pick(4);
      if (v == 2) s["minLength"] = 1 + pick(3);
      if (v == 3)
        s["pattern"] = std::vector<const char*>{"^[a-c]{1,3}$", "^x|y\\d$", "ab?"}[pick(3)];
      if (v == 4)
        s["format"] = std::vector<const char*>{"date", "time", "date-time", "uuid"}[pick(4)];
      break;
    }
    case 1:
      s["type"] = "integer";
      if (pick(2)) s["minimum"] = pick(50) - 25;
      if (pick(2)) s["exclusiveMaximum"] = pick(50) + 26;
      break;
    case 2:
      s["type"] = "number";
      if (pick(2)) s["minimum"] = pick(3) - 1;
      if (pick(2)) s["maximum"] = pick(3) + 2;
      break;
    case 3:
      s["type"] = std::vector<const char*>{"boolean", "null"}[pick(2)];
      break;
    case 4:
      s["enum"] =
          nlohmann::ordered_json::array({"a", 1, nullptr, nlohmann::ordered_json::array({true})});
      break;
    case 5:
      s["const"] = std::vector<const char*>{"k", "q\"x", "ü"}[pick(3)];
      break;
    case 6:
    case 7: {
      s["type"] = "object";
      nlohmann::ordered_json props = nlohmann::ordered_json::object();
      nlohmann::ordered_json required = nlohmann::ordered_json::array();
      const int n = pick(5);
      for (int i = 0; i < n; ++i) {
        const std::string name = std::string(1, static_cast<char>('a' + pick(6)));
        if (props.contains(name)) continue;
        props[name] = RandomSchema(rng, depth - 1);
        if (pick(2)) required.push_back(name);
      }
      s["properties"] = props;
      s["required"] = required;
      const int add = pick(4);
      if (add == 1) s["additionalProperties"] = false;
      if (add == 2) s["additionalProperties"] = true;
      if (add == 3) s["additionalProperties"] = RandomSchema(rng, 0);
      break;
    }
    case 8:
      s["type"] = "array";
      if (pick(2)) {
        s["prefixItems"] =
            nlohmann::ordered_json::array({RandomSchema(rng, depth - 1), RandomSchema(rng, 0)});
        if (pick(2)) s["items"] = false;
      } else {
        s["items"] = RandomSchema(rng, depth - 1);
      }
      if (pick(2)) s["minItems"] = pick(3);
      if (pick(2)) s["maxItems"] = 2 + pick(3);
      break;
    case 9:
      s["anyOf"] = nlohmann::ordered_json::array(
          {RandomSchema(rng, depth - 1), RandomSchema(rng, depth - 1)});
      break;
    default:
      s = RandomSchema(rng, depth - 1);
      if (s.contains("type") && s["type"].is_string() && s["type"] != "null") {
        s["type"] = nlohmann::ordered_json::array({s["type"], "null"});
      }
      break;
  }
  return s;
}

// --- A JSON Schema validator for the converters' keywords (tests only; recursion unbounded). ---

inline size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline bool ValidDate(const std::string& s) {
  static const std::regex re("^(\\d{4})-(\\d{2})-(\\d{2})$");
  std::smatch m;
  if (!std::regex_match(s, m, re)) return false;
  const int y = std::stoi(m[1]), mo = std::stoi(m[2]), d = std::stoi(m[3]);
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return y >= 1 && mo >= 1 && mo <= 12 && d >= 1 && d <= days[mo - 1];
}

inline bool ValidTime(const std::string& s) {
  static const std::regex re(
      "^([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([zZ]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$");
  return std::regex_match(s, re);
}

class MiniValidator {
 public:
  explicit MiniValidator(const nlohmann::ordered_json& doc) : doc_(doc) {}

  bool Valid(const nlohmann::json& v) const { return Check(doc_, v); }

 private:
  using OJ = nlohmann::ordered_json;

  const OJ* Resolve(const std::string& ref) const {
    if (ref == "#") return &doc_;
    return &doc_.at(OJ::json_pointer(ref.substr(1)));
  }

  static bool IsType(const nlohmann::json& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "string") return v.is_string();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "number") return v.is_number();
    if (t == "integer") {
      return v.is_number_integer() ||
             (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
    }
    return false;
  }

  bool Check(const OJ& s, const nlohmann::json& v) const {
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("$ref")) {
      if (!Check(*Resolve(s["$ref"].get<std::string>()), v)) return false;
    }
    if (s.contains("nullable") && s["nullable"] == true && v.is_null()) return true;
    if (s.contains("type")) {
      bool ok = false;
      if (s["type"].is_string()) {
        ok = IsType(v, s["type"]);
      } else {
        for (const auto& t : s["type"]) ok = ok || IsType(v, t);
      }
      if (!ok) return false;
    }
    if (s.contains("const") && nlohmann::json(s["const"]) != v) return false;
    if (s.contains("enum")) {
      bool ok = false;
      for (const auto& e : s["enum"]) ok = ok || nlohmann::json(e) == v;
      if (!ok) return false;
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      int n = 0;
      for (const auto& b : s[k]) n += Check(b, v);
      if (n == 0 || (std::string(k) == "oneOf" && n != 1)) return false;
    }
    if (s.contains("allOf")) {
      for (const auto& b : s["allOf"]) {
        if (!Check(b, v)) return false;
      }
    }
    if (v.is_string()) {
      const std::string& str = v.get_ref<const std::string&>();
      if (s.contains("minLength") && CodePoints(str) < s["minLength"].get<size_t>()) return false;
      if (s.contains("maxLength") && CodePoints(str) > s["maxLength"].get<size_t>()) return false;
      if (s.contains("pattern") &&
          !std::regex_search(str, std::regex(s["pattern"].get<std::string>()))) {
        return false;
      }
      if (s.contains("format")) {
        const std::string f = s["format"];
        if (f == "date" && !ValidDate(str)) return false;
        if (f == "time" && !ValidTime(str)) return false;
        if (f == "date-time") {
          const size_t t = str.find_first_of("Tt");
          if (t == std::string::npos || !ValidDate(str.substr(0, t)) ||
              !ValidTime(str.substr(t + 1))) {
            return false;
          }
        }
        if (f == "uuid" &&
            !std::regex_match(str,
                              std::regex("^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$"))) {
          return false;
        }
      }
    }
    if (v.is_number()) {
      const double d = v.get<double>();
      if (s.contains("minimum") && s["minimum"].is_number() && d < s["minimum"].get<double>()) {
        return false;
      }
      if (s.contains("maximum") && s["maximum"].is_number() && d > s["maximum"].get<double>()) {
        return false;
      }
      if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() &&
          d <= s["exclusiveMinimum"].get<double>()) {
        return false;
      }
      if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() &&
          d >= s["exclusiveMaximum"].get<double>()) {
        return false;
      }
    }
    if (v.is_object()) {
      if (s.contains("required")) {
        for (const auto& r : s["required"]) {
          if (!v.contains(r.get<std::string>())) return false;
        }
      }
      for (const auto& [k, item] : v.items()) {
        if (s.contains("properties") && s["properties"].contains(k)) {
          if (!Check(s["properties"][k], item)) return false;
        } else if (s.contains("additionalProperties")) {
          if (!Check(s["additionalProperties"], item)) return false;
        }
      }
    }
    if (v.is_array()) {
      size_t i = 0;
      if (s.contains("prefixItems")) {
        for (; i < v.size() && i < s["prefixItems"].size(); ++i) {
          if (!Check(s["prefixItems"][i], v[i])) return false;
        }
      }
      if (s.contains("items")) {
        for (; i < v.size(); ++i) {
          if (!Check(s["items"], v[i])) return false;
        }
      }
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    }
    return true;
  }

  OJ doc_;
};

}  // namespace ss::grammar::testing
