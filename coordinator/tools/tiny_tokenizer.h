// The bundled tiny model's tokenizer (models/tiny/tokenizer.json): a byte-level BPE in the format
// of DeepSeek-V4's `tokenizer.json` (same normalizer, pre-tokenizer regexes, post-processor and
// decoder, copied from tests/data/tokenizer/), small enough for a model with 1024 ids (tiny-a).
//
// Layout of the ids (vocab_size = V, 1024 for tiny-a):
//   0, 1, 2          <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, <｜▁pad▁｜>
//                    (as in DeepSeek's file and tiny-a's config: bos_token_id 0, eos_token_id 1)
//   3 .. 258         the 256 single bytes, in the GPT-2 byte-alphabet order DeepSeek uses
//   259 .. V-13      merges learned from the corpus, most frequent pair first
//   V-12 .. V-1      the other DeepSeek-V4 special tokens the chat encoding and the completion
//                    parser use (coordinator/dsv4_format.h, the task tokens of chat_encoding.cc)
// Every special token is an added token (special, not normalized), so it encodes to one id.
//
// Training is deterministic: the corpus is cut by the pre-tokenizer itself (ss::Tokenizer on a
// bytes-only file), and each step merges the pair with the highest count over the pieces, ties
// going to the pair whose token strings sort first. It stops when the ids are used up or no pair
// is left. The output is the JSON text byte for byte, so regenerating it can be checked.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/tokenizer.h"

namespace ss::tools {

// The special tokens of the tiny tokenizer with their ids for a vocabulary of `vocab_size`.
std::vector<AddedToken> TinySpecialTokens(int32_t vocab_size);

// The tokenizer.json text for `corpus` (UTF-8) and `vocab_size` (>= 259 + the special tokens).
absl::StatusOr<std::string> MakeTinyTokenizerJson(std::string_view corpus, int32_t vocab_size);

}  // namespace ss::tools
