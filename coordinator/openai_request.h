// Request parsing for the OpenAI gateway (openai_server.h): the JSON body, typed field access
// with OpenAI-style errors, and the generation parameters every generation route shares.
//
// Errors. Every function here reports a client mistake as an absl::Status made by Invalid() or
// ApiStatus(); the gateway's handlers return it and render ToApiError(status) in one place. Its
// code picks the HTTP status (InvalidArgument 400, NotFound 404, Unavailable 503, any other 500)
// and payloads carry the OpenAI `param`, `code` and a Retry-After. Nothing here throws.
// A missing key and a JSON null are the same: absent (std::nullopt).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/chat_encoding.h"
#include "coordinator/engine.h"
#include "nlohmann/json.hpp"

namespace ss::openai {

using Json = nlohmann::ordered_json;

// An OpenAI error response: {"error": {message, type, param, code}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;      // empty: null
  std::string code;       // empty: null
  int retry_after_s = 0;  // > 0: sent as Retry-After
};

// A 400 invalid_request_error naming `param` (empty: none).
absl::Status Invalid(absl::string_view param, absl::string_view message);
// An error with the OpenAI `param` and `code` (empty: null) and, when retry_after_s > 0, a
// Retry-After header. `code` is the absl code that picks the HTTP status (see "Errors").
absl::Status ApiStatus(absl::StatusCode code, absl::string_view message, absl::string_view param,
                       absl::string_view error_code, int retry_after_s = 0);
// The error response for a non-OK status: HTTP status from its code, type "server_error" for a
// 5xx and "invalid_request_error" otherwise, param / code / Retry-After from its payloads.
ApiError ToApiError(const absl::Status& status);
// The error's JSON body.
Json ErrorBody(const ApiError& e);
// Compact JSON; invalid UTF-8 in strings is replaced (U+FFFD), never thrown.
std::string Dump(const Json& j);
const char* TypeName(const Json& j);

// The request body as a JSON object, parsed with json_limits.h's bounds: a 400 for invalid
// JSON, for nesting deeper than kMaxJsonDepth or more than kMaxJsonValues values (the message names
// the limit), and for a non-object. Every value a handler reads from the body is therefore at most
// kMaxJsonDepth deep, which bounds the recursion of copying, dumping and rendering it.
absl::StatusOr<Json> ParseBody(const std::string& text);
// obj[key] when present and not null, else nullptr.
const Json* Field(const Json& obj, const std::string& key);
// Typed optional fields: absent -> nullopt; the wrong type or a value outside [lo, hi] is a 400.
absl::StatusOr<std::optional<double>> GetNumber(const Json& obj, const std::string& key, double lo,
                                                double hi);
absl::StatusOr<std::optional<int64_t>> GetInt(const Json& obj, const std::string& key, int64_t lo,
                                              int64_t hi);
absl::StatusOr<std::optional<bool>> GetBool(const Json& obj, const std::string& key);
absl::StatusOr<std::optional<std::string>> GetString(const Json& obj, const std::string& key);

inline constexpr int64_t kMaxTopLogprobs = 20;
inline constexpr int64_t kMaxStopTokenIds = 64;
inline constexpr int64_t kMaxLogitBias = 300;  // OpenAI's limit
inline constexpr int64_t kMaxChoices = 16;     // n
// /v1/completions' batch of prompts: at most this many choices (prompts x n) in one request.
inline constexpr int64_t kMaxBatchChoices = 256;

// Everything a generation route reads besides its prompt.
struct GenerationParams {
  SamplingParams sampling;                  // sampling.top_logprobs >= 0: logprobs requested
  int n = 1;                                // choices, each its own sequence (seed + i)
  std::optional<int64_t> max_tokens;        // as requested
  std::vector<std::string> stop;            // stop strings (output_text.h)
  bool include_stop_str_in_output = false;  // a matched stop string is returned
  bool stream = false;
  bool include_usage = false;
};

// temperature, top_p, top_k, max_tokens (and max_completion_tokens for chat), seed, n (up to
// kMaxChoices),
// stop, logprobs (chat: a boolean with top_logprobs; completions: an integer), stream,
// stream_options.include_usage, logit_bias ({"id": bias in [-100, 100]}, up to kMaxLogitBias;
// ids past the vocabulary fail the request in the engine), frequency_penalty and
// presence_penalty ([-2, 2]), and vLLM's repetition_penalty (> 0), min_p, min_tokens (checked
// against max_tokens once that is known), ignore_eos, stop_token_ids (ids that end generation,
// not returned) and include_stop_str_in_output. vLLM fields splitserve does not implement
// (length_penalty, best_of, use_beam_search, echo) are accepted at their neutral values and are a
// 400 naming the field otherwise (completions' echo: ParseEcho).
absl::StatusOr<GenerationParams> ParseGenerationParams(const Json& body, bool chat);
// Completions' `echo`: the prompt's text is returned before the completion (the first streamed
// chunk carries it). With logprobs it is a 400 (prompt logprobs are not computed).
absl::StatusOr<bool> ParseEcho(const Json& body, const GenerationParams& params);

// The request's top-level fields that splitserve neither honours nor refuses, in body order:
// anything outside the route's known fields (vLLM logs such fields as "present in the request
// but ignored"; the gateway logs them and names them in the X-Ignored-Fields header). Known
// fields are those this file and the gateway read, plus `user` and `metadata`, which label a
// request and change nothing by their nature.
std::vector<std::string> IgnoredFields(const Json& body, bool chat);

// Chat template controls: add_generation_prompt (default true), continue_final_message (default
// false; with it add_generation_prompt defaults to false, and true is a 400 as vLLM has it) and
// DeepSeek's `prefix: true` on the final assistant message (chat prefix completion: the same as
// continue_final_message; on any other message it is a 400).
absl::Status ParseTemplateControls(const Json& body, const Json& messages,
                                   chat::EncodeOptions* opts);

// OpenAI's tool_choice: "auto" (the default), "none" (tools are neither rendered nor parsed),
// "required" or {"type": "function", "function": {"name": N}} (a call is forced). `tools` is the
// request's tools array (null: none). A named tool that is not among the tools, or required /
// named without tools, is a 400.
struct ToolChoice {
  enum Kind { kAuto, kNone, kRequired, kNamed };
  Kind kind = kAuto;
  std::string name;  // kNamed
};
absl::StatusOr<ToolChoice> ParseToolChoice(const Json& body, const Json* tools);

// Thinking mode and reasoning effort from a top-level reasoning_effort, as OpenAI spells it, then
// chat_template_kwargs (thinking / enable_thinking / thinking_mode / reasoning_effort), which
// override it. OpenAI's reasoning_effort maps onto DeepSeek-V4's modes: "none" -> chat mode (no
// reasoning); "minimal", "low", "medium", "high" -> thinking mode at the standard effort;
// "xhigh" and DeepSeek's "max" -> thinking mode at maximum effort (the encoder's "max"
// paragraph). Any other value is a 400. chat_template_kwargs.reasoning_effort takes the
// encoder's own values (unset, "high", "max").
absl::Status ParseThinking(const Json& body, chat::EncodeOptions* opts);

}  // namespace ss::openai
