// The gateway's structured output (coordinator/structured_output.h) on the bundled tiny tokenizer:
// which request fields constrain and how their errors read, and the constraint's masks, including
// thinking mode's free reasoning until </think>.
#include "coordinator/structured_output.h"

#include <string>
#include <vector>

#include "coordinator/dsv4_format.h"
#include "gtest/gtest.h"

namespace ss::openai {
namespace {

class StructuredOutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = Tokenizer::Load(SS_TINY_TOKENIZER);
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = t->release();
  }
  static void TearDownTestSuite() { delete tokenizer_; }

  absl::StatusOr<std::optional<RequestedGrammar>> Grammar(const std::string& body,
                                                          ToolChoice choice = {}) {
    const Json b = Json::parse(body);
    const Json* tools = b.contains("tools") ? &b["tools"] : nullptr;
    return so_.RequestGrammar(b, choice, tools);
  }
  static bool Allowed(const std::vector<uint32_t>& mask, int32_t id) {
    return (mask[id / 32] >> (id % 32)) & 1u;
  }
  int32_t Id(std::string_view token) const { return *tokenizer_->TokenId(token); }

  static inline Tokenizer* tokenizer_ = nullptr;
  StructuredOutput so_{*tokenizer_, 1024};
};

TEST_F(StructuredOutputTest, FieldsThatConstrainAndTheirErrors) {
  for (const char* none : {R"({})", R"({"response_format": {"type": "text"}})",
                           R"({"structured_outputs": {"json_object": false}})"}) {
    auto g = Grammar(none);
    ASSERT_TRUE(g.ok()) << none << ": " << g.status();
    EXPECT_FALSE(g->has_value()) << none;
  }
  const std::pair<const char*, const char*> asks[] = {
      {R"({"response_format": {"type": "json_object"}})", "response_format"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
          {"type": "object", "properties": {"a": {"type": "integer"}}}}}})",
       "response_format"},
      {R"({"structured_outputs": {"regex": "[a-c]+"}})", "structured_outputs.regex"},
      {R"({"structured_outputs": {"json": "{\"type\": \"boolean\"}"}})", "structured_outputs.json"},
      {R"({"guided_choice": ["yes", "no"]})", "guided_choice"},
      {R"({"guided_grammar": "root ::= \"x\"+"})", "guided_grammar"},
  };
  for (const auto& [body, param] : asks) {
    auto g = Grammar(body);
    ASSERT_TRUE(g.ok()) << body << ": " << g.status();
    ASSERT_TRUE(g->has_value()) << body;
    EXPECT_EQ((*g)->param, param);
    EXPECT_TRUE(so_.Constraint(**g, false).ok()) << body;
  }
  const std::pair<const char*, const char*> refused[] = {
      {R"({"response_format": {"type": "xml"}})", "response_format.type"},
      {R"({"response_format": {"type": "json_schema", "json_schema": 5}})",
       "response_format.json_schema"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"schema":
          {"type": "integer", "multipleOf": 3}}}})",
       "multipleOf"},
      {R"({"guided_regex": "(a)\\1"})", "guided_regex"},
      {R"({"guided_choice": []})", "guided_choice"},
      {R"({"structured_outputs": {"structural_tag": "x"}})", "structured_outputs.structural_tag"},
      {R"({"response_format": {"type": "json_object"}, "guided_regex": "a"})", "guided_regex"},
  };
  for (const auto& [body, named] : refused) {
    auto g = Grammar(body);
    ASSERT_FALSE(g.ok()) << body;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(named), std::string_view::npos) << g.status();
  }
  // A grammar that does not compile is refused when the constraint is made.
  auto bad = Grammar(R"({"guided_grammar": "root ::= undefined-rule"})");
  ASSERT_TRUE(bad.ok() && bad->has_value());
  const auto st = so_.Constraint(**bad, false).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("guided_grammar"), std::string_view::npos) << st;
}

TEST_F(StructuredOutputTest, ThinkingReasonsFreelyUntilThinkEndThenFollowsTheGrammar) {
  auto g = Grammar(R"({"guided_choice": ["yes", "no"]})");
  ASSERT_TRUE(g.ok() && g->has_value());
  auto c = so_.Constraint(**g, /*after_reasoning=*/true);
  ASSERT_TRUE(c.ok()) << c.status();
  const int32_t think_end = Id(chat::kThinkingEnd), eos = Id(chat::kEosToken);
  const int32_t user = Id(chat::kUserToken), z = Id("z");
  std::vector<uint32_t> mask(so_.mask_words());
  (*c)->FillAllowed(mask);
  EXPECT_TRUE(Allowed(mask, think_end));
  EXPECT_TRUE(Allowed(mask, z));
  EXPECT_FALSE(Allowed(mask, eos));
  EXPECT_FALSE(Allowed(mask, user));
  EXPECT_FALSE((*c)->Accept(eos));
  EXPECT_TRUE((*c)->Accept(z));
  EXPECT_TRUE((*c)->Accept(think_end));
  // Now "yes" or "no", then EOS.
  (*c)->FillAllowed(mask);
  EXPECT_FALSE(Allowed(mask, think_end));
  EXPECT_FALSE(Allowed(mask, z));
  EXPECT_FALSE(Allowed(mask, eos));
  EXPECT_TRUE(Allowed(mask, Id("y")));
  EXPECT_TRUE(Allowed(mask, Id("n")));
  EXPECT_FALSE((*c)->Accept(z));
  for (const char* t : {"n", "o"}) ASSERT_TRUE((*c)->Accept(Id(t))) << t;
  (*c)->FillAllowed(mask);
  size_t allowed = 0;
  for (int32_t id = 0; id < 1024; ++id) allowed += Allowed(mask, id);
  EXPECT_EQ(allowed, 1u);
  EXPECT_TRUE(Allowed(mask, eos));
  // Chat mode: the grammar from the first id on.
  auto chat = so_.Constraint(**g, false);
  ASSERT_TRUE(chat.ok());
  (*chat)->FillAllowed(mask);
  EXPECT_FALSE(Allowed(mask, think_end));
  EXPECT_TRUE(Allowed(mask, Id("y")));
}

}  // namespace
}  // namespace ss::openai
