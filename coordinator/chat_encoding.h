// DeepSeek-V4 chat encoding: OpenAI-style messages -> the prompt string (spec §6.2).
//
// A C++ port of `encode_messages` from the checkpoint's `encoding/encoding_dsv4.py`; the
// conformance files `golden/encoding/test_output_{1..4}.txt` are reproduced byte for byte. The
// returned string starts with the literal BOS text and must be tokenised WITHOUT adding a BOS.
//
// Pipeline (all of it as in the official encoder):
//  1. Merge tool results into user messages. A `tool` message becomes a `tool_result` block
//     (content, tool_call_id) appended to the previous message when that is a user message,
//     else a new user message. A `user` message becomes a text block appended to the previous
//     user message unless THAT (previous) message has a `task`; otherwise it starts a new user
//     message that keeps only content, `task` and `wo_eos` (so two plain user messages in a row
//     render as one turn, parts joined by "\n\n").
//  2. Re-order the tool_result blocks of each user message (when it has more than one) into the
//     order of the `tool_calls` of the latest assistant message before it, matched by
//     tool_call_id == tool_calls[i].id (a stable sort; unknown ids sort as position 0).
//  3. `drop_thinking` is forced off if any message (after step 1) carries a non-empty `tools`.
//  4. Thinking mode with drop_thinking: before the last user/developer message, assistant
//     messages lose `reasoning_content` and developer messages are removed.
//  5. Render each message and, when it is the last message or is followed by an assistant or
//     latest_reminder message, its transition:
//       system           content [+ "\n\n" TOOLS block] [+ "\n\n## Response Format:…" + schema]
//       developer        <｜User｜> content [+ tools] [+ response format]; content must be
//       non-empty user             <｜User｜> blocks joined by "\n\n"; a tool result is
//                        <tool_result>content</tool_result>
//       latest_reminder  <｜latest_reminder｜> content
//       assistant        [reasoning</think>] content ["\n\n" DSML tool_calls block]
//       <｜end▁of▁sentence｜>
//                        (the reasoning part only in thinking mode, for turns after the last user
//                        message or when not dropping, and not when the previous message has a
//                        task; `wo_eos: true` leaves out the EOS)
//       transition       task action -> <｜Assistant｜> + (<think> thinking | </think> chat) +
//       <｜action｜>
//                        other task  -> its token (<｜query｜>, <｜authority｜>, <｜domain｜>,
//                                       <｜title｜>, <｜read_url｜>)
//                        user/developer -> <｜Assistant｜> + <think> (thinking mode, and the last
//                                       user turn or not dropping) or </think>
//     Message 0 in thinking mode with reasoning_effort "max" is prefixed by the fixed
//     "Reasoning Effort: Absolute maximum…" paragraph. BOS comes first when there is no context.
//
// Input, per message (an object; unknown keys are ignored, e.g. `mask`, `name`):
//   role              "system" | "developer" | "user" | "assistant" | "tool" | "latest_reminder"
//   content           string, null, or an array of {"type": "text", "text": string} parts, joined
//                     by "\n\n" (as DeepSeek's vision encoder joins text blocks). For `tool`
//                     messages non-text parts render as "[Unsupported TYPE]" (as the official
//                     encoder does); elsewhere they are an error (this is a text-only model).
//   reasoning_content string or null (assistant)
//   tool_calls        null or an array of {"id"?, "type"?, "function": {"name", "arguments"}};
//                     arguments is a JSON string (parsed to render the parameters; a string that
//                     is not JSON renders as one string parameter named "arguments", as in the
//                     official encoder) or a JSON object. {"name", "arguments"} without the
//                     "function" wrapper (the form ParseCompletion returns) is accepted too.
//   tools             null or an array of OpenAI tools {"type": "function", "function": {…}};
//                     the "function" objects are rendered, one JSON per line (system/developer)
//   response_format   any JSON; rendered when truthy (system/developer)
//   task              null or "action" | "query" | "authority" | "domain" | "title" | "read_url"
//   tool_call_id      string or null (tool)
//   wo_eos            bool or null (assistant)
// Malformed input is InvalidArgument naming the message and the field, e.g.
//   "messages[3].tool_calls[0].function.name: expected a string, got null".
// Stricter than the official encoder, which ignores some of these until they are rendered: an
// unknown role or task is an error even on a message that would have been dropped.
//
// JSON key order matters (tool schemas and arguments are re-serialised in their given order), so
// the input is a nlohmann::ordered_json.
//
// Depth: the encoder copies and renders (py_json.h) tool schemas, response formats and tool-call
// arguments recursively, one stack frame or so per nesting level. Input from outside must come
// from ParseJsonWithLimits (json_limits.h), which bounds it at kMaxJsonDepth; `arguments` strings
// are parsed here with the same bounds (deeper is InvalidArgument). So no recursion here goes
// deeper than kMaxJsonDepth plus a few levels.
//
// Pure function of its inputs; safe to call from any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/dsv4_format.h"
#include "nlohmann/json.hpp"

namespace ss::chat {

struct EncodeOptions {
  ThinkingMode mode = ThinkingMode::kChat;
  // Thinking mode: drop the reasoning of assistant turns before the last user message (forced
  // off when any message carries tools).
  bool drop_thinking = true;
  // Write the BOS text first (only when there is no context).
  bool add_default_bos_token = true;
  // Unset or "high": nothing; "max": the maximum-effort paragraph before message 0 in thinking
  // mode. Anything else is InvalidArgument.
  std::optional<std::string> reasoning_effort;
  // Write the transition after the last message (the generation prompt `<｜Assistant｜><think>` /
  // `</think>` when it is a user or developer message; a task's token). Hugging Face's and vLLM's
  // add_generation_prompt.
  bool add_generation_prompt = true;
  // The last message must be an assistant message (else InvalidArgument); it is rendered without
  // its EOS, so that generation continues its content (vLLM's continue_final_message, DeepSeek's
  // chat prefix completion).
  bool continue_final_message = false;
  // Messages already encoded earlier (a prefix of the conversation, e.g. held in a prefix cache):
  // they take part in merging, tool-result ordering and thinking-drop decisions but are not
  // rendered, and no BOS is written. Not owned; must outlive the call. Null: no context.
  const nlohmann::ordered_json* context = nullptr;
};

// The prompt string, and which of its bytes the request wrote.
//
// Content is text: a special token's string inside a message (`<｜Assistant｜>`,
// `<｜end▁of▁sentence｜>`, `</think>`, `｜DSML｜`, …) must reach the model as ordinary text, never
// as the control id, or any user could forge turns, roles and tool calls. So the prompt is
// tokenised with Tokenizer::Encode(text, content): special tokens are matched only in the
// template's own text, and the bytes of `content` are pre-tokenised and BPE'd like any other
// text. DeepSeek's API treats message content so; Hugging Face's `split_special_tokens` does it
// for tokens flagged `special`, which DeepSeek's tokenizer.json does not set on `<｜User｜>` and
// `<｜Assistant｜>`, so every added token counts here. When no content holds a special token's
// string, the ids equal those of the whole string tokenised the usual way (the official pipeline).
struct Prompt {
  std::string text;  // byte-identical to EncodeMessages' result
  // Sorted, disjoint, non-adjacent [begin, end) byte ranges of `text` copied from the request:
  // message content and content parts, reasoning_content, tool results, the rendered tool
  // schemas and response formats, tool-call names, parameter names and values. Everything else
  // (BOS/EOS, role and turn markers, <think>/</think>, DSML markup, the fixed paragraphs and
  // separators) is the template's.
  std::vector<std::pair<size_t, size_t>> content;
};

// Encodes `messages` (a JSON array of message objects) into the DeepSeek-V4 prompt.
// To prompt the model for a reply, end the conversation with a user (or developer) message: its
// transition writes the `<｜Assistant｜><think>` / `<｜Assistant｜></think>` generation prompt.
absl::StatusOr<Prompt> EncodePrompt(const nlohmann::ordered_json& messages,
                                    const EncodeOptions& opts);
// EncodePrompt's text alone (the string the conformance files hold).
absl::StatusOr<std::string> EncodeMessages(const nlohmann::ordered_json& messages,
                                           const EncodeOptions& opts);

}  // namespace ss::chat
