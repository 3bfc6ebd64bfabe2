// `splitserve tokenize`: the tokenizer as a filter, for scripts and for checking ids by hand.
//
//   splitserve tokenize --tokenizer FILE [--added-tokens FILE] [--decode]
//
// Reads JSON lines on `in` and writes exactly one JSON line per input line on `out`:
//   encode (default): {"text": str}  ->  {"ids": [int, ...]}
//   --decode:         {"ids": [int]} ->  {"text": str}
// A line that cannot be handled (not JSON, missing or mistyped field, invalid UTF-8, unknown
// id) gives {"error": "line N: ..."} and processing goes on. `--added-tokens` takes a file
// ReadAddedTokensFile accepts (e.g. tests/data/tokenizer/v4_added_tokens.json for DeepSeek-V4).
// Flags may be written `--flag value` or `--flag=value`.
//
// Exit status: 0 once the tokenizer is loaded, whatever the lines held; 1 when the tokenizer or
// the added tokens cannot be loaded (message on `err`); 2 on bad usage.
#pragma once

#include <iosfwd>

namespace ss {

// `argv[0]` is the subcommand word ("tokenize").
int RunTokenizeCommand(int argc, char** argv, std::istream& in, std::ostream& out,
                       std::ostream& err);

}  // namespace ss
