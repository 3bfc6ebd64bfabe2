// JSON Schema -> GBNF (OpenAI response_format json_schema, vLLM guided_json) and the grammar of
// any JSON object (response_format json_object).
//
// Every sentence of a generated grammar is a JSON text that validates against the schema, with
// the exceptions listed under "Not exact" below; not every valid instance is a sentence (the
// grammar fixes property order, bounds number digits and string repetition, and so on).
//
// Supported, as OpenAI strict mode, pydantic and zod-to-json-schema emit them:
//   type             string, number, integer, boolean, null, object, array, or an array of these
//                    (each type with the keywords that apply to it)
//   enum, const      any JSON values, written compactly; with `type`, values of other types drop
//   anyOf, oneOf     alternatives; oneOf is read as anyOf: an instance matching several branches
//                    is generated too (Not exact)
//   allOf            one branch alone is that branch; several must all be object schemas and are
//                    merged: properties in order (a property in two branches must have equal
//                    schemas), required united, closed when any branch is closed
//   $ref             "#", "#/$defs/X", "#/definitions/X" and any other local JSON pointer "#/…"
//                    (~0 ~1 and %XX decoded); recursion through refs is fine, a ref cycle that
//                    consumes nothing (A = B = A) is InvalidArgument. Siblings of $ref may only be
//                    annotations.
//   nullable         (OpenAPI) true adds null
//   object           properties in schema order, each optional one may be absent; required names
//                    that are not properties follow the properties with any value;
//                    additionalProperties false or absent: no other keys (absent is read as false,
//                    as vLLM's default backend XGrammar does in strict mode, unless the schema has
//                    no `properties` either: {"type": "object"} is any object); true or a schema:
//                    any number of other keys after the listed ones, with any value / that
//                    schema, keys other than the listed ones' plain spellings
//   array            items (a schema, or false with prefixItems), prefixItems (or draft-7 `items`
//                    array with additionalItems), minItems, maxItems
//   string           minLength, maxLength (code points; a string with either holds characters of
//                    the BMP only, so that its length is the same in UTF-16 units, JavaScript's
//                    String.length, which zod and other clients check), pattern (regex_gbnf.h,
//                    matched as a whole
//                    string), format date, time, date-time (RFC 3339; dates month-aware, leap years
//                    included), uuid; pattern or format together with a length is InvalidArgument
//   integer          minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers or draft-4
//                    booleans), at most 16 digits
//   number           the same bounds, rounded inward to integers (minimum 0.5 generates from 1
//                    on); a bounded number is written without exponent and never as -0
//   no `type`        inferred from the keywords present (object, array, string or number ones),
//                    else any JSON value
// Annotations are accepted and ignored: title, description, examples, default, $schema, $id,
// $anchor, $comment, $defs, definitions, strict, deprecated, readOnly, writeOnly, discriminator,
// contentEncoding, contentMediaType, and unknown keywords (JSON Schema ignores those).
// InvalidArgument naming the keyword and its JSON pointer: multipleOf, uniqueItems: true,
// patternProperties, propertyNames, not, if, then, else, dependentRequired, dependentSchemas,
// dependencies, minProperties, maxProperties, contains, minContains, maxContains,
// unevaluatedProperties, unevaluatedItems, $dynamicRef, $recursiveRef, formats other than the four,
// remote $refs, the `false` schema where a value must be generated, malformed keyword values. A
// schema that is not an object or a boolean is InvalidArgument.
//
// Output text:
//   strings  the JSON string grammar: any code point but `"`, `\` and U+0000–U+001F as itself,
//            escapes \" \\ \/ \b \f \n \r \t \uHHHH (a surrogate only as a high-low pair);
//   numbers  -? (0 | [1-9] up to 15 more digits) (. 1–16 digits)? ([eE] [+-]? 1–2 digits)?
//            (every sentence fits a double);
//   integers -? (0 | [1-9] up to 15 more digits);
//   lengths  minLength/maxLength/minItems/maxItems above kMaxJsonRepeat: a larger maximum is
//            lowered to it (fewer sentences, all valid), a larger minimum is InvalidArgument;
//   spacing  any_whitespace false: none at all (`{"a":1,"b":[1,2]}`); true: after every token
//            one `space ::= | " " | "\n" [ \t]{0,20}` (llama.cpp's), also at the end.
// Not exact: oneOf as anyOf; an allOf merge lets one branch's properties into another branch
// that is closed (JSON Schema would reject them there); enum/const values are not checked
// against sibling keywords (an enum value longer than maxLength is still generated); extra keys
// spelled with escapes may equal a listed key; a pattern's classes (\w, \s, \d) are
// ECMAScript's, other regex engines may differ.
//
// Bounds: the walk recurses once per schema nesting level, at most kMaxSchemaDepth (deeper is
// InvalidArgument); $refs are converted from a queue, not recursively; at most kMaxSchemaSteps
// schema nodes are visited (allOf merges through refs can multiply them), and the output is
// bounded by gbnf_writer.h's limits: both ResourceExhausted.
//
// Thread-compatible: the free functions are pure; a JsonSchemaConverter is used by one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/grammar/gbnf_writer.h"
#include "nlohmann/json.hpp"

namespace ss::grammar {

struct JsonGrammarOptions {
  bool any_whitespace = false;
};

inline constexpr int kMaxSchemaDepth = 64;
inline constexpr int kMaxSchemaSteps = 100000;
inline constexpr int kMaxJsonRepeat = 1000;

// A grammar whose root is a JSON text valid against `schema`. The schema is an ordered_json so
// that properties keep their order (a nlohmann::json converts implicitly, but sorts keys).
absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema,
                                             const JsonGrammarOptions& opts);

// A grammar whose root is any JSON object (values any JSON value).
std::string JsonObjectGbnf(const JsonGrammarOptions& opts);

// The converter behind JsonSchemaToGbnf, for grammars that embed JSON values (dsml_tool_gbnf.h).
class JsonSchemaConverter {
 public:
  struct Options {
    JsonGrammarOptions json;
    // Without any_whitespace: ", " and ": " between tokens, as Python's json.dumps writes.
    bool python_separators = false;
    // Nonzero: a code point never written as itself inside strings (always as \uXXXX), and never
    // in raw string content (StringContent).
    uint32_t avoid = 0;
  };

  // A schema inside a document (the root that "#" pointers resolve against), and its pointer.
  struct SchemaAt {
    const nlohmann::ordered_json* doc = nullptr;
    const nlohmann::ordered_json* schema = nullptr;
    std::string pointer;
  };

  // An object schema's members as the grammar writes them.
  struct ObjectShape {
    struct Property {
      std::string name;
      SchemaAt schema;
      bool required = false;
    };
    std::vector<Property> properties;
    bool additional = false;                    // other keys allowed
    std::optional<SchemaAt> additional_schema;  // their schema, when not any value
  };

  // Rules go to `rules`, which must outlive the converter. The documents passed in must outlive
  // Finish().
  JsonSchemaConverter(const Options& opts, GbnfRules* rules);

  // A GBNF expression for a JSON value valid against `at` (followed by spacing as configured).
  // `rule`, when given, is the rule whose whole body the value is: a $ref to `at` itself names
  // it, and a ref cycle back to it that consumes nothing is found.
  absl::StatusOr<std::string> Value(const SchemaAt& at, absl::string_view hint,
                                    absl::string_view rule = {});
  // `at` after following $refs (at most kMaxSchemaDepth of them).
  absl::StatusOr<SchemaAt> Resolve(const SchemaAt& at);
  // Properties of an object schema (after $ref and allOf): InvalidArgument when it is not one.
  absl::StatusOr<ObjectShape> Object(const SchemaAt& at);
  // When every instance of `at` is a string (type "string", or enum/const of strings only): an
  // expression for the string's raw content (not JSON-escaped, no quotes); std::nullopt
  // otherwise.
  absl::StatusOr<std::optional<std::string>> StringContent(const SchemaAt& at,
                                                           absl::string_view hint);
  // The rule of any JSON object.
  std::string AnyObject() { return Prim("object"); }
  // Converts the schemas $refs pointed to and checks for ref cycles that consume nothing. Call
  // once, after the last Value.
  absl::Status Finish();

 private:
  struct Ctx {
    const nlohmann::ordered_json* doc;
    std::string pointer;
    std::string hint;
    int depth;
    bool leftmost;  // nothing is consumed before this value within the rule being defined
  };

  absl::StatusOr<std::string> Visit(const nlohmann::ordered_json& s, const Ctx& ctx);
  absl::StatusOr<std::string> VisitType(const nlohmann::ordered_json& s, absl::string_view type,
                                        const Ctx& ctx);
  absl::StatusOr<std::string> RefRule(const nlohmann::ordered_json& s, const Ctx& ctx);
  absl::StatusOr<std::string> Enum(const nlohmann::ordered_json& s,
                                   const std::vector<std::string>& types, const Ctx& ctx);
  absl::StatusOr<std::string> ObjectRule(const ObjectShape& shape, const Ctx& ctx);
  absl::StatusOr<std::string> ArrayRule(const nlohmann::ordered_json& s, const Ctx& ctx);
  absl::StatusOr<std::string> StringRule(const nlohmann::ordered_json& s, const Ctx& ctx, bool raw);
  struct Bound {
    bool has = false;
    double value = 0;
    bool exclusive = false;
  };
  // The tightest lower and upper bounds among minimum, maximum and the exclusive ones.
  absl::Status Bounds(const nlohmann::ordered_json& s, const Ctx& ctx, Bound* lo, Bound* hi) const;
  absl::StatusOr<std::string> IntegerRule(const nlohmann::ordered_json& s, const Ctx& ctx);
  absl::StatusOr<std::string> NumberRule(const nlohmann::ordered_json& s, const Ctx& ctx);
  absl::StatusOr<ObjectShape> Shape(const nlohmann::ordered_json& s, const Ctx& ctx);
  absl::StatusOr<std::string> ExtraKey(const ObjectShape& shape, const Ctx& ctx);
  absl::StatusOr<std::string> Literal(const nlohmann::ordered_json& value);
  absl::Status Step(const Ctx& ctx);
  Ctx Child(const Ctx& ctx, absl::string_view key, absl::string_view hint_suffix,
            bool leftmost = false) const;

  // Shared rules, added on first use.
  std::string Space();
  std::string Prim(absl::string_view name);
  std::string Tok(absl::string_view literal) const;  // a literal token + spacing

  Options opts_;
  GbnfRules* rules_;
  std::string ws_;  // " space" or ""
  std::string comma_, colon_;
  absl::flat_hash_map<std::string, std::string> prims_;
  struct Pending {
    const nlohmann::ordered_json* doc;
    const nlohmann::ordered_json* target;
    std::string pointer;
    std::string rule;
  };
  std::vector<Pending> pending_;
  absl::flat_hash_map<std::string, std::string> ref_rules_;      // doc address + pointer -> rule
  std::string current_rule_;                                     // the ref rule being defined
  std::vector<std::pair<std::string, std::string>> left_edges_;  // rule -> rule, at its start
  int steps_ = 0;
};

}  // namespace ss::grammar
