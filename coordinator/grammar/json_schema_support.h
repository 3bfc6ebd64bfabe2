// Internal to the JSON Schema converter (json_schema_gbnf.h): the keyword lists it sorts schemas
// by, JSON-pointer and error helpers, local $ref resolution and GBNF repetition. Used by
// json_schema_gbnf.cc and json_schema_objects.cc only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ss::grammar::json_schema {

using Json = nlohmann::ordered_json;

// Keywords that constrain and that this converter does not implement.
inline constexpr absl::string_view kUnsupported[] = {"multipleOf",
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
inline constexpr absl::string_view kConstraining[] = {"type",
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
// The keywords that make a schema without `type` an object, array, string or number one.
inline constexpr absl::string_view kObjectKeywords[] = {"properties", "required",
                                                        "additionalProperties"};
inline constexpr absl::string_view kArrayKeywords[] = {"items", "prefixItems", "additionalItems",
                                                       "minItems", "maxItems"};
inline constexpr absl::string_view kStringKeywords[] = {"minLength", "maxLength", "pattern",
                                                        "format"};
inline constexpr absl::string_view kBoundKeywords[] = {"minimum", "maximum", "exclusiveMinimum",
                                                       "exclusiveMaximum"};

// Whether `key` is one of `list`.
template <size_t N>
bool In(absl::string_view key, const absl::string_view (&list)[N]) {
  return std::find(std::begin(list), std::end(list), key) != std::end(list);
}

// Whether `s` has any keyword of `list`.
template <size_t N>
bool HasAny(const Json& s, const absl::string_view (&list)[N]) {
  for (absl::string_view k : list) {
    if (s.contains(k)) return true;
  }
  return false;
}

// A keyword this converter refuses (one whose value here does not constrain is fine).
bool Unsupported(absl::string_view key, const Json& value);

// `pointer` + "/" + key, the key escaped as a JSON pointer token (~0, ~1).
std::string PointerJoin(absl::string_view pointer, absl::string_view key);

// InvalidArgument "JSON schema at #<pointer>: <what>".
absl::Status Invalid(absl::string_view pointer, absl::string_view what);

// Whether `v` is an instance of the JSON Schema `type` (an integer-valued float is an integer).
bool MatchesType(const Json& v, absl::string_view type);

// The node a local $ref ("#…", a URI fragment holding a JSON pointer) names in `doc`, and the
// decoded pointer. InvalidArgument at `where` for a remote ref or one that does not resolve.
absl::StatusOr<std::pair<const Json*, std::string>> ResolveRef(const Json& doc,
                                                               absl::string_view ref,
                                                               absl::string_view where);

// `alts` as one GBNF alternative group (the expression alone when it is one).
std::string Alternatives(const std::vector<std::string>& alts);

// `x` repeated min..max times (max < 0: unbounded) as GBNF.
std::string Repeat(absl::string_view x, int64_t min, int64_t max);

// Bounds for a generated repetition: a maximum above kMaxJsonRepeat is lowered to it.
absl::Status RepeatBounds(const Json& s, absl::string_view min_key, absl::string_view max_key,
                          absl::string_view ptr, int64_t* min, int64_t* max);

}  // namespace ss::grammar::json_schema
