// The grammar of a DeepSeek-V4 DSML tool-call block that forces a call (OpenAI tool_choice
// "required" or a named function), for constrained decoding in chat mode.
//
// The generated text IS the block, nothing before it (in thinking mode the caller applies the
// grammar from the text after `</think>` on), written as the chat encoder writes
// assistant tool calls (chat_encoding.h) and as the completion parser reads them back
// (completion_parser.h):
//   "\n\n<｜DSML｜tool_calls>\n" INVOKE ("\n" INVOKE)* "\n</｜DSML｜tool_calls>"
//   INVOKE: "<｜DSML｜invoke name=\"NAME\">\n" (PARAM "\n")* "</｜DSML｜invoke>"
//           (a tool without properties: "<｜DSML｜invoke name=\"NAME\">\n\n</｜DSML｜invoke>"; when
//           all are optional, one more "\n" may precede the closing tag)
//   PARAM:  "<｜DSML｜parameter name=\"K\" string=\"true\">" RAW "</｜DSML｜parameter>"
//         | "<｜DSML｜parameter name=\"K\" string=\"false\">" JSON "</｜DSML｜parameter>"
// ｜DSML｜ is always the special token (the token terminal <｜DSML｜>, id 128825), never text.
// After the closing tag the root is complete: the matcher then allows the stop tokens only.
// tool_choice "required" (forced_name unset): one or more invokes, each of any tool (exactly one
// when `parallel_tool_calls` is false); a named tool: exactly one invoke of it.
//
// Parameters, per tool: the properties of `parameters` (after $ref/allOf; absent = none) in
// schema order, the required ones always, the optional ones optionally, no other keys. A property
// whose values are all strings (type "string", or an enum/const of strings) is written raw with
// string="true"; an anyOf/oneOf at its top is split into its string branches (raw) and the others
// (JSON); every other property is JSON with string="false" (values as json_schema_gbnf.h
// generates them, with `, ` and `: ` separators as the encoder's json.dumps writes them, or
// llama.cpp-style spacing with any_whitespace). So every sentence parses back (ParseCompletion,
// chat mode) into tool calls whose `arguments` validate against the tool's `parameters` (within
// json_schema_gbnf.h's "Not exact" list).
//
// No text of a sentence contains U+FF5C `｜` outside the markup tokens: raw values exclude it and
// JSON strings write it as \uff5c. The parser rejects a block whose values contain the text
// "｜DSML｜", and the EOS text holds the same character.
//
// `tools` is the OpenAI tools array: {"type": "function", "function": {"name", "parameters"?}}
// (or the function objects themselves). InvalidArgument for an empty or malformed array, a
// forced_name that is not among the tools (the gateway answers 400), a name holding "｜DSML｜",
// a property name holding `" string="` or "｜DSML｜", and for anything json_schema_gbnf.h
// refuses in a schema that must be converted.
//
// Pure function, safe from any thread.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/grammar/json_schema_gbnf.h"
#include "nlohmann/json.hpp"

namespace ss::grammar {

absl::StatusOr<std::string> DsmlToolCallGbnf(const nlohmann::ordered_json& tools,
                                             const std::optional<std::string>& forced_name,
                                             const JsonGrammarOptions& opts,
                                             bool parallel_tool_calls = true);

}  // namespace ss::grammar
