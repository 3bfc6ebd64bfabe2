// The OpenAI Responses API (POST /v1/responses, what Codex CLI speaks) mapped onto the gateway's
// chat completions, as anthropic_api.h does for Anthropic's Messages API.
//
// Request mapping:
//   instructions                       -> a system message (first)
//   input: a string                    -> one user message
//   input items: {role user|system|developer|assistant, content: string | [input_text |
//     output_text parts]} (type "message" optional) -> messages (developer -> system);
//     function_call {call_id, name, arguments} -> an assistant message's tool_calls (consecutive
//     calls join one message); function_call_output {call_id, output} -> a tool message;
//     reasoning {content: [reasoning_text] | summary: [summary_text]} -> the next assistant
//     message's reasoning_content; input_image, input_file and other items -> 400
//   tools [{type: function, name, description, parameters}] -> function tools; a namespace's
//     function tools by their own names; built-in tools (web_search, file_search, ...: Codex
//     always sends web_search) are dropped and reported as ignored
//   tool_choice auto | none | required | {type: function, name}; parallel_tool_calls
//   reasoning {effort} -> reasoning_effort (the chat mapping: none -> chat, else thinking);
//     reasoning.summary is reported as ignored (the reasoning is returned as reasoning_text)
//   text.format {type: text | json_object | json_schema (name, schema, strict)} ->
//     response_format (constrained decoding)
//   max_output_tokens, temperature, top_p, stream -> the same; metadata, user -> labels;
//     store, truncation "disabled" -> accepted; include's values are reported as ignored (reasoning
//     comes in the clear); any other field (prompt_cache_key: the cache is automatic) is reported
//     as ignored
//   previous_response_id -> the stored conversation of that response (ResponseStore) comes first
// Response: {id "resp_...", object "response", status completed | incomplete (max_output_tokens),
// output: [reasoning {content: [reasoning_text]}, message {content: [output_text]},
// function_call {call_id, name, arguments}], usage {input_tokens,
// input_tokens_details.cached_tokens, output_tokens, output_tokens_details.reasoning_tokens (0: not
// counted apart), total_tokens}}. Streams: response.created, response.in_progress, then per item
// response.output_item.added, (content_part.added, output_text.delta..., output_text.done,
// content_part.done | reasoning_text.delta..., reasoning_text.done | function_call_arguments.delta,
// function_call_arguments.done), response.output_item.done, and response.completed with the
// whole response; a failure mid-stream is response.failed. Every event carries sequence_number.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/event_translator.h"
#include "nlohmann/json.hpp"

namespace ss::responses {

using Json = nlohmann::ordered_json;

struct ChatRequest {
  Json body;                         // an OpenAI chat completions request
  std::vector<std::string> ignored;  // fields present but without effect
};

// `previous`: the stored messages of previous_response_id (null: none). A 400 (openai::Invalid,
// naming the field) for what cannot be mapped.
absl::StatusOr<ChatRequest> ToChatRequest(const Json& request, const Json* previous);

// What a response echoes of its request.
struct ResponseMeta {
  std::string id;
  int64_t created_at = 0;
  std::string model;
  Json request;  // the /v1/responses body (instructions, tools, ... are echoed from it)
};

// The gateway's chat.completion (one choice) as a response object.
Json ToResponse(const Json& chat_completion, const ResponseMeta& meta);
// The assistant message of a chat.completion, as a chat message to store for a later turn; its
// content is "" when the message has none (null, or absent: a stream of reasoning or tool calls
// only).
Json AssistantMessage(const Json& chat_completion);

// Translates the gateway's chat.completion.chunk stream into the Responses API's events. Done:
// the open item's done events and response.completed, then `on_done` gets the chat.completion the
// stream amounted to (for the store).
class ResponseStream final : public EventTranslator {
 public:
  ResponseStream(ResponseMeta meta, std::function<void(const Json& completion)> on_done);
  std::string Chunk(const Json& chunk) override;
  std::string Done() override;
  std::string Error(const std::string& message) override;

 private:
  std::string Event(const std::string& type, Json data);
  std::string Open(const std::string& kind);
  std::string Close();
  Json Shell(const char* status) const;

  ResponseMeta meta_;
  int64_t sequence_ = 0;
  bool started_ = false, finished_ = false;
  std::string kind_;  // the open item: "reasoning", "message", "" when none
  std::string item_id_, text_;
  int output_index_ = -1;
  Json output_ = Json::array();
  Json completion_;  // choices[0].message / finish_reason / usage, accumulated
  std::function<void(const Json&)> on_done_;
};

// The conversations of stored responses, for previous_response_id: at most `capacity`, least
// recently used dropped first, and at most `max_bytes` of JSON in all. Thread-safe.
class ResponseStore {
 public:
  ResponseStore(size_t capacity, size_t max_bytes) : capacity_(capacity), max_bytes_(max_bytes) {}
  void Put(const std::string& id, Json messages);
  // The stored messages, or null JSON when unknown (never stored, or dropped).
  Json Get(const std::string& id);

 private:
  struct Entry {
    std::string id;
    Json messages;
    size_t bytes = 0;
  };
  const size_t capacity_, max_bytes_;
  absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ss::responses
