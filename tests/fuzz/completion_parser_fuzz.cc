// Fuzz target: the completion parser (coordinator/completion_parser.h) on arbitrary model output.
// Invariants: nothing crashes; streaming the text in arbitrary pieces gives exactly the one-shot
// result (the header's promise), and every emitted delta is valid UTF-8 when the input is.
#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/completion_parser.h"
#include "coordinator/utf8.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ss::fuzz::Input in(data, size);
  const ss::chat::ThinkingMode mode =
      in.Byte() & 1 ? ss::chat::ThinkingMode::kThinking : ss::chat::ThinkingMode::kChat;
  // Piece lengths (1..16) come first, one byte each, a 0 byte ending the list; then the text.
  std::vector<size_t> pieces;
  while (pieces.size() < 64) {
    const uint8_t b = in.Byte();
    if (b == 0) break;
    pieces.push_back(1 + b % 16);
  }
  const std::string text(in.Rest());

  const ss::chat::ParsedCompletion whole = ss::chat::ParseCompletion(text, mode);
  ss::chat::CompletionStreamParser parser(mode);
  ss::chat::ParsedCompletion streamed;
  const bool valid_input = (ss::utf8::FirstInvalid(text) == std::string_view::npos);
  auto add = [&](const ss::chat::CompletionDelta& d) {
    if (valid_input) {
      ss::fuzz::Require((ss::utf8::FirstInvalid(d.content) == std::string_view::npos) && (ss::utf8::FirstInvalid(d.reasoning_content) == std::string_view::npos),
                        "a delta of valid UTF-8 input splits a character");
    }
    streamed.reasoning_content += d.reasoning_content;
    streamed.content += d.content;
    for (const auto& c : d.tool_calls) streamed.tool_calls.push_back(c);
  };
  size_t at = 0, k = 0;
  while (at < text.size()) {
    const size_t n = pieces.empty() ? text.size() : pieces[k++ % pieces.size()];
    add(parser.Feed(std::string_view(text).substr(at, n)));
    at += n;
  }
  add(parser.Finish());
  ss::fuzz::Require(parser.done(), "Finish() leaves the parser not done");
  ss::fuzz::Require(streamed == whole, "streamed deltas differ from the one-shot parse");
  return 0;
}
