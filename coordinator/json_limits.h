// Parsing JSON that comes from outside the process, with its nesting depth and size bounded.
//
// nlohmann's parser and destructor are iterative, but copying, comparing and dumping a value
// recurse once per nesting level, and so does every walk of this tree that descends into values
// (py_json.h's AppendPyJson, the chat encoder's copies of tool schemas and arguments). Bounding
// the depth where untrusted JSON enters bounds all of them: every JSON value a request handler
// sees (the request body, and JSON held inside its strings such as tool-call `arguments`) is
// parsed here, so no recursion in request handling goes deeper than kMaxJsonDepth plus the few
// levels the handler builds around it. A JSON text of 125k nested `[` is refused after 64 of them.
//
// Pure functions, safe to call from any thread.
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ss {

// Containers nested inside each other: `[]` is depth 1, `{"a": [1]}` depth 2. OpenAI tool schemas
// and response formats need well under 20; 64 leaves room and keeps recursive walks to a few KiB
// of stack.
inline constexpr int kMaxJsonDepth = 64;
// Values in one text: every scalar, array and object, and every object key. An 8 MiB body holds at
// most ~4M; 2M admits a token-id prompt for a 1M-token context and bounds the parsed value's memory
// (~16 bytes per array element, ~50 per object member) to about 100 MiB.
inline constexpr size_t kMaxJsonValues = size_t{1} << 21;

struct JsonLimits {
  int max_depth = kMaxJsonDepth;
  size_t max_values = kMaxJsonValues;
};

// Parses `text` as one JSON value (keys kept in order). InvalidArgument for malformed JSON;
// ResourceExhausted for a container nested deeper than `limits.max_depth` or more than
// `limits.max_values` values, with a message naming the limit. Time is linear in the text; past a
// limit nothing more is stored, so memory is bounded by the limits.
absl::StatusOr<nlohmann::ordered_json> ParseJsonWithLimits(std::string_view text,
                                                           const JsonLimits& limits = {});

// A value's JSON type for error messages, with its article: "null", "a boolean", "a number",
// "a string", "an array", "an object" ("an unsupported value" for nlohmann's binary and discarded
// values, which no JSON text parses to).
const char* JsonTypeName(const nlohmann::ordered_json& v);

}  // namespace ss
