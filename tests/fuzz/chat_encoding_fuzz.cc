// Fuzz target: DeepSeek-V4 chat encoding (coordinator/chat_encoding.h) on arbitrary JSON.
// Invariant: any JSON value gives a prompt or an error, never a crash or an exception.
#include <cstdint>
#include <string>

#include "coordinator/chat_encoding.h"
#include "coordinator/json_limits.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ss::fuzz::Input in(data, size);
  const uint8_t flags = in.Byte();
  // Request JSON reaches the encoder through the bounded parser only (chat_encoding.h, "Depth").
  const auto parsed = ss::ParseJsonWithLimits(in.Rest());
  if (!parsed.ok()) return 0;
  const nlohmann::ordered_json& messages = *parsed;
  ss::chat::EncodeOptions opts;
  opts.mode = flags & 1 ? ss::chat::ThinkingMode::kThinking : ss::chat::ThinkingMode::kChat;
  opts.drop_thinking = flags & 2;
  opts.add_default_bos_token = flags & 4;
  if (flags & 8) opts.reasoning_effort = flags & 16 ? "max" : "high";
  // Half the time the first messages are the context (a prefix encoded earlier).
  nlohmann::ordered_json context, rest = messages;
  if ((flags & 32) && messages.is_array() && messages.size() > 1) {
    const size_t split = flags % messages.size();
    context = nlohmann::ordered_json::array();
    rest = nlohmann::ordered_json::array();
    for (size_t i = 0; i < messages.size(); ++i) (i < split ? context : rest).push_back(messages[i]);
    opts.context = &context;
  }
  (void)ss::chat::EncodeMessages(rest, opts);
  return 0;
}
