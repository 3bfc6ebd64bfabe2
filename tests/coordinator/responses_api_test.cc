// The Responses API mapping (coordinator/responses_api.h): what a stream stores for a later turn.
#include "coordinator/responses_api.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace ss::responses {
namespace {

ResponseMeta Meta() {
  return ResponseMeta{"resp_0123", 1, "deepseek-v4", Json{{"reasoning", {{"effort", "high"}}}}};
}

Json Delta(Json delta, Json finish = nullptr) {
  return Json{{"choices", Json::array({Json{{"index", 0},
                                            {"delta", std::move(delta)},
                                            {"finish_reason", std::move(finish)}}})}};
}

// A completion whose message has reasoning and no content (a thinking stream that never reached
// "</think>") is stored with empty content, not with whatever follows the message in memory.
TEST(ResponsesApiTest, AssistantMessageWithoutContent) {
  const Json completion = {{"choices", Json::array({Json{{"message", {{"role", "assistant"}}}}})}};
  Json with_reasoning = completion;
  with_reasoning["choices"][0]["message"]["reasoning_content"] = "thinking";
  EXPECT_EQ(AssistantMessage(with_reasoning),
            (Json{{"role", "assistant"}, {"content", ""}, {"reasoning_content", "thinking"}}));
  EXPECT_EQ(AssistantMessage(completion), (Json{{"role", "assistant"}, {"content", ""}}));
  Json null_content = completion;
  null_content["choices"][0]["message"]["content"] = nullptr;
  EXPECT_EQ(AssistantMessage(null_content), (Json{{"role", "assistant"}, {"content", ""}}));
}

// The streamed path of the e2e "reasoning items" test: reasoning deltas only, then the finish and
// usage chunks; Done() hands the accumulated completion to the store, which keeps the reasoning.
TEST(ResponsesApiTest, ReasoningOnlyStreamIsStoredWithEmptyContent) {
  std::optional<Json> stored;
  ResponseStream stream(Meta(),
                        [&](const Json& completion) { stored = AssistantMessage(completion); });
  std::string events = stream.Chunk(Delta({{"role", "assistant"}, {"content", ""}}));
  events += stream.Chunk(Delta({{"reasoning_content", "Hello! "}}));
  events += stream.Chunk(Delta({{"reasoning_content", "2 + 2 = 4."}}));
  events += stream.Chunk(Delta(Json::object(), "stop"));
  events += stream.Chunk(Json{{"choices", Json::array()},
                              {"usage", {{"prompt_tokens", 3}, {"completion_tokens", 9}}}});
  events += stream.Done();
  EXPECT_NE(events.find("response.reasoning_text.done"), std::string::npos) << events;
  EXPECT_NE(events.find("response.completed"), std::string::npos) << events;
  EXPECT_EQ(events.find("response.output_text"), std::string::npos) << events;
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(
      *stored,
      (Json{{"role", "assistant"}, {"content", ""}, {"reasoning_content", "Hello! 2 + 2 = 4."}}));
}

}  // namespace
}  // namespace ss::responses
