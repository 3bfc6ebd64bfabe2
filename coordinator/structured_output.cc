#include "coordinator/structured_output.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/dsv4_format.h"
#include "coordinator/grammar/dsml_tool_gbnf.h"
#include "coordinator/grammar/grammar_matcher.h"
#include "coordinator/grammar/json_schema_gbnf.h"
#include "coordinator/grammar/regex_gbnf.h"
#include "coordinator/json_limits.h"

namespace ss::openai {
namespace {

constexpr grammar::JsonGrammarOptions kJson{};  // compact: no whitespace between tokens

// Keeps `status`'s message, as a 400 naming `param`.
absl::Status Refused(const std::string& param, const absl::Status& status) {
  return Invalid(param, absl::StrCat(param, ": ", status.message()));
}

// A JSON Schema given as JSON or as its JSON text.
absl::StatusOr<std::string> SchemaGrammar(const Json& v, const std::string& param) {
  Json schema = v;
  if (v.is_string()) {
    auto parsed = ParseJsonWithLimits(v.get_ref<const std::string&>());
    if (!parsed.ok()) return Refused(param, parsed.status());
    schema = *std::move(parsed);
  }
  auto g = grammar::JsonSchemaToGbnf(schema, kJson);
  if (!g.ok()) return Refused(param, g.status());
  return g;
}

absl::StatusOr<std::string> StringField(const Json& v, const std::string& param) {
  if (!v.is_string()) return Invalid(param, absl::StrCat(param, ": expected a string"));
  return v.get<std::string>();
}

absl::StatusOr<std::string> ChoiceGrammar(const Json& v, const std::string& param) {
  std::vector<std::string> choices;
  bool ok = v.is_array() && !v.empty();
  for (const Json& c : ok ? v : Json::array()) {
    ok = ok && c.is_string();
    if (ok) choices.push_back(c.get<std::string>());
  }
  if (!ok) return Invalid(param, absl::StrCat(param, ": expected a non-empty array of strings"));
  auto g = grammar::ChoiceToGbnf(choices);
  if (!g.ok()) return Refused(param, g.status());
  return g;
}

absl::StatusOr<std::string> RegexGrammar(const Json& v, const std::string& param) {
  ASSIGN_OR_RETURN(const std::string regex, StringField(v, param));
  auto g = grammar::RegexToGbnf(regex);
  if (!g.ok()) return Refused(param, g.status());
  return g;
}

absl::StatusOr<std::optional<std::string>> ResponseFormat(const Json& rf) {
  if (!rf.is_object()) return Invalid("response_format", "response_format: expected an object");
  const Json type = rf.value("type", Json("text"));
  if (type == "text") return std::optional<std::string>();
  if (type == "json_object") return std::optional<std::string>(grammar::JsonObjectGbnf(kJson));
  if (type != "json_schema") {
    return Invalid("response_format.type",
                   absl::StrCat("response_format.type: ", Dump(type),
                                " is not one of \"text\", \"json_object\", \"json_schema\""));
  }
  const Json* js = Field(rf, "json_schema");
  if (js == nullptr || !js->is_object()) {
    return Invalid("response_format.json_schema",
                   "response_format.json_schema: expected an object with a \"schema\"");
  }
  const Json* schema = Field(*js, "schema");
  if (schema == nullptr) return std::optional<std::string>(grammar::JsonObjectGbnf(kJson));
  ASSIGN_OR_RETURN(std::string g, SchemaGrammar(*schema, "response_format.json_schema.schema"));
  return std::optional<std::string>(std::move(g));
}

// One constraint of vLLM's structured_outputs object.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> StructuredOutputs(const Json& so) {
  if (!so.is_object()) {
    return Invalid("structured_outputs", "structured_outputs: expected an object");
  }
  std::vector<std::pair<std::string, std::string>> found;
  for (auto it = so.begin(); it != so.end(); ++it) {
    if (it->is_null()) continue;
    const std::string param = absl::StrCat("structured_outputs.", it.key());
    std::string g;
    if (it.key() == "json") {
      ASSIGN_OR_RETURN(g, SchemaGrammar(*it, param));
    } else if (it.key() == "regex") {
      ASSIGN_OR_RETURN(g, RegexGrammar(*it, param));
    } else if (it.key() == "choice") {
      ASSIGN_OR_RETURN(g, ChoiceGrammar(*it, param));
    } else if (it.key() == "grammar") {
      ASSIGN_OR_RETURN(g, StringField(*it, param));
    } else if (it.key() == "json_object") {
      if (!it->is_boolean()) return Invalid(param, absl::StrCat(param, ": expected a boolean"));
      if (!it->get<bool>()) continue;
      g = grammar::JsonObjectGbnf(kJson);
    } else {
      return Invalid(param, absl::StrCat(param, ": not supported (json, regex, choice, grammar ",
                                         "and json_object are)"));
    }
    found.emplace_back(param, std::move(g));
  }
  return found;
}

// Enforces a compiled grammar, after the reasoning in thinking mode.
class GrammarConstraint : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> g,
                    const std::vector<uint32_t>* reasoning_mask, int32_t think_end, size_t words,
                    bool in_reasoning)
      : matcher_(std::move(g)),
        reasoning_mask_(reasoning_mask),
        think_end_(think_end),
        words_(words),
        in_reasoning_(in_reasoning) {}

  void FillAllowed(std::span<uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0u);
    std::span<const uint32_t> src = *reasoning_mask_;
    if (!in_reasoning_) src = Matched();
    std::copy_n(src.begin(), std::min(src.size(), mask.size()), mask.begin());
  }

  bool Accept(int32_t id) override {
    if (!in_reasoning_) return matcher_.AcceptToken(id);
    if (id < 0 || static_cast<size_t>(id / 32) >= reasoning_mask_->size() ||
        !(((*reasoning_mask_)[id / 32] >> (id % 32)) & 1u)) {
      return false;
    }
    in_reasoning_ = id != think_end_;
    return true;
  }

 private:
  std::span<const uint32_t> Matched() {
    scratch_.assign(words_, 0u);
    matcher_.FillNextTokenBitmask(scratch_);
    return scratch_;
  }

  grammar::GrammarMatcher matcher_;
  const std::vector<uint32_t>* reasoning_mask_;  // owned by the StructuredOutput
  int32_t think_end_;
  size_t words_;
  bool in_reasoning_;
  std::vector<uint32_t> scratch_;
};

}  // namespace

StructuredOutput::StructuredOutput(const Tokenizer& tokenizer, int32_t model_vocab,
                                   size_t cache_entries)
    : vocab_(std::make_shared<const grammar::TokenVocab>(grammar::TokenVocab::FromTokenizer(
          tokenizer, {tokenizer.TokenId(chat::kEosToken).value_or(-1)},
          std::max(model_vocab, tokenizer.vocab_size())))),
      cache_(vocab_, cache_entries),
      think_end_(tokenizer.TokenId(chat::kThinkingEnd).value_or(-1)) {
  reasoning_mask_.assign(mask_words(), 0u);
  for (int32_t id = 0; id < vocab_->size(); ++id) {
    if (vocab_->kind[id] == grammar::TokenVocab::Kind::kNormal || id == think_end_) {
      reasoning_mask_[id / 32] |= 1u << (id % 32);
    }
  }
}

absl::StatusOr<std::optional<RequestedGrammar>> StructuredOutput::RequestGrammar(
    const Json& body, const ToolChoice& choice, const Json* tools) const {
  std::vector<std::pair<std::string, std::string>> found;
  if (const Json* rf = Field(body, "response_format")) {
    ASSIGN_OR_RETURN(std::optional<std::string> g, ResponseFormat(*rf));
    if (g) found.emplace_back("response_format", *std::move(g));
  }
  if (const Json* so = Field(body, "structured_outputs")) {
    ASSIGN_OR_RETURN(auto more, StructuredOutputs(*so));
    for (auto& f : more) found.push_back(std::move(f));
  }
  for (const char* name : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    const Json* v = Field(body, name);
    if (v == nullptr) continue;
    const std::string kind = std::string(name).substr(7);
    std::string g;
    if (kind == "json") {
      ASSIGN_OR_RETURN(g, SchemaGrammar(*v, name));
    } else if (kind == "regex") {
      ASSIGN_OR_RETURN(g, RegexGrammar(*v, name));
    } else if (kind == "choice") {
      ASSIGN_OR_RETURN(g, ChoiceGrammar(*v, name));
    } else {
      ASSIGN_OR_RETURN(g, StringField(*v, name));
    }
    found.emplace_back(name, std::move(g));
  }
  if (choice.kind == ToolChoice::kRequired || choice.kind == ToolChoice::kNamed) {
    ASSIGN_OR_RETURN(const std::optional<bool> parallel, GetBool(body, "parallel_tool_calls"));
    auto g = grammar::DsmlToolCallGbnf(
        *tools, choice.kind == ToolChoice::kNamed ? std::optional(choice.name) : std::nullopt,
        kJson, parallel.value_or(true));
    if (!g.ok()) return Refused("tool_choice", g.status());
    found.emplace_back("tool_choice", *std::move(g));
  }
  if (found.size() > 1) {
    return Invalid(found[1].first,
                   absl::StrCat(found[1].first, ": the output is already constrained by ",
                                found[0].first, "; send one of them"));
  }
  if (found.empty()) return std::optional<RequestedGrammar>();
  return std::optional<RequestedGrammar>(
      RequestedGrammar{std::move(found[0].first), std::move(found[0].second)});
}

absl::StatusOr<std::shared_ptr<TokenConstraint>> StructuredOutput::Constraint(
    const RequestedGrammar& requested, bool after_reasoning) {
  auto compiled = cache_.Get(requested.gbnf);
  if (!compiled.ok()) return Refused(requested.param, compiled.status());
  if (after_reasoning && think_end_ < 0) {
    return Invalid(requested.param, absl::StrCat(requested.param, ": thinking mode needs the ",
                                                 "tokenizer's </think> token"));
  }
  return std::make_shared<GrammarConstraint>(*std::move(compiled), &reasoning_mask_, think_end_,
                                             mask_words(), after_reasoning);
}

}  // namespace ss::openai
