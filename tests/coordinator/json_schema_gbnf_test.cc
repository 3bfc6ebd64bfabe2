// JsonSchemaToGbnf / JsonObjectGbnf through the grammar matcher: per schema, hand-written valid
// instances are accepted and invalid ones rejected, and random sentences of the grammar parse as
// JSON and validate against the schema (grammar_test_util.h's validator, spec semantics); plus
// the errors for what is not supported.
#include "coordinator/grammar/json_schema_gbnf.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grammar_test_util.h"

namespace ss::grammar {
namespace {

using nlohmann::ordered_json;
using testing::Accepts;
using testing::Compile;

struct Case {
  const char* name;
  const char* schema;
  std::vector<std::string> valid;    // compact JSON, in the grammar's property order
  std::vector<std::string> invalid;  // rejected
};

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {"string",
       R"({"type": "string"})",
       {R"("")", R"("héllo\n\u00e9\"\\\/")", R"("tab\tend")", R"("\ud83d\uDE00")", "\"\x7f\""},
       {"\"a\nb\"", R"("\x")", "abc", R"("unterminated)", R"("\udaab")", R"("\ude00")",
        R"("\u12")"}},
      {"integer",
       R"({"type": "integer"})",
       {"0", "-12", "1234567890123456"},
       {"01", "1.5", "-", "+1", "12345678901234567", "1e3"}},
      {"number",
       R"({"type": "number"})",
       {"0", "-1.5", "2e10", "1E-3", "0.25", "-0"},
       {"1.", ".5", "01", "1e", "NaN", "--1"}},
      {"boolean", R"({"type": "boolean"})", {"true", "false"}, {"True", "1", "tru"}},
      {"null", R"({"type": "null"})", {"null"}, {"nul", "None", ""}},
      {"type_array",
       R"({"type": ["string", "null"], "maxLength": 2})",
       {R"("xy")", "null"},
       {"1", R"("xyz")"}},
      {"enum_mixed",
       R"({"enum": ["a", 1, null, {"k": [1, 2]}, "q\"uote"]})",
       {R"("a")", "1", "null", R"({"k":[1,2]})", R"("q\"uote")"},
       {R"("b")", "2", R"({"k":[1]})"}},
      {"enum_typed", R"({"type": "string", "enum": ["x", 2, "y"]})", {R"("x")", R"("y")"}, {"2"}},
      {"const", R"({"const": "fixed", "title": "T"})", {R"("fixed")"}, {R"("other")"}},
      {"object_required",
       R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
           "required": ["a", "b"], "additionalProperties": false})",
       {R"({"a":1,"b":"x"})"},
       {R"({"b":"x","a":1})", R"({"a":1})", R"({"a":1,"b":"x","c":1})", "{}"}},
      {"object_mixed_optional",
       R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
           "c": {"type": "integer"}, "d": {"type": "integer"}, "e": {"type": "integer"}},
           "required": ["b", "d"], "additionalProperties": false})",
       {R"({"b":1,"d":2})", R"({"a":0,"b":1,"d":2})", R"({"a":0,"b":1,"c":3,"d":2,"e":5})",
        R"({"b":1,"d":2,"e":5})", R"({"b":1,"c":3,"d":2})"},
       {R"({"a":0,"d":2})", R"({"b":1,"c":3})", "{}", R"({"d":2,"b":1})", R"({"b":1,,"d":2})"}},
      {"object_all_optional",
       R"({"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"},
           "z": {"type": "integer"}}})",
       {"{}", R"({"y":1})", R"({"x":1,"z":3})", R"({"x":1,"y":2,"z":3})", R"({"z":0})"},
       {R"({"z":1,"x":2})", "{,}", R"({"x":1,})", R"({"w":1})"}},
      {"object_additional_true",
       R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
           "additionalProperties": true})",
       {R"({"a":1})", R"({"a":1,"zz":[true]})", R"({"a":1,"ab":2,"":{}})", R"({"a":1,"b":"s"})"},
       {R"({"a":1,"a":2})", R"({"zz":1})"}},
      {"object_additional_schema",
       R"({"type": "object", "additionalProperties": {"type": "integer"}})",
       {"{}", R"({"k":1,"j":2})"},
       {R"({"k":"s"})"}},
      {"object_free",
       R"({"type": "object"})",
       {"{}", R"({"k":[1,{"n":null}],"j":"s"})"},
       {"[]", "null"}},
      {"defs_ref",
       R"({"$defs": {"P": {"type": "object", "properties": {"x": {"type": "number"},
           "y": {"type": "number"}}, "required": ["x", "y"], "additionalProperties": false}},
           "type": "object", "properties": {"from": {"$ref": "#/$defs/P"},
           "to": {"$ref": "#/$defs/P"}}, "required": ["from", "to"],
           "additionalProperties": false})",
       {R"({"from":{"x":1,"y":2.5},"to":{"x":-1,"y":0}})"},
       {R"({"from":{"x":1},"to":{"x":-1,"y":0}})", R"({"from":{"x":1,"y":2}})"}},
      {"recursive_root",
       R"({"type": "object", "properties": {"v": {"type": "integer"},
           "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["v"],
           "additionalProperties": false})",
       {R"({"v":1})", R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})",
        R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[{"v":4}]}]}]})"},
       {R"({"v":1,"kids":[{}]})", R"({"kids":[]})"}},
      {"definitions_linked_list",
       R"({"definitions": {"node": {"type": "object", "properties": {"val": {"type": "string"},
           "next": {"anyOf": [{"$ref": "#/definitions/node"}, {"type": "null"}]}},
           "required": ["val", "next"], "additionalProperties": false}},
           "$ref": "#/definitions/node"})",
       {R"({"val":"a","next":null})", R"({"val":"a","next":{"val":"b","next":null}})"},
       {R"({"val":"a"})", R"({"val":"a","next":{"val":"b"}})"}},
      {"pointer_ref_zod",
       R"({"type": "object", "properties": {"a": {"type": "object", "properties":
           {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": false},
           "b": {"$ref": "#/properties/a"}}, "required": ["a", "b"],
           "additionalProperties": false})",
       {R"({"a":{"x":1},"b":{"x":2}})"},
       {R"({"a":{"x":1},"b":{}})"}},
      {"anyOf",
       R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}],
           "description": "d"})",
       {"5", R"("ab")"},
       {R"("abc")", "true"}},
      {"oneOf", R"({"oneOf": [{"type": "boolean"}, {"type": "null"}]})", {"true", "null"}, {"0"}},
      {"allOf_merge",
       R"({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}},
           "required": ["a"]}, {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]})",
       {R"({"a":"x","b":1})"},
       {R"({"a":"x"})", R"({"b":1,"a":"x"})"}},
      {"allOf_single_ref",
       R"({"$defs": {"E": {"enum": ["x", "y"]}}, "allOf": [{"$ref": "#/$defs/E"}],
           "default": "x"})",
       {R"("x")", R"("y")"},
       {R"("z")"}},
      {"array_bounds",
       R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})",
       {"[1,2]", "[1,2,3]"},
       {"[1]", "[1,2,3,4]", "[]", "[1,\"a\"]"}},
      {"array_any", R"({"type": "array"})", {"[]", R"([1,"a",null,{},[true]])"}, {"[,]", "[1,]"}},
      {"prefix_items_closed",
       R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
           "items": false, "minItems": 2})",
       {R"(["a",1])"},
       {R"(["a"])", R"([1,"a"])", R"(["a",1,2])"}},
      {"prefix_items_open",
       R"({"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}],
           "items": {"type": "string"}})",
       {"[]", "[true]", "[true,null]", R"([true,null,"x","y"])"},
       {"[null]", R"([true,"x"])"}},
      {"items_array_draft7",
       R"({"type": "array", "items": [{"const": 1}, {"const": 2}], "additionalItems": false})",
       {"[]", "[1]", "[1,2]"},
       {"[1,2,3]", "[2]"}},
      {"string_lengths",
       R"({"type": "string", "minLength": 2, "maxLength": 4})",
       {R"("ab")", R"("abcd")", R"("é€")", R"("\n\t")", R"("\u00e9x")"},
       // A bounded string holds BMP characters only: its length is the same in code points and
       // in UTF-16 units (JavaScript's String.length, zod's max()).
       {R"("a")", R"("abcde")", "\"a\U0001F600\"", R"("a\ud83d\ude00")"}},
      {"string_unbounded_astral",
       R"({"type": "string"})",
       {"\"a\U0001F600\"", R"("a\ud83d\ude00")"},
       {}},
      {"pattern",
       R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})",
       {R"("AB-123")"},
       {R"("ab-123")", R"("AB-12")", R"("AB-1234")"}},
      {"pattern_escapes",
       R"({"type": "string", "pattern": "^a\"b\\\\c\\n?$"})",
       {R"("a\"b\\c")", R"("a\"b\\c\n")"},
       {R"("a"b\c")", R"("a\"bc")"}},
      {"format_date",
       R"({"type": "string", "format": "date"})",
       {R"("2024-02-29")", R"("2023-12-31")", R"("2000-02-29")"},
       {R"("2023-02-29")", R"("2023-04-31")", R"("2023-13-01")", R"("1900-02-29")"}},
      {"format_time",
       R"({"type": "string", "format": "time"})",
       {R"("23:59:59Z")", R"("00:00:00.123+05:30")"},
       {R"("24:00:00Z")", R"("12:00:00")", R"("12:60:00Z")"}},
      {"format_date_time",
       R"({"type": "string", "format": "date-time"})",
       {R"("2024-01-01T12:00:00Z")", R"("1999-12-31T23:59:59.5-08:00")"},
       {R"("2024-01-01 12:00:00Z")", R"("2024-01-01T12:00:00")"}},
      {"format_uuid",
       R"({"type": "string", "format": "uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")"},
       {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"}},
      {"integer_range",
       R"({"type": "integer", "minimum": -15, "maximum": 307})",
       {"-15", "-1", "0", "9", "10", "99", "100", "299", "307"},
       {"-16", "308", "1000", "400", "-20"}},
      {"integer_exclusive",
       R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100})",
       {"1", "50", "99"},
       {"0", "100", "-1"}},
      {"integer_minimum_only",
       R"({"type": "integer", "minimum": 1000})",
       {"1000", "99999", "1000000"},
       {"999", "-5", "0"}},
      {"integer_negative_range",
       R"({"type": "integer", "minimum": -250, "maximum": -3})",
       {"-3", "-99", "-250", "-100"},
       {"-2", "0", "-251", "3"}},
      {"number_unit_interval",
       R"({"type": "number", "minimum": 0, "maximum": 1})",
       {"0", "0.5", "1", "1.0", "0.999", "0.0"},
       {"1.5", "-0.1", "2", "1.01", "-1"}},
      {"number_positive",
       R"({"type": "number", "exclusiveMinimum": 0})",
       {"0.1", "5", "1234.5", "0.001"},
       {"0", "0.0", "-1", "-0.5"}},
      {"number_rounded_inward",
       R"({"type": "number", "minimum": -2.5, "maximum": 10})",
       {"-2", "-1.5", "10", "0", "9.75", "-0.25"},
       {"-3", "10.5", "11"}},
      {"number_negative_exclusive",
       R"({"type": "number", "exclusiveMaximum": -1})",
       {"-1.5", "-2", "-1000.125"},
       {"-1", "0", "-1.0", "1"}},
      {"number_draft4_exclusive",
       R"({"type": "number", "minimum": 3, "exclusiveMinimum": true, "maximum": 4})",
       {"3.5", "4", "4.000"},
       {"3", "3.0", "4.5"}},
      {"nullable", R"({"type": "string", "nullable": true})", {"null", R"("x")"}, {"1"}},
      {"empty_schema", R"({})", {R"({"a":[1,{}]})", "1.5", "null"}, {"", "nul"}},
      {"true_schema", "true", {"[]", R"("s")"}, {"[", "tru"}},
      {"inferred_object",
       R"({"properties": {"q": {"type": "string"}}, "required": ["q"]})",
       {R"({"q":"x"})"},
       {"{}", R"("x")"}},
      {"escaped_keys",
       R"({"type": "object", "properties": {"a\"b": {"type": "integer"},
           "ключ": {"type": "string"}}, "required": ["a\"b", "ключ"],
           "additionalProperties": false})",
       {R"({"a\"b":1,"ключ":"значение"})"},
       {R"({"ab":1,"ключ":"x"})"}},
      {"openai_strict",
       R"({"type": "object", "properties": {"name": {"type": "string"},
           "steps": {"type": "array", "items": {"type": "object", "properties":
             {"explanation": {"type": "string"}, "output": {"type": "string"}},
             "required": ["explanation", "output"], "additionalProperties": false}},
           "unit": {"type": "string", "enum": ["c", "f"]},
           "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
           "required": ["name", "steps", "unit", "note"], "additionalProperties": false,
           "strict": true})",
       {R"({"name":"n","steps":[{"explanation":"e","output":"o"}],"unit":"c","note":null})",
        R"({"name":"n","steps":[],"unit":"f","note":"x"})"},
       {R"({"name":"n","steps":[],"unit":"k","note":null})",
        R"({"name":"n","steps":[{"output":"o"}],"unit":"c","note":null})"}},
      {"pydantic_union",
       R"({"$defs": {"Cat": {"properties": {"kind": {"const": "cat", "title": "Kind"},
           "lives": {"title": "Lives", "type": "integer"}}, "required": ["kind", "lives"],
           "title": "Cat", "type": "object"}, "Dog": {"properties": {"kind": {"const": "dog"},
           "good": {"default": true, "type": "boolean"}}, "required": ["kind"], "title": "Dog",
           "type": "object"}}, "properties": {"pet": {"discriminator": {"mapping":
           {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}, "propertyName": "kind"},
           "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "title": "Pet"}},
           "required": ["pet"], "title": "Owner", "type": "object",
           "$schema": "https://json-schema.org/draft/2020-12/schema"})",
       {R"({"pet":{"kind":"cat","lives":9}})", R"({"pet":{"kind":"dog"}})",
        R"({"pet":{"kind":"dog","good":false}})"},
       {R"({"pet":{"kind":"cat"}})", R"({"pet":{"kind":"cow"}})"}},
  };
  return cases;
}

std::string Convert(const char* schema, bool any_whitespace = false) {
  absl::StatusOr<std::string> g =
      JsonSchemaToGbnf(ordered_json::parse(schema), JsonGrammarOptions{any_whitespace});
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : "";
}

TEST(JsonSchemaGbnf, ManySchemas) { EXPECT_GE(Cases().size(), 30u); }

TEST(JsonSchemaGbnf, ValidAcceptedInvalidRejected) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const std::string gbnf = Convert(c.schema);
    auto g = Compile(gbnf);
    ASSERT_NE(g, nullptr) << gbnf;
    testing::MiniValidator validator(ordered_json::parse(c.schema));
    for (const std::string& v : c.valid) {
      EXPECT_TRUE(validator.Valid(nlohmann::json::parse(v))) << "bad test data: " << v;
      EXPECT_TRUE(Accepts(g, v)) << v << "\n" << gbnf;
    }
    for (const std::string& v : c.invalid) EXPECT_FALSE(Accepts(g, v)) << v << "\n" << gbnf;
  }
}

TEST(JsonSchemaGbnf, RandomSentencesValidate) {
  std::mt19937 rng(7);
  for (bool any_whitespace : {false, true}) {
    for (const Case& c : Cases()) {
      SCOPED_TRACE(std::string(c.name) + (any_whitespace ? " (whitespace)" : ""));
      const std::string gbnf = Convert(c.schema, any_whitespace);
      auto g = Compile(gbnf);
      ASSERT_NE(g, nullptr) << gbnf;
      testing::MiniValidator validator(ordered_json::parse(c.schema));
      int finished = 0;
      for (int i = 0; i < 20; ++i) {
        std::optional<std::string> s = testing::RandomSentence(g, &rng);
        if (!s) continue;
        ++finished;
        nlohmann::json v = nlohmann::json::parse(*s, nullptr, /*allow_exceptions=*/false);
        ASSERT_FALSE(v.is_discarded()) << "not JSON: " << *s;
        EXPECT_TRUE(validator.Valid(v)) << *s;
        if (!any_whitespace) {
          EXPECT_TRUE(testing::Compact(*s)) << *s;
        }
      }
      EXPECT_GE(finished, 10);
    }
  }
}

// Random schemas: each converts, compiles, and its random sentences validate.
TEST(JsonSchemaGbnf, RandomSchemas) {
  std::mt19937 rng(21);
  int sentences = 0;
  for (int i = 0; i < 150; ++i) {
    const ordered_json schema = testing::RandomSchema(&rng, 3);
    SCOPED_TRACE(schema.dump());
    const bool ws = i % 2 == 1;
    absl::StatusOr<std::string> gbnf = JsonSchemaToGbnf(schema, JsonGrammarOptions{ws});
    ASSERT_TRUE(gbnf.ok()) << gbnf.status();
    auto g = Compile(*gbnf);
    ASSERT_NE(g, nullptr) << *gbnf;
    testing::MiniValidator validator(schema);
    for (int k = 0; k < 5; ++k) {
      std::optional<std::string> s = testing::RandomSentence(g, &rng);
      if (!s) continue;
      ++sentences;
      nlohmann::json v = nlohmann::json::parse(*s, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(v.is_discarded()) << "not JSON: " << *s;
      EXPECT_TRUE(validator.Valid(v)) << *s << "\n" << *gbnf;
    }
  }
  EXPECT_GE(sentences, 500);
}

TEST(JsonSchemaGbnf, Whitespace) {
  const char* schema = R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "array", "items": {"type": "string"}}}, "required": ["a", "b"]})";
  auto compact = Compile(Convert(schema, false));
  auto spaced = Compile(Convert(schema, true));
  const std::string tight = R"({"a":1,"b":["x","y"]})";
  const std::string loose = "{ \"a\": 1,\n  \"b\" : [ \"x\", \"y\" ] }\n";
  EXPECT_TRUE(Accepts(compact, tight));
  EXPECT_FALSE(Accepts(compact, loose));
  EXPECT_TRUE(Accepts(spaced, tight));
  EXPECT_TRUE(Accepts(spaced, loose));
  EXPECT_FALSE(Accepts(spaced, absl::StrCat(" ", tight)));  // only after tokens
  EXPECT_FALSE(Accepts(spaced, "{\"a\":  1,\"b\":[]}"));    // one space at most
  EXPECT_FALSE(
      Accepts(spaced, absl::StrCat("{\"a\":\n", std::string(21, ' '), "1,\"b\":[]}")));  // bounded
}

TEST(JsonSchemaGbnf, LongMaxLengthIsLowered) {
  auto g = Compile(Convert(R"({"type": "string", "maxLength": 5000})"));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Accepts(g, "\"" + std::string(kMaxJsonRepeat, 'a') + "\""));
  EXPECT_FALSE(Accepts(g, "\"" + std::string(kMaxJsonRepeat + 1, 'a') + "\""));
}

TEST(JsonObjectGbnf, AnyObject) {
  for (bool ws : {false, true}) {
    auto g = Compile(JsonObjectGbnf(JsonGrammarOptions{ws}));
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(Accepts(g, "{}"));
    EXPECT_TRUE(Accepts(g, R"({"a":[1,{"b":null}],"c":"d","a":2.5e3})"));
    EXPECT_FALSE(Accepts(g, "[]"));
    EXPECT_FALSE(Accepts(g, "1"));
    EXPECT_FALSE(Accepts(g, R"({"a"})"));
    EXPECT_EQ(Accepts(g, "{ \"a\": 1 }"), ws);
  }
}

// The error names the keyword (or construct) and where it sits.
void ExpectError(const char* schema, const std::vector<std::string>& parts) {
  absl::StatusOr<std::string> g = JsonSchemaToGbnf(ordered_json::parse(schema), {});
  ASSERT_FALSE(g.ok()) << schema << "\n" << *g;
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  for (const std::string& part : parts) {
    EXPECT_NE(g.status().message().find(part), std::string::npos)
        << "\"" << part << "\" not in: " << g.status().message();
  }
}

TEST(JsonSchemaGbnf, UnsupportedKeywordsNamed) {
  ExpectError(R"({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}})",
              {"multipleOf", "#/properties/n/multipleOf"});
  ExpectError(R"({"type": "array", "uniqueItems": true})", {"uniqueItems", "#/uniqueItems"});
  ExpectError(R"({"type": "object", "patternProperties": {"^x": {}}})", {"patternProperties"});
  ExpectError(R"({"not": {"type": "string"}})", {"\"not\"", "#/not"});
  ExpectError(R"({"if": {}, "then": {}})", {"\"if\""});
  ExpectError(R"({"type": "object", "minProperties": 1})", {"minProperties"});
  ExpectError(R"({"type": "array", "contains": {"type": "integer"}})", {"contains"});
  ExpectError(R"({"type": "string", "format": "email"})", {"email", "#/format"});
  ExpectError(R"({"$defs": {"A": {"type": "object", "dependentRequired": {}}},
                  "$ref": "#/$defs/A"})",
              {"dependentRequired", "#/$defs/A/dependentRequired"});
  ExpectError(R"({"type": "string", "pattern": "(a)\\1"})", {"backreference", "#/pattern"});
  ExpectError(R"({"type": "string", "pattern": "(?=a)a"})", {"lookaround"});
}

TEST(JsonSchemaGbnf, AcceptedAnnotationsAndNonConstraints) {
  for (const char* schema : {
           R"({"type": "array", "uniqueItems": false, "title": "t", "description": "d"})",
           R"({"type": "object", "minProperties": 0, "$comment": "c", "examples": [{}]})",
           R"({"$schema": "x", "$id": "y", "strict": true, "default": 1, "type": "integer"})",
           R"({"type": "string", "x-custom": 1, "deprecated": true, "readOnly": true})",
       }) {
    EXPECT_TRUE(JsonSchemaToGbnf(ordered_json::parse(schema), {}).ok()) << schema;
  }
}

TEST(JsonSchemaGbnf, MalformedSchemas) {
  ExpectError("5", {"expected an object or a boolean"});
  ExpectError("false", {"false"});
  ExpectError(R"({"type": "strin"})", {"strin", "#/type"});
  ExpectError(R"({"type": "object", "properties": []})", {"#/properties"});
  ExpectError(R"({"enum": []})", {"enum"});
  ExpectError(R"({"type": "string", "minLength": -1})", {"#/minLength"});
  ExpectError(R"({"type": "string", "minLength": 5000})", {"#/minLength"});
  ExpectError(R"({"type": "string", "minLength": 3, "maxLength": 2})", {"maxLength"});
  ExpectError(R"({"type": "integer", "minimum": 5, "maximum": 4})", {"empty"});
  ExpectError(R"({"type": "number", "minimum": 5, "maximum": 3})", {"no value"});
  ExpectError(R"({"type": "number", "minimum": 0.2, "maximum": 0.8})", {"rounded"});
  ExpectError(R"({"type": "number", "exclusiveMinimum": 2, "exclusiveMaximum": 2})", {"no value"});
  ExpectError(R"({"$ref": "https://example.com/s.json"})", {"$ref", "local"});
  ExpectError(R"({"$ref": "#/$defs/Missing"})", {"does not resolve"});
  ExpectError(R"({"allOf": [{"type": "string"}, {"type": "object"}]})", {"allOf", "object"});
  ExpectError(R"({"type": "object", "properties": {"a": false}, "required": ["a"]})",
              {"#/properties/a", "false"});
  ExpectError(R"({"$ref": "#/$defs/A", "maxLength": 3, "$defs": {"A": {}}})",
              {"maxLength", "$ref"});
}

TEST(JsonSchemaGbnf, RefCyclesThatConsumeNothing) {
  ExpectError(R"({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
                  "$ref": "#/$defs/A"})",
              {"cycle"});
  ExpectError(R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})", {"cycle"});
  // Recursion that consumes something first is fine.
  EXPECT_TRUE(JsonSchemaToGbnf(ordered_json::parse(
                                   R"({"anyOf": [{"type": "array", "items": {"$ref": "#"}},
                                                 {"type": "null"}]})"),
                               {})
                  .ok());
}

TEST(JsonSchemaGbnf, DepthIsBounded) {
  std::string deep = R"({"type": "integer"})";
  for (int i = 0; i < kMaxSchemaDepth + 5; ++i) {
    deep = R"({"type": "array", "items": )" + deep + "}";
  }
  absl::StatusOr<std::string> g = JsonSchemaToGbnf(ordered_json::parse(deep), {});
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("deeper"), std::string::npos) << g.status();
}

TEST(JsonSchemaGbnf, OutputIsBounded) {
  // Each level merges the previous one twice through allOf: the work doubles per level.
  ordered_json schema = {{"$defs", ordered_json::object()}};
  schema["$defs"]["L0"] = {{"type", "object"}, {"properties", {{"p", {{"type", "integer"}}}}}};
  for (int i = 1; i <= 40; ++i) {
    const std::string prev = absl::StrCat("#/$defs/L", i - 1);
    schema["$defs"][absl::StrCat("L", i)] = {
        {"allOf", ordered_json::array({{{"$ref", prev}}, {{"$ref", prev}}})}};
  }
  schema["$ref"] = "#/$defs/L40";
  absl::StatusOr<std::string> g = JsonSchemaToGbnf(schema, {});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted) << g.status();
}

}  // namespace
}  // namespace ss::grammar
