#include "coordinator/grammar/dsml_tool_gbnf.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/dsv4_format.h"

namespace ss::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr uint32_t kFullwidthBar = 0xFF5C;  // `｜`, the bars of every special token
constexpr absl::string_view kDsml = "<｜DSML｜>";

absl::Status Invalid(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// `"<" <｜DSML｜> "rest"` for markup such as "<｜DSML｜invoke name=\"".
std::string Markup(absl::string_view before, absl::string_view after) {
  return absl::StrCat(*GbnfLiteral(std::string(before)), " ", kDsml, " ",
                      *GbnfLiteral(std::string(after)));
}

}  // namespace

absl::StatusOr<std::string> DsmlToolCallGbnf(const Json& tools,
                                             const std::optional<std::string>& forced_name,
                                             const JsonGrammarOptions& opts,
                                             bool parallel_tool_calls) {
  if (!tools.is_array() || tools.empty()) {
    return Invalid("tools", "expected a non-empty array");
  }
  GbnfRules rules;
  const std::string root = rules.Reserve("root");
  JsonSchemaConverter conv(
      JsonSchemaConverter::Options{opts, /*python_separators=*/true, kFullwidthBar}, &rules);
  static const Json kAnyValue = true;
  static const Json kNoParameters = Json::object();
  std::vector<std::string> invokes;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = absl::StrCat("tools[", i, "]");
    const Json& tool = tools[i];
    if (!tool.is_object()) return Invalid(where, "expected an object");
    const bool wrapped = tool.contains("function");
    const Json& fn = wrapped ? tool["function"] : tool;
    const std::string fn_where = wrapped ? where + ".function" : where;
    if (!fn.is_object()) return Invalid(fn_where, "expected an object");
    auto name_it = fn.find("name");
    if (name_it == fn.end() || !name_it->is_string()) {
      return Invalid(fn_where + ".name", "expected a string");
    }
    const std::string& name = name_it->get_ref<const std::string&>();
    if (forced_name && name != *forced_name) continue;
    if (name.find(chat::kDsmlToken) != std::string::npos) {
      return Invalid(fn_where + ".name", "holds the text ｜DSML｜");
    }
    absl::StatusOr<std::string> name_lit = GbnfLiteral(name);
    if (!name_lit.ok()) return Invalid(fn_where + ".name", name_lit.status().message());

    const Json* params = &kNoParameters;
    if (auto p = fn.find("parameters"); p != fn.end() && !p->is_null()) params = &*p;
    absl::StatusOr<JsonSchemaConverter::ObjectShape> shape = conv.Object({params, params, ""});
    if (!shape.ok()) return Invalid(fn_where + ".parameters", shape.status().message());

    std::string body = absl::StrCat(Markup("<", "invoke name=\""), " ", *name_lit, " \"\\\">\\n\"");
    if (shape->properties.empty()) absl::StrAppend(&body, " \"\\n\"");
    const std::string hint = absl::StrCat("t", invokes.size());
    for (const auto& prop : shape->properties) {
      const std::string prop_where = absl::StrCat(fn_where, ".parameters.properties.", prop.name);
      if (prop.name.find(chat::kDsmlToken) != std::string::npos ||
          prop.name.find("\" string=\"") != std::string::npos) {
        return Invalid(prop_where, "a name the DSML markup cannot carry");
      }
      absl::StatusOr<std::string> key = GbnfLiteral(prop.name);
      if (!key.ok()) return Invalid(prop_where, key.status().message());
      JsonSchemaConverter::SchemaAt at = prop.schema;
      if (at.schema == nullptr) at = {&kAnyValue, &kAnyValue, ""};
      absl::StatusOr<JsonSchemaConverter::SchemaAt> resolved = conv.Resolve(at);
      if (!resolved.ok()) return Invalid(fn_where + ".parameters", resolved.status().message());
      // The branches to write: an anyOf/oneOf at the top is split so that string branches are
      // raw; otherwise the schema itself.
      std::vector<JsonSchemaConverter::SchemaAt> branches;
      const Json& s = *resolved->schema;
      const char* combinator = s.is_object() && s.contains("anyOf")   ? "anyOf"
                               : s.is_object() && s.contains("oneOf") ? "oneOf"
                                                                      : nullptr;
      bool split = combinator != nullptr && s[combinator].is_array() && !s[combinator].empty();
      if (split) {
        for (const auto& [k, v] : s.items()) {
          split =
              split && (k == combinator || k == "title" || k == "description" || k == "default" ||
                        k == "examples" || k == "$defs" || k == "definitions");
        }
      }
      if (split) {
        const Json& list = s[combinator];
        for (size_t b = 0; b < list.size(); ++b) {
          branches.push_back(
              {resolved->doc, &list[b], absl::StrCat(resolved->pointer, "/", combinator, "/", b)});
        }
      } else {
        branches.push_back(*resolved);
      }
      std::vector<std::string> raw_alts;
      std::vector<std::string> json_alts;
      const std::string prop_hint = absl::StrCat(hint, "-", prop.name);
      for (const auto& branch : branches) {
        absl::StatusOr<std::optional<std::string>> raw = conv.StringContent(branch, prop_hint);
        if (!raw.ok()) return Invalid(prop_where, raw.status().message());
        if (*raw) {
          raw_alts.push_back(**raw);
          continue;
        }
        absl::StatusOr<std::string> json = conv.Value(branch, prop_hint);
        if (!json.ok()) return Invalid(prop_where, json.status().message());
        json_alts.push_back(*std::move(json));
      }
      const std::string open = absl::StrCat(Markup("<", "parameter name=\""), " ", *key);
      const std::string close = Markup("</", "parameter>");
      std::vector<std::string> forms;
      auto alternatives = [](const std::vector<std::string>& alts) {
        return alts.size() == 1 ? alts[0] : absl::StrCat("( ", absl::StrJoin(alts, " | "), " )");
      };
      if (!raw_alts.empty()) {
        forms.push_back(absl::StrCat(open, " \"\\\" string=\\\"true\\\">\" ",
                                     alternatives(raw_alts), " ", close));
      }
      if (!json_alts.empty()) {
        forms.push_back(absl::StrCat(open, " \"\\\" string=\\\"false\\\">\" ",
                                     alternatives(json_alts), " ", close));
      }
      const std::string param =
          rules.Add(prop_hint + "-param", absl::StrCat(alternatives(forms), " \"\\n\""));
      absl::StrAppend(&body, " ", param, prop.required ? "" : "?");
    }
    // With every property optional, the encoder's empty form ">\n\n</…invoke>" too.
    if (!shape->properties.empty() &&
        std::none_of(shape->properties.begin(), shape->properties.end(),
                     [](const auto& p) { return p.required; })) {
      absl::StrAppend(&body, " \"\\n\"?");
    }
    absl::StrAppend(&body, " ", Markup("</", "invoke>"));
    invokes.push_back(rules.Add(absl::StrCat("invoke-", name), std::move(body)));
  }
  if (invokes.empty()) {
    return Invalid("tool_choice", absl::StrCat("names the function \"", forced_name.value_or(""),
                                               "\", which is not among the tools"));
  }
  if (absl::Status st = conv.Finish(); !st.ok()) return st;
  const std::string invoke = rules.Add("invoke", absl::StrJoin(invokes, " | "));
  rules.Define(root, absl::StrCat(Markup("\n\n<", "tool_calls>\n"), " ", invoke,
                                  forced_name || !parallel_tool_calls
                                      ? ""
                                      : absl::StrCat(" ( \"\\n\" ", invoke, " )*"),
                                  " ", Markup("\n</", "tool_calls>")));
  return rules.Render();
}

}  // namespace ss::grammar
