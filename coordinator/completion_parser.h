// DeepSeek-V4 completion parsing: the text the model generated after the prompt -> reasoning,
// content and tool calls (spec §6.2 "Parsing a completion", `parse_message_from_completion_text`
// of `encoding/encoding_dsv4.py`), one-shot and incrementally for streaming.
//
// The grammar, as the official parser reads it:
//   thinking mode:  REASONING "</think>" CONTENT [TOOL_CALLS] [EOS]
//   chat mode:      CONTENT [TOOL_CALLS] [EOS]
//   TOOL_CALLS:     "\n\n<｜DSML｜tool_calls>\n" INVOKE* "</｜DSML｜tool_calls>"
//   INVOKE:         "<｜DSML｜invoke name=\"NAME\">\n" PARAM* "</｜DSML｜invoke>\n"
//   PARAM:          "<｜DSML｜parameter name=\"K\" string=\"true|false\">V</｜DSML｜parameter>\n"
// A tool call's `arguments` is rebuilt as the official parser does, as the JSON text
//   {"K1": V1, "K2": V2}   (Python json.dumps spelling, parameters in their written order)
// where a string="true" value is JSON-quoted and a string="false" value is inserted as written.
//
// Where the official parser raises, this one degrades and never loses text:
//   * no "</think>" in thinking mode: everything is reasoning (e.g. the length limit hit);
//   * a tool-call block that starts in the reasoning (no "</think>" before it) is parsed as
//     tool calls and ends the reasoning;
//   * a block that is malformed or unfinished (no closing tag before EOS / the end) is not a
//     block: its text stays in the reasoning or content it interrupted, and parsing goes on
//     after its opening marker, so a later well-formed block is still found;
//   * text after a closed block is content again (the official parser allows only EOS);
//   * a string="false" value that is not valid JSON is quoted as a JSON string, so `arguments`
//     is always valid JSON;
//   * whitespace after the `>` of the header and closing tags is free (the official parser wants
//     exactly "\n", and rejects the "\n\n" the encoder itself writes for a call without
//     parameters);
//   * special tokens inside reasoning or content (`<think>`, BOS, DSML text that is not a block)
//     are kept as text;
//   * EOS ends the message: text after it is dropped (generation stops on EOS anyway). The text
//     may or may not contain the EOS.
// A tool-call block is all-or-nothing: a block with a duplicate parameter name, a tool or
// parameter name or a value containing `｜DSML｜` (markup gone wrong, e.g. an unclosed parameter
// running into the next block; the official parser would swallow it into the value), or any
// other malformed invoke yields no tool calls at all.
//
// Thread-compatibility: ParseCompletion is a pure function. A CompletionStreamParser belongs to
// one generation stream; calls on one object must not overlap.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/dsv4_format.h"

namespace ss::chat {

struct ParsedToolCall {
  std::optional<std::string> id;  // never set by the parser; the gateway assigns ids
  std::string name;
  std::string arguments;  // a JSON object as text
  bool operator==(const ParsedToolCall&) const = default;
};

struct ParsedCompletion {
  std::string reasoning_content;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool operator==(const ParsedCompletion&) const = default;
};

// `tool_calls` false (OpenAI tool_choice "none"): tool-call markup is ordinary text.
ParsedCompletion ParseCompletion(std::string_view text, ThinkingMode mode, bool tool_calls = true);

// What became certain since the previous call. Deltas concatenate to the one-shot result, and
// the tool calls come whole, in order (their index in the message is the number emitted before).
struct CompletionDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
};

// Incremental parser for streaming: feed the detokenised text as it arrives, in pieces of any
// size, then Finish() once. Whatever the split, the concatenated deltas equal ParseCompletion of
// the whole text.
//
// Text is held back while it may still turn out to be markup: a suffix that is a prefix of
// "</think>" (in the reasoning), "\n\n<｜DSML｜tool_calls" or the EOS text is not emitted until
// the next characters decide it, and a tool-call block is held whole until its closing tag
// (then emitted as tool calls) or until it proves malformed (then emitted as text). Emitted text
// also never ends inside a UTF-8 sequence that the next piece may complete.
class CompletionStreamParser {
 public:
  // `tool_calls` false: tool-call markup is ordinary text (ParseCompletion).
  explicit CompletionStreamParser(ThinkingMode mode, bool tool_calls = true);

  // Appends `text` and returns what became certain. After EOS has been seen, or after
  // Finish(), further text is ignored.
  CompletionDelta Feed(std::string_view text);
  // The end of the stream: releases everything held back (an unfinished tool-call block as
  // text). Idempotent.
  CompletionDelta Finish();

  // True once the EOS text was seen or Finish() was called.
  bool done() const { return phase_ == Phase::kDone; }

 private:
  enum class Phase { kReasoning, kContent, kToolBlock, kDone };

  void Process(bool final, CompletionDelta* out);
  std::string* Channel(Phase phase, CompletionDelta* out) const;

  Phase phase_;
  bool tool_calls_ = true;
  Phase block_return_ = Phase::kContent;  // where a malformed block's text goes back to
  std::string buffer_;                    // text not yet emitted
};

}  // namespace ss::chat
