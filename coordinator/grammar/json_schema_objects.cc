// JsonSchemaConverter (json_schema_gbnf.h) for arrays and objects: items and prefixItems, an
// object's shape (properties, required, additionalProperties, allOf merges) and its rule.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "coordinator/grammar/json_schema_gbnf.h"
#include "coordinator/grammar/json_schema_support.h"
#include "coordinator/utf8.h"

namespace ss::grammar {
namespace {

using json_schema::In;
using json_schema::Invalid;
using json_schema::Json;
using json_schema::kConstraining;
using json_schema::kObjectKeywords;
using json_schema::PointerJoin;
using json_schema::Repeat;
using json_schema::RepeatBounds;
using json_schema::Unsupported;

}  // namespace

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

}  // namespace ss::grammar
