#include "coordinator/grammar/json_schema_gbnf.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "coordinator/grammar/number_range_gbnf.h"
#include "coordinator/grammar/regex_gbnf.h"
#include "coordinator/utf8.h"

namespace ss::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr absl::string_view kAnnotations[] = {
    "title",    "description", "examples",      "default",         "$schema",         "$id",
    "$anchor",  "$comment",    "$defs",         "definitions",     "strict",          "deprecated",
    "readOnly", "writeOnly",   "discriminator", "contentEncoding", "contentMediaType"};
// Keywords that constrain and that this converter does not implement.
constexpr absl::string_view kUnsupported[] = {"multipleOf",
                                              "uniqueItems",
                                              "patternProperties",
                                              "propertyNames",
                                              "not",
                                              "if",
                                              "then",
                                              "else",
                                              "dependentRequired",
                                              "dependentSchemas",
                                              "dependencies",
                                              "minProperties",
                                              "maxProperties",
                                              "contains",
                                              "minContains",
                                              "maxContains",
                                              "unevaluatedProperties",
                                              "unevaluatedItems",
                                              "$dynamicRef",
                                              "$recursiveRef"};
// Keywords that constrain and that this converter implements.
constexpr absl::string_view kConstraining[] = {"type",
                                               "enum",
                                               "const",
                                               "anyOf",
                                               "oneOf",
                                               "allOf",
                                               "$ref",
                                               "nullable",
                                               "properties",
                                               "required",
                                               "additionalProperties",
                                               "items",
                                               "prefixItems",
                                               "additionalItems",
                                               "minItems",
                                               "maxItems",
                                               "minLength",
                                               "maxLength",
                                               "pattern",
                                               "format",
                                               "minimum",
                                               "maximum",
                                               "exclusiveMinimum",
                                               "exclusiveMaximum"};
constexpr absl::string_view kObjectKeywords[] = {"properties", "required", "additionalProperties"};
constexpr absl::string_view kArrayKeywords[] = {"items", "prefixItems", "additionalItems",
                                                "minItems", "maxItems"};
constexpr absl::string_view kStringKeywords[] = {"minLength", "maxLength", "pattern", "format"};
constexpr absl::string_view kBoundKeywords[] = {"minimum", "maximum", "exclusiveMinimum",
                                                "exclusiveMaximum"};

template <size_t N>
bool In(absl::string_view key, const absl::string_view (&list)[N]) {
  return std::find(std::begin(list), std::end(list), key) != std::end(list);
}

// A keyword this converter refuses (one whose value here does not constrain is fine).
bool Unsupported(absl::string_view key, const nlohmann::ordered_json& value) {
  if (key == "uniqueItems" && value == false) return false;
  if (key == "minProperties" && value == 0) return false;
  return std::find(std::begin(kUnsupported), std::end(kUnsupported), key) != std::end(kUnsupported);
}

template <size_t N>
bool HasAny(const Json& s, const absl::string_view (&list)[N]) {
  for (absl::string_view k : list) {
    if (s.contains(k)) return true;
  }
  return false;
}

std::string PointerJoin(absl::string_view pointer, absl::string_view key) {
  return absl::StrCat(pointer, "/", absl::StrReplaceAll(key, {{"~", "~0"}, {"/", "~1"}}));
}

std::string Where(absl::string_view pointer) {
  return pointer.empty() ? "#" : absl::StrCat("#", pointer);
}

absl::Status Invalid(absl::string_view pointer, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("JSON schema at ", Where(pointer), ": ", what));
}

std::string TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
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

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The node a local $ref ("#…", a URI fragment holding a JSON pointer) names in `doc`, and the
// decoded pointer.
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

// `x` repeated min..max times (max < 0: unbounded) as GBNF.
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

// Bounds for a generated repetition: a maximum above kMaxJsonRepeat is lowered to it.
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

}  // namespace

JsonSchemaConverter::JsonSchemaConverter(const Options& opts, GbnfRules* rules)
    : opts_(opts), rules_(rules) {
  if (opts_.json.any_whitespace) {
    ws_ = " " + Space();
    comma_ = "\",\"" + ws_;
    colon_ = "\":\"" + ws_;
  } else if (opts_.python_separators) {
    comma_ = "\", \"";
    colon_ = "\": \"";
  } else {
    comma_ = "\",\"";
    colon_ = "\":\"";
  }
}

std::string JsonSchemaConverter::Space() {
  auto it = prims_.find("space");
  if (it != prims_.end()) return it->second;
  std::string name = rules_->Add("space", "| \" \" | \"\\n\" [ \\t]{0,20}");
  prims_["space"] = name;
  return name;
}

std::string JsonSchemaConverter::Tok(absl::string_view literal) const {
  return absl::StrCat(literal, ws_);
}

std::string JsonSchemaConverter::Prim(absl::string_view name) {
  if (auto it = prims_.find(name); it != prims_.end()) return it->second;
  const std::string key(name);
  if (name == "value" || name == "object" || name == "array") {  // mutually recursive
    const std::string rule = rules_->Reserve(key);
    prims_[key] = rule;
    std::string body;
    if (name == "value") {
      body = absl::StrJoin({Prim("object"), Prim("array"), Prim("string"), Prim("number"),
                            Prim("boolean"), Prim("null")},
                           " | ");
    } else if (name == "object") {
      const std::string kv = absl::StrCat(Prim("string"), " ", colon_, " ", Prim("value"));
      body = absl::StrCat(Tok("\"{\""), " ( ", kv, " ( ", comma_, " ", kv, " )* )? ", Tok("\"}\""));
    } else {
      const std::string v = Prim("value");
      body = absl::StrCat(Tok("\"[\""), " ( ", v, " ( ", comma_, " ", v, " )* )? ", Tok("\"]\""));
    }
    rules_->Define(rule, std::move(body));
    return rule;
  }
  std::string body;
  if (name == "escape") {
    // \uXXXX: no lone surrogates (parsers reject them); a high one only with its low one.
    body =
        "\"\\\\\" ( [\\x22/\\x5Cbfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] "
        "[0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2} ) )";
  } else if (name == "escape-bmp") {
    // As escape, without the surrogate pair (a character outside the BMP).
    body =
        "\"\\\\\" ( [\\x22/\\x5Cbfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] "
        "[0-9a-fA-F]{2} ) )";
  } else if (name == "char" || name == "char-bmp") {
    const bool bmp = name == "char-bmp";
    CodepointSet plain = CodepointSet::Range(0x20, bmp ? 0xFFFF : CodepointSet::kMax);
    plain = plain.Minus(CodepointSet::Of('"')).Minus(CodepointSet::Of('\\'));
    if (opts_.avoid != 0) plain = plain.Minus(CodepointSet::Of(opts_.avoid));
    body = absl::StrCat(GbnfClass(plain), " | ", Prim(bmp ? "escape-bmp" : "escape"));
  } else if (name == "string") {
    body = absl::StrCat("\"\\\"\" ", Prim("char"), "* ", Tok("\"\\\"\""));
  } else if (name == "number") {
    body = Tok(
        "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?");
  } else if (name == "integer") {
    body = Tok("\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )");
  } else if (name == "boolean") {
    body = Tok("( \"true\" | \"false\" )");
  } else if (name == "null") {
    body = Tok("\"null\"");
  } else if (name == "leap-year") {
    body =
        "[1-9] [0-9] ( \"0\" [48] | [2468] [048] | [13579] [26] ) | ( [2468] [048] | [13579] "
        "[26] ) \"00\"";
  } else if (name == "date") {
    body = absl::StrCat(
        "[1-9] [0-9]{3} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | "
        "\"3\" [01] ) | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | "
        "\"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) ) | ",
        Prim("leap-year"), " \"-02-29\"");
  } else if (name == "time") {
    body =
        "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? "
        "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";
  } else if (name == "date-time") {
    body = absl::StrCat(Prim("date"), " \"T\" ", Prim("time"));
  } else if (name == "uuid") {
    body =
        "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
        "[0-9a-fA-F]{12}";
  }
  std::string rule = rules_->Add(key, std::move(body));
  prims_[key] = rule;
  return rule;
}

absl::Status JsonSchemaConverter::Step(const Ctx& ctx) {
  if (++steps_ > kMaxSchemaSteps) {
    return absl::ResourceExhaustedError(
        absl::StrCat("JSON schema: more than ", kMaxSchemaSteps, " schema nodes to convert"));
  }
  if (ctx.depth > kMaxSchemaDepth) {
    return Invalid(ctx.pointer, absl::StrCat("nested deeper than ", kMaxSchemaDepth));
  }
  return rules_->status();
}

JsonSchemaConverter::Ctx JsonSchemaConverter::Child(const Ctx& ctx, absl::string_view key,
                                                    absl::string_view hint_suffix,
                                                    bool leftmost) const {
  return Ctx{ctx.doc, PointerJoin(ctx.pointer, key),
             hint_suffix.empty() ? ctx.hint : absl::StrCat(ctx.hint, "-", hint_suffix),
             ctx.depth + 1, leftmost};
}

absl::StatusOr<std::string> JsonSchemaConverter::Literal(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (opts_.avoid != 0) {
    std::string avoid_text;
    utf8::Append(opts_.avoid, &avoid_text);
    text = absl::StrReplaceAll(text, {{avoid_text, absl::StrFormat("\\u%04x", opts_.avoid)}});
  }
  absl::StatusOr<std::string> lit = GbnfLiteral(text);
  if (!lit.ok()) return lit.status();
  return Tok(*lit);
}

absl::StatusOr<std::string> JsonSchemaConverter::RefRule(const Json& s, const Ctx& ctx) {
  for (const auto& [key, value] : s.items()) {
    if (key != "$ref" && In(key, kConstraining)) {
      return Invalid(ctx.pointer, absl::StrCat("\"", key, "\" beside \"$ref\" is not supported"));
    }
  }
  const Json& ref = s["$ref"];
  if (!ref.is_string()) return Invalid(PointerJoin(ctx.pointer, "$ref"), "expected a string");
  auto target = ResolveRef(*ctx.doc, ref.get_ref<const std::string&>(), ctx.pointer);
  if (!target.ok()) return target.status();
  const std::string key = absl::StrCat(reinterpret_cast<uintptr_t>(target->first));
  std::string name;
  if (auto it = ref_rules_.find(key); it != ref_rules_.end()) {
    name = it->second;
  } else {
    const std::string& ptr = target->second;
    const size_t slash = ptr.rfind('/');
    name = rules_->Reserve(slash == std::string::npos ? "ref" : ptr.substr(slash + 1));
    ref_rules_[key] = name;
    pending_.push_back(Pending{ctx.doc, target->first, target->second, name});
  }
  if (ctx.leftmost) left_edges_.emplace_back(current_rule_, name);
  return name;
}

absl::StatusOr<std::string> JsonSchemaConverter::Enum(const Json& s,
                                                      const std::vector<std::string>& types,
                                                      const Ctx& ctx) {
  std::vector<const Json*> values;
  if (auto c = s.find("const"); c != s.end()) {
    values.push_back(&*c);
  } else {
    const Json& e = s["enum"];
    if (!e.is_array()) return Invalid(PointerJoin(ctx.pointer, "enum"), "expected an array");
    for (const Json& v : e) values.push_back(&v);
  }
  std::vector<std::string> alts;
  absl::flat_hash_set<std::string> seen;
  for (const Json* v : values) {
    if (!types.empty() && std::none_of(types.begin(), types.end(),
                                       [&](const std::string& t) { return MatchesType(*v, t); })) {
      continue;
    }
    absl::StatusOr<std::string> lit = Literal(*v);
    if (!lit.ok()) return lit.status();
    if (seen.insert(*lit).second) alts.push_back(*std::move(lit));
  }
  if (alts.empty()) {
    return Invalid(ctx.pointer, "enum/const leaves no value (of the given type)");
  }
  return Alternatives(alts);
}

absl::StatusOr<std::string> JsonSchemaConverter::Visit(const Json& s, const Ctx& ctx) {
  if (absl::Status st = Step(ctx); !st.ok()) return st;
  if (s.is_boolean()) {
    if (s.get<bool>()) return Prim("value");
    return Invalid(ctx.pointer, "the schema false allows no value here");
  }
  if (!s.is_object()) {
    return Invalid(ctx.pointer, absl::StrCat("expected an object or a boolean, got ", TypeName(s)));
  }
  for (const auto& [key, value] : s.items()) {
    if (!Unsupported(key, value)) continue;
    return Invalid(PointerJoin(ctx.pointer, key),
                   absl::StrCat("keyword \"", key, "\" is not supported"));
  }
  if (s.contains("$ref")) return RefRule(s, ctx);

  std::vector<std::string> types;
  if (auto t = s.find("type"); t != s.end()) {
    if (t->is_string()) {
      types.push_back(t->get<std::string>());
    } else if (t->is_array()) {
      for (const Json& e : *t) {
        if (!e.is_string()) return Invalid(PointerJoin(ctx.pointer, "type"), "expected strings");
        types.push_back(e.get<std::string>());
      }
    } else {
      return Invalid(PointerJoin(ctx.pointer, "type"), "expected a string or an array");
    }
    for (const std::string& type : types) {
      static constexpr absl::string_view kTypes[] = {"string", "number", "integer", "boolean",
                                                     "null",   "object", "array"};
      if (!In(type, kTypes)) {
        return Invalid(PointerJoin(ctx.pointer, "type"),
                       absl::StrCat("unknown type \"", type, "\""));
      }
    }
    if (types.empty()) return Invalid(PointerJoin(ctx.pointer, "type"), "empty type list");
  }

  const char* combinator = s.contains("anyOf")   ? "anyOf"
                           : s.contains("oneOf") ? "oneOf"
                           : s.contains("allOf") ? "allOf"
                                                 : nullptr;
  std::vector<std::string> alts;
  if (s.contains("enum") || s.contains("const")) {
    if (combinator != nullptr) {
      return Invalid(ctx.pointer,
                     absl::StrCat("enum/const beside \"", combinator, "\" is not supported"));
    }
    absl::StatusOr<std::string> e = Enum(s, types, ctx);
    if (!e.ok()) return e;
    alts.push_back(*std::move(e));
  } else if (combinator != nullptr && absl::string_view(combinator) != "allOf") {
    for (const auto& [key, value] : s.items()) {
      if (In(key, kConstraining) && key != combinator && key != "nullable") {
        return Invalid(ctx.pointer,
                       absl::StrCat("\"", key, "\" beside \"", combinator, "\" is not supported"));
      }
    }
    const Json& branches = s[combinator];
    if (!branches.is_array() || branches.empty()) {
      return Invalid(PointerJoin(ctx.pointer, combinator), "expected a non-empty array");
    }
    const Ctx list = Child(ctx, combinator, "", ctx.leftmost);
    for (size_t i = 0; i < branches.size(); ++i) {
      Ctx branch = Child(list, std::to_string(i), "", ctx.leftmost);
      branch.depth = ctx.depth + 1;
      absl::StatusOr<std::string> b = Visit(branches[i], branch);
      if (!b.ok()) return b;
      alts.push_back(*std::move(b));
    }
  } else if (combinator != nullptr) {  // allOf
    const Json& parts = s["allOf"];
    if (!parts.is_array() || parts.empty()) {
      return Invalid(PointerJoin(ctx.pointer, "allOf"), "expected a non-empty array");
    }
    bool siblings = false;
    for (const auto& [key, value] : s.items()) {
      siblings = siblings || (In(key, kConstraining) && key != "allOf");
    }
    if (parts.size() == 1 && !siblings) {
      Ctx only = Child(Child(ctx, "allOf", "", ctx.leftmost), "0", "", ctx.leftmost);
      only.depth = ctx.depth + 1;
      return Visit(parts[0], only);
    }
    absl::StatusOr<ObjectShape> shape = Shape(s, ctx);
    if (!shape.ok()) return shape.status();
    absl::StatusOr<std::string> obj = ObjectRule(*shape, ctx);
    if (!obj.ok()) return obj;
    alts.push_back(*std::move(obj));
  } else {
    if (types.empty()) {
      if (HasAny(s, kObjectKeywords)) {
        types = {"object"};
      } else if (HasAny(s, kArrayKeywords)) {
        types = {"array"};
      } else if (HasAny(s, kStringKeywords)) {
        types = {"string"};
      } else if (HasAny(s, kBoundKeywords)) {
        types = {"number"};
      }
    }
    if (types.empty()) {
      alts.push_back(Prim("value"));
    } else {
      for (const std::string& type : types) {
        absl::StatusOr<std::string> v = VisitType(s, type, ctx);
        if (!v.ok()) return v;
        alts.push_back(*std::move(v));
      }
    }
  }
  if (auto n = s.find("nullable");
      n != s.end() && *n == true && std::find(types.begin(), types.end(), "null") == types.end()) {
    alts.push_back(Prim("null"));
  }
  return Alternatives(alts);
}

absl::StatusOr<std::string> JsonSchemaConverter::VisitType(const Json& s, absl::string_view type,
                                                           const Ctx& ctx) {
  if (type == "null") return Prim("null");
  if (type == "boolean") return Prim("boolean");
  if (type == "integer") return HasAny(s, kBoundKeywords) ? IntegerRule(s, ctx) : Prim("integer");
  if (type == "number") return HasAny(s, kBoundKeywords) ? NumberRule(s, ctx) : Prim("number");
  if (type == "string") return StringRule(s, ctx, /*raw=*/false);
  if (type == "array") return ArrayRule(s, ctx);
  absl::StatusOr<ObjectShape> shape = Shape(s, ctx);
  if (!shape.ok()) return shape.status();
  return ObjectRule(*shape, ctx);
}

absl::Status JsonSchemaConverter::Bounds(const Json& s, const Ctx& ctx, Bound* lo,
                                         Bound* hi) const {
  for (auto [key, lower] : {std::pair{"minimum", true}, std::pair{"exclusiveMinimum", true},
                            std::pair{"maximum", false}, std::pair{"exclusiveMaximum", false}}) {
    auto it = s.find(key);
    if (it == s.end()) continue;
    const bool exclusive = absl::StartsWith(key, "exclusive");
    double v = 0;
    if (exclusive && it->is_boolean()) {  // draft 4: modifies minimum/maximum
      if (!it->get<bool>()) continue;
      auto base = s.find(lower ? "minimum" : "maximum");
      if (base == s.end() || !base->is_number()) {
        return Invalid(PointerJoin(ctx.pointer, key), "without a numeric bound");
      }
      v = base->get<double>();
    } else if (it->is_number()) {
      v = it->get<double>();
    } else {
      return Invalid(PointerJoin(ctx.pointer, key), "expected a number");
    }
    if (!std::isfinite(v)) return Invalid(PointerJoin(ctx.pointer, key), "expected a number");
    Bound& b = lower ? *lo : *hi;
    const bool tighter =
        !b.has || (lower ? v > b.value : v < b.value) || (v == b.value && exclusive);
    if (tighter) b = Bound{true, v, exclusive};
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> JsonSchemaConverter::IntegerRule(const Json& s, const Ctx& ctx) {
  Bound lower, upper;
  if (absl::Status st = Bounds(s, ctx, &lower, &upper); !st.ok()) return st;
  const double cap = static_cast<double>(kMaxRangeMagnitude);
  int64_t lo = -kMaxRangeMagnitude, hi = kMaxRangeMagnitude;
  if (lower.has) {
    const double v = lower.exclusive ? std::floor(lower.value) + 1 : std::ceil(lower.value);
    lo = static_cast<int64_t>(std::clamp(v, -cap, cap + 1));
  }
  if (upper.has) {
    const double v = upper.exclusive ? std::ceil(upper.value) - 1 : std::floor(upper.value);
    hi = static_cast<int64_t>(std::clamp(v, -cap - 1, cap));
  }
  if (lo > hi) return Invalid(ctx.pointer, "the integer range is empty (or beyond 16 digits)");
  return rules_->Add(absl::StrCat(ctx.hint, "-int"), Tok(IntegerRangeGbnf(lo, hi)));
}

absl::StatusOr<std::string> JsonSchemaConverter::NumberRule(const Json& s, const Ctx& ctx) {
  Bound lower, upper;
  if (absl::Status st = Bounds(s, ctx, &lower, &upper); !st.ok()) return st;
  const double cap = static_cast<double>(kMaxRangeMagnitude);
  // Bounds rounded inward to integers; beyond 16 digits a bound is no bound.
  const bool lo_inf = !lower.has || lower.value < -cap;
  const bool hi_inf = !upper.has || upper.value > cap;
  int64_t lo = 0, hi = 0;
  bool lo_ex = false, hi_ex = false;
  if (!lo_inf) {
    if (lower.value > cap) return Invalid(ctx.pointer, "the number range is beyond 16 digits");
    lo = static_cast<int64_t>(std::ceil(lower.value));
    lo_ex = lower.exclusive && std::ceil(lower.value) == lower.value;
  }
  if (!hi_inf) {
    if (upper.value < -cap) return Invalid(ctx.pointer, "the number range is beyond 16 digits");
    hi = static_cast<int64_t>(std::floor(upper.value));
    hi_ex = upper.exclusive && std::floor(upper.value) == upper.value;
  }
  const std::string range =
      DecimalRangeGbnf(lo_inf ? std::nullopt : std::optional<int64_t>(lo), lo_ex,
                       hi_inf ? std::nullopt : std::optional<int64_t>(hi), hi_ex);
  if (range.empty()) {
    return Invalid(ctx.pointer,
                   "the number range holds no value once its bounds are rounded to integers");
  }
  return rules_->Add(absl::StrCat(ctx.hint, "-num"), Tok(range));
}

absl::StatusOr<std::string> JsonSchemaConverter::StringRule(const Json& s, const Ctx& ctx,
                                                            bool raw) {
  std::string content;
  const bool has_length = s.contains("minLength") || s.contains("maxLength");
  if (auto f = s.find("format"); f != s.end()) {
    if (!f->is_string()) return Invalid(PointerJoin(ctx.pointer, "format"), "expected a string");
    if (has_length || s.contains("pattern")) {
      return Invalid(ctx.pointer,
                     "\"format\" together with a length or a pattern is not supported");
    }
    const std::string& format = f->get_ref<const std::string&>();
    if (format != "date" && format != "time" && format != "date-time" && format != "uuid") {
      return Invalid(PointerJoin(ctx.pointer, "format"),
                     absl::StrCat("format \"", format, "\" is not supported"));
    }
    content = Prim(format);
  } else if (auto p = s.find("pattern"); p != s.end()) {
    if (!p->is_string()) return Invalid(PointerJoin(ctx.pointer, "pattern"), "expected a string");
    if (has_length) {
      return Invalid(ctx.pointer, "\"pattern\" together with a length is not supported");
    }
    absl::StatusOr<std::string> re = RegexToGbnfExpr(
        p->get_ref<const std::string&>(), raw ? RegexText::kRaw : RegexText::kJsonStringContent,
        absl::StrCat(ctx.hint, "-pattern"), rules_, opts_.avoid);
    if (!re.ok()) return Invalid(PointerJoin(ctx.pointer, "pattern"), re.status().message());
    content = *std::move(re);
  } else {
    int64_t min = 0, max = -1;
    if (absl::Status st = RepeatBounds(s, "minLength", "maxLength", ctx.pointer, &min, &max);
        !st.ok()) {
      return st;
    }
    std::string ch;
    if (raw) {
      CodepointSet any = CodepointSet::All();
      if (opts_.avoid != 0) any = any.Minus(CodepointSet::Of(opts_.avoid));
      ch = GbnfClass(any);
    } else {
      ch = Prim(has_length ? "char-bmp" : "char");
    }
    content = Repeat(ch, min, max);
  }
  if (raw) return content;
  return rules_->Add(absl::StrCat(ctx.hint, "-string"),
                     absl::StrCat("\"\\\"\" ", content, " ", Tok("\"\\\"\"")));
}

absl::StatusOr<std::string> JsonSchemaConverter::ArrayRule(const Json& s, const Ctx& ctx) {
  std::vector<std::pair<const Json*, std::string>> prefix;  // schema, pointer key
  const Json* items = nullptr;                              // null: any value
  bool more = true;                                         // items after the prefix allowed
  std::string items_key = "items";
  auto read_list = [&](absl::string_view key) -> absl::Status {
    const Json& list = s[std::string(key)];
    if (!list.is_array()) return Invalid(PointerJoin(ctx.pointer, key), "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      prefix.emplace_back(&list[i], PointerJoin(key, std::to_string(i)));
    }
    return absl::OkStatus();
  };
  auto read_rest = [&](absl::string_view key) -> absl::Status {
    auto it = s.find(key);
    items_key = std::string(key);
    if (it == s.end() || *it == true) return absl::OkStatus();
    if (*it == false) {
      more = false;
      return absl::OkStatus();
    }
    if (!it->is_object()) {
      return Invalid(PointerJoin(ctx.pointer, key), "expected a schema");
    }
    items = &*it;
    return absl::OkStatus();
  };
  absl::Status st;
  if (s.contains("prefixItems")) {
    st = read_list("prefixItems");
    if (st.ok()) st = read_rest("items");
  } else if (s.contains("items") && s["items"].is_array()) {
    st = read_list("items");
    if (st.ok()) st = read_rest("additionalItems");
  } else {
    st = read_rest("items");
  }
  if (!st.ok()) return st;
  int64_t min = 0, max = -1;
  const int64_t k = static_cast<int64_t>(prefix.size());
  if (st = RepeatBounds(s, "minItems", "maxItems", ctx.pointer, &min, &max); !st.ok()) return st;
  if (!more && (max < 0 || max > k)) max = k;
  if (max >= 0 && min > max) return Invalid(ctx.pointer, "minItems exceeds the items allowed");

  auto visit = [&](const Json* schema, const std::string& key,
                   absl::string_view hint) -> absl::StatusOr<std::string> {
    if (schema == nullptr) return Prim("value");
    std::string ptr = ctx.pointer;
    for (absl::string_view part : absl::StrSplit(key, '/')) ptr = PointerJoin(ptr, part);
    return Visit(*schema,
                 Ctx{ctx.doc, ptr, absl::StrCat(ctx.hint, "-", hint), ctx.depth + 1, false});
  };
  std::string item;
  if (more && (max < 0 || max > k)) {
    absl::StatusOr<std::string> v = visit(items, items_key, "item");
    if (!v.ok()) return v;
    item = *std::move(v);
  }
  const int64_t usable = max < 0 ? k : std::min(k, max);
  std::vector<std::string> p;
  for (int64_t i = 0; i < usable; ++i) {
    absl::StatusOr<std::string> v = visit(prefix[i].first, prefix[i].second, std::to_string(i));
    if (!v.ok()) return v;
    p.push_back(*std::move(v));
  }
  std::string inner;
  if (max == 0) {
    inner = "";
  } else if (usable == 0) {
    const std::string rest = Repeat(absl::StrCat(comma_, " ", item), std::max<int64_t>(min - 1, 0),
                                    max < 0 ? -1 : max - 1);
    inner = min == 0 ? absl::StrCat("( ", item, " ", rest, " )?") : absl::StrCat(item, " ", rest);
  } else {
    // Items after the prefix (only when all of it is there), then the optional prefix items
    // from the back, as rules so that nesting stays flat.
    std::string tail;
    if (!item.empty()) {
      tail = Repeat(absl::StrCat(comma_, " ", item), std::max<int64_t>(min - k, 0),
                    max < 0 ? -1 : max - k);
    }
    const int64_t required = std::min(min, usable);
    std::string next = tail;  // S[i+1]
    for (int64_t i = usable - 1; i >= std::max<int64_t>(required, 1); --i) {
      next =
          rules_->Add(absl::StrCat(ctx.hint, "-tail"),
                      absl::StrCat("( ", comma_, " ", p[i], next.empty() ? "" : " ", next, " )?"));
    }
    if (required == 0) {
      inner = absl::StrCat("( ", p[0], next.empty() ? "" : " ", next, " )?");
    } else {
      for (int64_t i = 0; i < required; ++i) {
        absl::StrAppend(&inner, i > 0 ? absl::StrCat(" ", comma_, " ") : "", p[i]);
      }
      if (!next.empty()) absl::StrAppend(&inner, " ", next);
    }
  }
  return rules_->Add(
      ctx.hint, absl::StrCat(Tok("\"[\""), inner.empty() ? "" : " ", inner, " ", Tok("\"]\"")));
}

absl::StatusOr<JsonSchemaConverter::ObjectShape> JsonSchemaConverter::Shape(const Json& s,
                                                                            const Ctx& ctx) {
  // The schema and, flattened, its allOf parts (through $refs).
  std::vector<std::pair<const Json*, std::string>> parts = {{&s, ctx.pointer}};
  for (size_t i = 0; i < parts.size(); ++i) {
    const Json& part = *parts[i].first;
    auto all = part.find("allOf");
    if (all == part.end()) continue;
    if (!all->is_array())
      return Invalid(PointerJoin(parts[i].second, "allOf"), "expected an array");
    for (size_t j = 0; j < all->size(); ++j) {
      SchemaAt at{ctx.doc, &(*all)[j],
                  PointerJoin(PointerJoin(parts[i].second, "allOf"), std::to_string(j))};
      absl::StatusOr<SchemaAt> r = Resolve(at);
      if (!r.ok()) return r.status();
      if (absl::Status st = Step(Ctx{ctx.doc, r->pointer, ctx.hint, ctx.depth + 1, false});
          !st.ok()) {
        return st;
      }
      parts.emplace_back(r->schema, r->pointer);
    }
  }
  ObjectShape shape;
  absl::flat_hash_map<std::string, size_t> index;
  std::vector<std::string> required;
  int closed = 0;                                            // parts that forbid other keys
  std::optional<std::pair<const Json*, std::string>> extra;  // an additionalProperties schema
  bool open = false;
  for (const auto& [part_ptr, ptr] : parts) {
    const Json& part = *part_ptr;
    if (!part.is_object()) return Invalid(ptr, "allOf: expected an object schema");
    for (const auto& [key, value] : part.items()) {
      if (Unsupported(key, value)) {
        return Invalid(PointerJoin(ptr, key),
                       absl::StrCat("keyword \"", key, "\" is not supported"));
      }
      if (parts.size() > 1 && In(key, kConstraining) && !In(key, kObjectKeywords) &&
          key != "allOf" && !(key == "type" && value == "object")) {
        return Invalid(PointerJoin(ptr, key),
                       "allOf: only object schemas (properties, required, additionalProperties) "
                       "can be merged");
      }
    }
    if (auto props = part.find("properties"); props != part.end()) {
      if (!props->is_object()) {
        return Invalid(PointerJoin(ptr, "properties"), "expected an object");
      }
      for (const auto& [name, schema] : props->items()) {
        const std::string prop_ptr = PointerJoin(PointerJoin(ptr, "properties"), name);
        if (auto it = index.find(name); it != index.end()) {
          if (*shape.properties[it->second].schema.schema != schema) {
            return Invalid(prop_ptr, "allOf: the property has different schemas in two branches");
          }
          continue;
        }
        index[name] = shape.properties.size();
        shape.properties.push_back({name, SchemaAt{ctx.doc, &schema, prop_ptr}, false});
      }
    }
    if (auto req = part.find("required"); req != part.end()) {
      if (!req->is_array()) return Invalid(PointerJoin(ptr, "required"), "expected an array");
      for (const Json& r : *req) {
        if (!r.is_string()) return Invalid(PointerJoin(ptr, "required"), "expected strings");
        required.push_back(r.get<std::string>());
      }
    }
    if (auto add = part.find("additionalProperties"); add != part.end()) {
      if (*add == false) {
        ++closed;
      } else if (*add == true || (add->is_object() && add->empty())) {
        open = true;
      } else if (add->is_object()) {
        if (extra && *extra->first != *add) {
          return Invalid(PointerJoin(ptr, "additionalProperties"),
                         "allOf: different additionalProperties schemas");
        }
        extra.emplace(&*add, PointerJoin(ptr, "additionalProperties"));
        open = true;
      } else {
        return Invalid(PointerJoin(ptr, "additionalProperties"), "expected a boolean or a schema");
      }
    }
  }
  for (const std::string& name : required) {
    if (auto it = index.find(name); it != index.end()) {
      shape.properties[it->second].required = true;
    } else {
      index[name] = shape.properties.size();
      shape.properties.push_back({name, SchemaAt{}, true});
    }
  }
  // No properties anywhere and nothing said about other keys: a free-form object ({"type":
  // "object"}), not the empty object.
  bool listed = false, said = false;
  for (const auto& part : parts) {
    listed = listed || part.first->contains("properties");
    said = said || part.first->contains("additionalProperties");
  }
  if (!listed && !said) open = true;
  shape.additional = open && closed == 0;
  if (shape.additional && extra) {
    shape.additional_schema = SchemaAt{ctx.doc, extra->first, extra->second};
  }
  return shape;
}

absl::StatusOr<std::string> JsonSchemaConverter::ExtraKey(const ObjectShape& shape,
                                                          const Ctx& ctx) {
  // A trie of the listed names; a key is generated unless it spells one of them.
  struct TrieNode {
    std::map<uint32_t, int> children;
    bool end = false;
  };
  CodepointSet plain = CodepointSet::Range(0x20, CodepointSet::kMax)
                           .Minus(CodepointSet::Of('"'))
                           .Minus(CodepointSet::Of('\\'));
  if (opts_.avoid != 0) plain = plain.Minus(CodepointSet::Of(opts_.avoid));
  std::vector<TrieNode> trie(1);
  for (const auto& prop : shape.properties) {
    int node = 0;
    bool whole = true;
    const auto* p = reinterpret_cast<const unsigned char*>(prop.name.data());
    for (size_t i = 0; i < prop.name.size();) {
      const utf8::Step step = utf8::Next(p + i, prop.name.size() - i);
      uint32_t cp = step.len == 1 ? p[i] : (p[i] & (0xFF >> (step.len + 1)));
      for (size_t b = 1; b < step.len; ++b) cp = (cp << 6) | (p[i + b] & 0x3F);
      i += step.len;
      if (step.kind != utf8::Kind::kChar || !plain.Contains(cp)) {  // spelled with escapes
        whole = false;
        break;
      }
      auto it = trie[node].children.find(cp);
      if (it == trie[node].children.end()) {
        trie.push_back({});
        it = trie[node].children.emplace(cp, static_cast<int>(trie.size()) - 1).first;
      }
      node = it->second;
    }
    if (whole) trie[node].end = true;
  }
  const std::string ch = Prim("char");
  const std::string esc = Prim("escape");
  std::vector<std::string> names(trie.size());
  for (size_t i = 0; i < trie.size(); ++i) {
    if (i == 0 || !trie[i].children.empty()) names[i] = rules_->Reserve(ctx.hint + "-key");
  }
  for (size_t i = 0; i < trie.size(); ++i) {
    if (names[i].empty()) continue;
    std::vector<std::string> alts;
    CodepointSet other = plain;
    for (const auto& [cp, child] : trie[i].children) {
      other = other.Minus(CodepointSet::Of(cp));
      std::string text;
      utf8::Append(cp, &text);
      absl::StatusOr<std::string> lit = GbnfLiteral(text);
      if (!lit.ok()) return lit.status();
      alts.push_back(
          absl::StrCat(*lit, " ", trie[child].children.empty() ? ch + "+" : names[child]));
    }
    if (!other.empty()) alts.push_back(absl::StrCat(GbnfClass(other), " ", ch, "*"));
    alts.push_back(absl::StrCat(esc, " ", ch, "*"));
    std::string body = absl::StrJoin(alts, " | ");
    if (!trie[i].end) body = "| " + body;
    rules_->Define(names[i], std::move(body));
  }
  return absl::StrCat("\"\\\"\" ", names[0], " ", Tok("\"\\\"\""));
}

absl::StatusOr<std::string> JsonSchemaConverter::ObjectRule(const ObjectShape& shape,
                                                            const Ctx& ctx) {
  const size_t n = shape.properties.size();
  std::vector<std::string> kv(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& prop = shape.properties[i];
    absl::StatusOr<std::string> key = Literal(Json(prop.name));
    if (!key.ok()) return key.status();
    std::string value;
    if (prop.schema.schema == nullptr) {
      value = Prim("value");
    } else {
      absl::StatusOr<std::string> v = Visit(
          *prop.schema.schema, Ctx{ctx.doc, prop.schema.pointer,
                                   absl::StrCat(ctx.hint, "-", prop.name), ctx.depth + 1, false});
      if (!v.ok()) return v;
      value = *std::move(v);
    }
    kv[i] = absl::StrCat(*key, " ", colon_, " ", value);
  }
  std::string extra;
  if (shape.additional) {
    absl::StatusOr<std::string> key = ExtraKey(shape, ctx);
    if (!key.ok()) return key;
    std::string value = Prim("value");
    if (shape.additional_schema) {
      absl::StatusOr<std::string> v = Visit(*shape.additional_schema->schema,
                                            Ctx{ctx.doc, shape.additional_schema->pointer,
                                                ctx.hint + "-additional", ctx.depth + 1, false});
      if (!v.ok()) return v;
      value = *std::move(v);
    }
    extra = rules_->Add(ctx.hint + "-additional-kv", absl::StrCat(*key, " ", colon_, " ", value));
  }
  const std::string extras_tail =
      extra.empty() ? "" : absl::StrCat("( ", comma_, " ", extra, " )*");

  size_t first_required = n;
  for (size_t i = 0; i < n; ++i) {
    if (shape.properties[i].required) {
      first_required = i;
      break;
    }
  }
  // After the first required property: each later one in turn, optional ones optional.
  std::string tail;
  for (size_t i = first_required + 1; i < n; ++i) {
    const std::string item = absl::StrCat(comma_, " ", kv[i]);
    absl::StrAppend(&tail, tail.empty() ? "" : " ",
                    shape.properties[i].required ? item : absl::StrCat("( ", item, " )?"));
  }
  if (!extras_tail.empty()) absl::StrAppend(&tail, tail.empty() ? "" : " ", extras_tail);
  auto seq = [](std::string a, absl::string_view b) {
    if (!b.empty()) absl::StrAppend(&a, " ", b);
    return a;
  };

  std::string inner;
  if (n == 0) {
    if (!extra.empty()) inner = absl::StrCat("( ", extra, " ", extras_tail, " )?");
  } else if (first_required == 0) {
    inner = seq(kv[0], tail);
  } else {
    // Leading optional properties: the first one present is any of them (or the first required
    // one); what follows it is the rest of the list, as a chain of rules rest[m].
    const size_t j = first_required;
    std::vector<std::string> kv_rule(j);
    for (size_t i = 0; i < j; ++i) kv_rule[i] = rules_->Add(ctx.hint + "-kv", kv[i]);
    std::vector<std::string> rest(j + 1);  // rest[m]: expression for properties m.. after a comma
    rest[j] = j < n ? seq(absl::StrCat(comma_, " ", kv[j]), tail) : extras_tail;
    if (!rest[j].empty()) rest[j] = rules_->Add(ctx.hint + "-rest", rest[j]);
    for (size_t m = j - 1; m >= 1; --m) {
      rest[m] = rules_->Add(ctx.hint + "-rest",
                            seq(absl::StrCat("( ", comma_, " ", kv_rule[m], " )?"), rest[m + 1]));
    }
    std::vector<std::string> alts;
    for (size_t i = 0; i < j; ++i) alts.push_back(seq(kv_rule[i], rest[i + 1]));
    if (j < n) alts.push_back(seq(kv[j], tail));
    if (j == n && !extra.empty()) alts.push_back(seq(extra, extras_tail));
    inner = absl::StrCat("( ", absl::StrJoin(alts, " | "), " )", j == n ? "?" : "");
  }
  return rules_->Add(
      ctx.hint, absl::StrCat(Tok("\"{\""), inner.empty() ? "" : " ", inner, " ", Tok("\"}\"")));
}

absl::StatusOr<JsonSchemaConverter::SchemaAt> JsonSchemaConverter::Resolve(const SchemaAt& at) {
  SchemaAt cur = at;
  for (int hops = 0; cur.schema->is_object() && cur.schema->contains("$ref"); ++hops) {
    if (hops >= kMaxSchemaDepth) return Invalid(cur.pointer, "$ref chain too long");
    const Json& ref = (*cur.schema)["$ref"];
    if (!ref.is_string()) return Invalid(PointerJoin(cur.pointer, "$ref"), "expected a string");
    auto target = ResolveRef(*cur.doc, ref.get_ref<const std::string&>(), cur.pointer);
    if (!target.ok()) return target.status();
    cur.schema = target->first;
    cur.pointer = target->second;
  }
  return cur;
}

absl::StatusOr<JsonSchemaConverter::ObjectShape> JsonSchemaConverter::Object(const SchemaAt& at) {
  absl::StatusOr<SchemaAt> r = Resolve(at);
  if (!r.ok()) return r.status();
  const Json& s = *r->schema;
  if (!s.is_object()) return Invalid(r->pointer, "expected an object schema");
  if (auto t = s.find("type"); t != s.end() && *t != "object") {
    return Invalid(PointerJoin(r->pointer, "type"), "expected \"object\"");
  }
  for (absl::string_view k : {"anyOf", "oneOf", "enum", "const"}) {
    if (s.contains(k)) {
      return Invalid(PointerJoin(r->pointer, k), "expected a plain object schema");
    }
  }
  return Shape(s, Ctx{r->doc, r->pointer, "obj", 0, false});
}

absl::StatusOr<std::optional<std::string>> JsonSchemaConverter::StringContent(
    const SchemaAt& at, absl::string_view hint) {
  absl::StatusOr<SchemaAt> r = Resolve(at);
  if (!r.ok()) return r.status();
  const Json& s = *r->schema;
  if (!s.is_object()) return std::nullopt;
  for (absl::string_view k : {"anyOf", "oneOf", "allOf", "nullable"}) {
    if (s.contains(k)) return std::nullopt;
  }
  const Ctx ctx{r->doc, r->pointer, std::string(hint), 0, false};
  if (s.contains("enum") || s.contains("const")) {
    std::vector<const Json*> values;
    if (auto c = s.find("const"); c != s.end()) {
      values.push_back(&*c);
    } else if (s["enum"].is_array()) {
      for (const Json& v : s["enum"]) values.push_back(&v);
    }
    std::vector<std::string> alts;
    for (const Json* v : values) {
      if (!v->is_string()) return std::nullopt;
      const std::string& text = v->get_ref<const std::string&>();
      if (opts_.avoid != 0) {
        std::string avoid_text;
        utf8::Append(opts_.avoid, &avoid_text);
        if (text.find(avoid_text) != std::string::npos) continue;
      }
      absl::StatusOr<std::string> lit = GbnfLiteral(text);
      if (!lit.ok()) return lit.status();
      alts.push_back(*std::move(lit));
    }
    if (alts.empty()) return Invalid(r->pointer, "no enum/const string can be written here");
    return Alternatives(alts);
  }
  auto t = s.find("type");
  if (t == s.end() || *t != "string") return std::nullopt;
  if (absl::Status st = Step(ctx); !st.ok()) return st;
  absl::StatusOr<std::string> content = StringRule(s, ctx, /*raw=*/true);
  if (!content.ok()) return content.status();
  return *std::move(content);
}

absl::StatusOr<std::string> JsonSchemaConverter::Value(const SchemaAt& at, absl::string_view hint,
                                                       absl::string_view rule) {
  current_rule_ = std::string(rule);
  if (!rule.empty()) {
    ref_rules_[absl::StrCat(reinterpret_cast<uintptr_t>(at.schema))] = std::string(rule);
  }
  return Visit(*at.schema, Ctx{at.doc, at.pointer, std::string(hint), 0, !rule.empty()});
}

absl::Status JsonSchemaConverter::Finish() {
  for (size_t i = 0; i < pending_.size(); ++i) {
    const Pending p = pending_[i];
    current_rule_ = p.rule;
    absl::StatusOr<std::string> body = Visit(*p.target, Ctx{p.doc, p.pointer, p.rule, 0, true});
    if (!body.ok()) return body.status();
    rules_->Define(p.rule, *std::move(body));
  }
  // A rule that reaches itself without consuming anything would recurse forever.
  absl::flat_hash_map<std::string, std::vector<std::string>> edges;
  for (const auto& [from, to] : left_edges_) edges[from].push_back(to);
  absl::flat_hash_map<std::string, int> state;  // 1 on the stack, 2 done
  static const std::vector<std::string> kNone;
  auto out_of = [&](const std::string& node) -> const std::vector<std::string>& {
    auto it = edges.find(node);
    return it == edges.end() ? kNone : it->second;
  };
  for (const auto& [start, unused] : edges) {
    if (state[start] != 0) continue;
    std::vector<std::pair<std::string, size_t>> stack = {{start, 0}};
    state[start] = 1;
    while (!stack.empty()) {
      const std::string node = stack.back().first;
      const std::vector<std::string>& out = out_of(node);
      if (stack.back().second == out.size()) {
        state[node] = 2;
        stack.pop_back();
        continue;
      }
      const std::string to = out[stack.back().second++];
      if (state[to] == 1) {
        return absl::InvalidArgumentError(absl::StrCat("JSON schema: $ref cycle through rule \"",
                                                       to, "\" that consumes nothing"));
      }
      if (state[to] == 0) {
        state[to] = 1;
        stack.emplace_back(to, 0);
      }
    }
  }
  return rules_->status();
}

absl::StatusOr<std::string> JsonSchemaToGbnf(const Json& schema, const JsonGrammarOptions& opts) {
  GbnfRules rules;
  const std::string root = rules.Reserve("root");
  JsonSchemaConverter conv(JsonSchemaConverter::Options{opts, false, 0}, &rules);
  absl::StatusOr<std::string> expr = conv.Value({&schema, &schema, ""}, "root", root);
  if (!expr.ok()) return expr.status();
  rules.Define(root, *std::move(expr));
  if (absl::Status st = conv.Finish(); !st.ok()) return st;
  return rules.Render();
}

std::string JsonObjectGbnf(const JsonGrammarOptions& opts) {
  GbnfRules rules;
  const std::string root = rules.Reserve("root");
  JsonSchemaConverter conv(JsonSchemaConverter::Options{opts, false, 0}, &rules);
  rules.Define(root, conv.AnyObject());
  absl::StatusOr<std::string> text = rules.Render();
  return text.ok() ? *text : "";  // a few fixed rules: always within the limits
}

}  // namespace ss::grammar
