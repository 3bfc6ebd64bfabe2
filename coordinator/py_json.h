// JSON written exactly as Python's `json.dumps(value, ensure_ascii=False)` writes it.
//
// Every JSON text inside a DeepSeek-V4 prompt (tool schemas, the response-format schema, non-string
// tool-call argument values) and the `arguments` string rebuilt by the completion parser is
// produced by the official encoder with that call, so matching the prompt byte for byte means
// matching Python's serialiser:
//   * separators ", " and ": ", no indentation, keys in their stored order (hence
//     nlohmann::ordered_json: a plain nlohmann::json would sort the keys);
//   * strings keep non-ASCII UTF-8 as is; only '"', '\\' and the controls U+0000–U+001F are
//     escaped (\" \\ \n \r \t \b \f, the rest as \u00xx with lower-case hex); DEL is not;
//   * integers in decimal; floats as Python's repr(): the shortest round-trip digits, fixed
//     notation while the decimal exponent is in [-4, 16) ("0.0001", "1e-05",
//     "1000000000000000.0", "1e+16"), a ".0" on integral values; NaN/Infinity/-Infinity.
// Known difference: integers beyond the uint64 range arrive from nlohmann's parser as doubles,
// where Python keeps them exact.
//
// AppendPyJson recurses once per nesting level of `value`: values from outside the process must be
// depth-bounded first (ParseJsonWithLimits, json_limits.h, at kMaxJsonDepth).
//
// Pure functions, safe to call from any thread.
#pragma once

#include <string>
#include <string_view>

#include "nlohmann/json.hpp"

namespace ss::chat {

// Appends the Python serialisation of `value` to `*out`.
void AppendPyJson(const nlohmann::ordered_json& value, std::string* out);
std::string PyJsonDumps(const nlohmann::ordered_json& value);

// Appends `text` (raw bytes, normally UTF-8) as a quoted JSON string, Python-style.
void AppendPyJsonString(std::string_view text, std::string* out);

}  // namespace ss::chat
