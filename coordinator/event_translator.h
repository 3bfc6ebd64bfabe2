// What the gateway's streams go through when a route speaks another API than chat completions
// (anthropic_api.h, responses_api.h): the chat.completion.chunk stream in, that API's
// server-sent events out (the text to write, "" for nothing). One per stream; not thread-safe.
#pragma once

#include <string>

#include "nlohmann/json.hpp"

namespace ss {

class EventTranslator {
 public:
  virtual ~EventTranslator() = default;
  // One chat chunk (the role chunk, deltas, the finish chunk, the usage chunk).
  virtual std::string Chunk(const nlohmann::ordered_json& chunk) = 0;
  // The end of the stream (where chat completions write [DONE]).
  virtual std::string Done() = 0;
  // A failure after the 200 header.
  virtual std::string Error(const std::string& message) = 0;
};

}  // namespace ss
