// JSON pieces of the OpenAI gateway's responses (openai_server.h): tool calls, usage and
// logprobs in the chat and completions formats. Pure functions of their inputs.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "coordinator/completion_parser.h"
#include "coordinator/openai_request.h"
#include "coordinator/output_text.h"
#include "coordinator/tokenizer.h"

namespace ss::openai {

// {"index"?, "id", "type": "function", "function": {"name", "arguments"}}; `with_index` for
// streamed deltas.
Json ToolCallJson(const chat::ParsedToolCall& call, const std::string& id, size_t index,
                  bool with_index);
// {"prompt_tokens", "completion_tokens", "total_tokens",
//  "prompt_tokens_details": {"cached_tokens"}} (OpenAI's shape; cached: prefix-cache hits).
Json UsageJson(size_t prompt, size_t completion, size_t cached);

// A token as its vocabulary spells it (what Hugging Face's convert_ids_to_tokens returns, vLLM's
// /tokenize token_strs): an added token's text; otherwise its bytes in byte-level BPE's
// byte-to-character mapping (GPT-2's: printable Latin-1 as itself, the other bytes as U+0100 on,
// so a space is "Ġ").
std::string TokenString(const Tokenizer& tok, int32_t id);

// Logprobs as OpenAI renders them. A token's text is its bytes as UTF-8 (lossy: an id can hold
// half a character; `bytes` has the exact bytes). A logprob JSON cannot hold (-inf) is -9999, as
// vLLM writes it.
// Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
Json ChatLogprobs(const Tokenizer& tok, const std::vector<OutputLogprob>& entries);
// Completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}; each
// top_logprobs map holds the k most likely tokens and the sampled one.
Json CompletionLogprobs(const Tokenizer& tok, const std::vector<OutputLogprob>& entries);

}  // namespace ss::openai
