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
#include "coordinator/grammar/json_schema_support.h"
#include "coordinator/grammar/number_range_gbnf.h"
#include "coordinator/grammar/regex_gbnf.h"
#include "coordinator/json_limits.h"
#include "coordinator/utf8.h"

namespace ss::grammar {

namespace {

using json_schema::Alternatives;
using json_schema::HasAny;
using json_schema::In;
using json_schema::Invalid;
using json_schema::Json;
using json_schema::kArrayKeywords;
using json_schema::kBoundKeywords;
using json_schema::kConstraining;
using json_schema::kObjectKeywords;
using json_schema::kStringKeywords;
using json_schema::MatchesType;
using json_schema::PointerJoin;
using json_schema::Repeat;
using json_schema::RepeatBounds;
using json_schema::ResolveRef;
using json_schema::Unsupported;

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
    return Invalid(ctx.pointer,
                   absl::StrCat("expected an object or a boolean, got ", JsonTypeName(s)));
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
