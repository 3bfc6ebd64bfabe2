// The fixed strings of the DeepSeek-V4 prompt format (spec §6.1–6.2, `encoding/encoding_dsv4.py`),
// shared by the chat encoder (chat_encoding.h) and the completion parser (completion_parser.h).
//
// Every string here is byte-exact with the official encoder: the bars are U+FF5C `｜`, the
// "spaces" in token names are U+2581 `▁`. Several of them are single special tokens of the
// tokenizer (`<｜User｜>` = 128803, `</think>` = 128822, `｜DSML｜` = 128825, …), but the encoder
// works on text: the prompt string is tokenised afterwards, special tokens matched first.
#pragma once

#include <string_view>

namespace ss::chat {

// "chat": the generation prompt ends with `</think>` and the model answers directly.
// "thinking": the prompt ends with `<think>` and the model reasons first, up to `</think>`.
enum class ThinkingMode { kChat, kThinking };

inline constexpr std::string_view kBosToken = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEosToken = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kThinkingStart = "<think>";
inline constexpr std::string_view kThinkingEnd = "</think>";
inline constexpr std::string_view kDsmlToken = "｜DSML｜";
inline constexpr std::string_view kUserToken = "<｜User｜>";
inline constexpr std::string_view kAssistantToken = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminderToken = "<｜latest_reminder｜>";

// DSML tool-call markup, as `tool_calls_template`, `tool_call_template` and the parameter
// template of the encoder spell it out. The block in an assistant turn is
//   "\n\n<｜DSML｜tool_calls>\n" invokes joined by "\n" "\n</｜DSML｜tool_calls>"
// and the completion parser recognises a block by kToolCallsStart (no closing '>', exactly as
// `parse_message_from_completion_text` does).
inline constexpr std::string_view kToolCallsStart = "\n\n<｜DSML｜tool_calls";
inline constexpr std::string_view kToolCallsOpen = "<｜DSML｜tool_calls>";
inline constexpr std::string_view kToolCallsClose = "</｜DSML｜tool_calls>";
inline constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke";        // + ` name="NAME">`
inline constexpr std::string_view kInvokeClose = "</｜DSML｜invoke";      // + `>`
inline constexpr std::string_view kParameterOpen = "<｜DSML｜parameter";  // + ` name=… string=…>`
inline constexpr std::string_view kParameterClose = "</｜DSML｜parameter";  // + `>`

inline constexpr std::string_view kToolResultOpen = "<tool_result>";
inline constexpr std::string_view kToolResultClose = "</tool_result>";

}  // namespace ss::chat
