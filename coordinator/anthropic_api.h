// The Anthropic Messages API (POST /v1/messages, what Claude Code speaks) mapped onto the
// gateway's chat completions: a Messages request becomes an OpenAI chat request (the same
// DeepSeek-V4 chat encoding, tool parsing and generation controls), and the chat response or
// stream chunks become Anthropic's message or event sequence.
//
// Request mapping:
//   system (string or text blocks)     -> a system message
//   messages[] with role system (Claude Code sends them between turns) -> appended to the user
//     turn they follow (or a user turn of their own): the template answers only after a user turn
//   messages[].content string | blocks: text -> content; tool_use (assistant) -> tool_calls
//     (arguments = the input as JSON); tool_result (user) -> a tool message each, before the
//     user's text; thinking / redacted_thinking (assistant) -> reasoning_content (dropped from
//     history by the template, as DeepSeek's own is); image, document and other blocks -> 400
//   tools [{name, description, input_schema}] -> function tools; server tools (a `type` other
//     than "custom") -> 400
//   tool_choice {type auto|any|tool|none, name, disable_parallel_tool_use} -> auto | required |
//     the named function | none, parallel_tool_calls
//   thinking {type: enabled, budget_tokens} or {type: adaptive} -> thinking mode (DeepSeek-V4 has
//     no token budget: budget_tokens must be a positive integer and is reported as ignored);
//     disabled or absent -> chat mode; output_config.effort low | medium | high -> the standard
//     effort, max -> DeepSeek-V4's max effort
//   max_tokens (required; lowered to the context the prompt leaves, as Claude Code asks for
//     32,000 whatever the server's context), temperature, top_p, top_k, stop_sequences (<= 4),
//     stream -> the same
//   metadata -> a label; any other field is reported as ignored (X-Ignored-Fields)
// Response mapping: content blocks thinking (reasoning), text, tool_use (input parsed from the
// arguments); stop_reason end_turn | max_tokens | stop_sequence (with stop_sequence) | tool_use;
// usage {input_tokens, output_tokens, cache_read_input_tokens (prefix-cache hits),
// cache_creation_input_tokens 0}. Streams: message_start, then per block content_block_start,
// content_block_delta (text_delta, thinking_delta, input_json_delta), content_block_stop, then
// message_delta (stop_reason, usage) and message_stop; a failure mid-stream is an `error` event.
// Errors: {"type": "error", "error": {"type", "message"}} with Anthropic's types.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/event_translator.h"
#include "nlohmann/json.hpp"

namespace ss::anthropic {

using Json = nlohmann::ordered_json;

struct ChatRequest {
  Json body;                         // an OpenAI chat completions request
  std::vector<std::string> ignored;  // fields present but without effect
};

// A 400 (openai::Invalid, naming the field) for what cannot be mapped.
absl::StatusOr<ChatRequest> ToChatRequest(const Json& messages_request);

// The gateway's chat.completion (one choice) as an Anthropic message with id `id`.
Json ToMessage(const Json& chat_completion, const std::string& id);

// Anthropic's error body for an HTTP status: {"type": "error", "error": {"type", "message"}}.
Json ErrorBody(int status, const std::string& message);

// Translates the gateway's chat.completion.chunk stream into Anthropic's events (SSE text with
// `event:` lines). Done: message_delta / message_stop unless already sent.
class MessageStream final : public EventTranslator {
 public:
  MessageStream(std::string id, std::string model, size_t input_tokens);
  std::string Chunk(const Json& chunk) override;
  std::string Done() override;
  std::string Error(const std::string& message) override;

 private:
  std::string Event(const char* type, const Json& data);
  std::string StartBlock(const char* type, Json block);
  std::string StopBlock();
  std::string Finish(const Json* usage);

  std::string id_, model_;
  size_t input_tokens_ = 0;
  bool started_ = false, stopped_ = false;
  std::string block_;  // the open block's type, "" when none
  int index_ = -1;     // the open (or last) block's index
  std::string stop_reason_ = "end_turn";
  Json stop_sequence_ = nullptr;
};

}  // namespace ss::anthropic
