// The OpenAI gateway end to end on loopback (openai_server_test_util.h): stop strings, the
// sampling fields that reach the engine or are refused, and logprobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "coordinator/utf8.h"
#include "nlohmann/json.hpp"
#include "tests/coordinator/openai_server_test_util.h"

namespace ss::openai_server_test {
namespace {

// ---- Stop strings ----------------------------------------------------------------------------

// Long enough that the engine is still generating when the stop string shows up.
std::string LongText(const std::string& head) {
  std::string t = head;
  for (int i = 0; i < 1000; ++i) t += " tick";
  return t;
}

TEST_F(OpenAiServerTest, StopStringNonStreamingCancelsTheEngine) {
  const auto script = Ids(LongText("this is 3, this is 4! and then more"));
  Restart(script, std::chrono::milliseconds(2));
  Json body = ChatBody(false, false);
  body["stop"] = Json::array({"never", "is 4"});
  body["max_tokens"] = 2000;
  auto r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = Json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "this is 3, this ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // Usage counts the ids up to the one that completed the stop string.
  const size_t upto = Ids("this is 3, this is 4").size();
  EXPECT_GE(j["usage"]["completion_tokens"].get<size_t>(), upto - 1);
  EXPECT_LE(j["usage"]["completion_tokens"].get<size_t>(), upto);
  WaitCancelled(1);  // the engine's request was cancelled (its KV freed)
}

TEST_F(OpenAiServerTest, StopStringStreamingNeverEmitsPartOfIt) {
  Restart(Ids(LongText("this is 3, this is 4! and then more")), std::chrono::milliseconds(2));
  const std::string want = "this is 3, this ";
  Json body = ChatBody(true, false);
  body["stop"] = "is 4";
  body["max_tokens"] = 2000;
  body["stream_options"] = Json{{"include_usage", true}};
  auto r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto events = Events(r->body);
  std::string so_far;
  for (const auto& ev : events) {
    if (ev == "[DONE]") continue;
    Json c = Json::parse(ev);
    for (const auto& ch : c["choices"]) {
      if (ch["delta"].contains("content")) so_far += ch["delta"]["content"].get<std::string>();
    }
    // Every prefix streamed so far is a prefix of the final text: nothing was taken back.
    EXPECT_EQ(want.compare(0, so_far.size(), so_far), 0) << so_far;
  }
  Streamed s = Concat(events);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.content, want);
  EXPECT_EQ(s.finish, "stop");
  const size_t upto = Ids("this is 3, this is 4").size();
  EXPECT_LE(s.usage["completion_tokens"].get<size_t>(), upto);
  WaitCancelled(1);
}

TEST_F(OpenAiServerTest, IncludeStopStrInOutputReturnsTheStopString) {
  Restart(Ids(LongText("this is 3, this is 4! and then more")), std::chrono::milliseconds(2));
  for (bool stream : {false, true}) {
    Json body = ChatBody(stream, false);
    body["stop"] = "is 4";
    body["include_stop_str_in_output"] = true;
    body["max_tokens"] = 2000;
    auto r = Post("/v1/chat/completions", body.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::string content =
        stream ? Concat(Events(r->body)).content
               : Json::parse(r->body)["choices"][0]["message"]["content"].get<std::string>();
    EXPECT_EQ(content, "this is 3, this is 4") << "stream " << stream;
  }
}

TEST_F(OpenAiServerTest, VllmStopControlsReachTheEngine) {
  Json body = ChatBody(false, false);
  body["ignore_eos"] = true;
  body["stop_token_ids"] = Json::array({5, 7});
  auto r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const GenerationRequest req = engine_->last_request();
  EXPECT_TRUE(req.sampling.ignore_eos);
  EXPECT_EQ(req.sampling.stop_token_ids, (std::vector<int32_t>{5, 7}));
  body = ChatBody(false, false);
  r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  EXPECT_FALSE(engine_->last_request().sampling.ignore_eos);

  auto with = [&](const std::string& key, Json value) {
    Json b = ChatBody(false, false);
    b[key] = std::move(value);
    return Post("/v1/chat/completions", b.dump());
  };
  ExpectError(with("ignore_eos", "yes"), 400, "ignore_eos");
  ExpectError(with("stop_token_ids", 5), 400, "stop_token_ids");
  ExpectError(with("stop_token_ids", Json::array({-1})), 400, "stop_token_ids");
  ExpectError(with("stop_token_ids", Json::array({1.5})), 400, "stop_token_ids");
  ExpectError(with("stop_token_ids", Json(std::vector<int>(65, 1))), 400, "stop_token_ids");
  ExpectError(with("include_stop_str_in_output", 1), 400, "include_stop_str_in_output");
}

TEST_F(OpenAiServerTest, LogitBiasAndMinPReachTheEngine) {
  Json body = ChatBody(false, false);
  body["logit_bias"] = Json{{"7", 100}, {"3", -2.5}};
  body["min_p"] = 0.25;
  auto r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  SamplingParams sp = engine_->last_request().sampling;
  std::sort(sp.logit_bias.begin(), sp.logit_bias.end());
  EXPECT_EQ(sp.logit_bias, (std::vector<std::pair<int32_t, float>>{{3, -2.5f}, {7, 100.0f}}));
  EXPECT_FLOAT_EQ(sp.min_p, 0.25f);

  auto with = [&](const std::string& key, Json value) {
    Json b = ChatBody(false, false);
    b[key] = std::move(value);
    return Post("/v1/chat/completions", b.dump());
  };
  ExpectError(with("logit_bias", Json::array({1})), 400, "logit_bias");
  ExpectError(with("logit_bias", Json{{"x", 1}}), 400, "logit_bias");
  ExpectError(with("logit_bias", Json{{"-1", 1}}), 400, "logit_bias");
  ExpectError(with("logit_bias", Json{{"5", 101}}), 400, "logit_bias");
  ExpectError(with("logit_bias", Json{{"99999999", 1}}), 400, "logit_bias");  // past the vocab
  ExpectError(with("logit_bias", Json{{"5", "up"}}), 400, "logit_bias");
  ExpectError(with("min_p", 1.5), 400, "min_p");
  ExpectError(with("min_p", "low"), 400, "min_p");
}

TEST_F(OpenAiServerTest, PenaltiesAndMinTokensReachTheEngineWithinVllmsRanges) {
  for (const std::string route : {"/v1/chat/completions", "/v1/completions"}) {
    SCOPED_TRACE(route);
    auto post = [&](std::vector<std::pair<std::string, Json>> fields) {
      Json b = route == "/v1/chat/completions" ? ChatBody(false, false)
                                               : Json{{"model", "deepseek-v4"}, {"prompt", "hi"}};
      for (auto& [k, v] : fields) b[k] = std::move(v);
      return Post(route, b.dump());
    };
    auto r = post({{"frequency_penalty", 0.5},
                   {"presence_penalty", -1.25},
                   {"repetition_penalty", 1.3},
                   {"min_tokens", 3},
                   {"max_tokens", 8}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const SamplingParams sp = engine_->last_request().sampling;
    EXPECT_FLOAT_EQ(sp.frequency_penalty, 0.5f);
    EXPECT_FLOAT_EQ(sp.presence_penalty, -1.25f);
    EXPECT_FLOAT_EQ(sp.repetition_penalty, 1.3f);
    EXPECT_EQ(sp.min_tokens, 3);
    r = post({});
    ASSERT_TRUE(r);
    EXPECT_FLOAT_EQ(engine_->last_request().sampling.repetition_penalty, 1.0f);
    EXPECT_EQ(engine_->last_request().sampling.min_tokens, 0);
    ExpectError(post({{"frequency_penalty", 2.5}}), 400, "frequency_penalty");
    ExpectError(post({{"presence_penalty", -3}}), 400, "presence_penalty");
    ExpectError(post({{"presence_penalty", "x"}}), 400, "presence_penalty");
    ExpectError(post({{"repetition_penalty", 0}}), 400, "repetition_penalty");
    ExpectError(post({{"repetition_penalty", -1}}), 400, "repetition_penalty");
    ExpectError(post({{"min_tokens", -1}}), 400, "min_tokens");
    ExpectError(post({{"min_tokens", 9}, {"max_tokens", 8}}), 400, "min_tokens");
  }
}

// Fields splitserve does not implement are refused unless neutral: never accepted and ignored.
TEST_F(OpenAiServerTest, SamplingFieldsWithoutEffectAreRefusedUnlessNeutral) {
  auto post = [&](const std::string& route, const std::string& key, Json value) {
    Json b = route == "/v1/chat/completions" ? ChatBody(false, false)
                                             : Json{{"model", "deepseek-v4"}, {"prompt", "hi"}};
    b[key] = std::move(value);
    return Post(route, b.dump());
  };
  for (const std::string route : {"/v1/chat/completions", "/v1/completions"}) {
    SCOPED_TRACE(route);
    ExpectError(post(route, "length_penalty", 0.5), 400, "length_penalty");
    if (route == "/v1/chat/completions") ExpectError(post(route, "echo", true), 400, "echo");
    ExpectError(post(route, "use_beam_search", true), 400, "use_beam_search");
    for (const auto& [key, neutral] :
         std::vector<std::pair<std::string, Json>>{{"length_penalty", 1},
                                                   {"min_p", 0},
                                                   {"logit_bias", Json::object()},
                                                   {"echo", false}}) {
      auto r = post(route, key, neutral);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 200) << key << ": " << r->body;
    }
  }
  ExpectError(post("/v1/completions", "best_of", 2), 400, "best_of");
}

TEST_F(OpenAiServerTest, StopStringInReasoningAndCompletions) {
  engine_->set_script(Ids("Let me think. STOP here</think>The answer."));
  Json body = ChatBody(false, true);
  body["stop"] = Json::array({"STOP"});
  auto r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = Json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "Let me think. ");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  engine_->set_script(Ids(" world! And more."));
  for (bool stream : {false, true}) {
    Json c = Json::object();
    c["model"] = "deepseek-v4";
    c["prompt"] = "Hello";
    c["stop"] = "!";
    c["stream"] = stream;
    r = Post("/v1/completions", c.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::string text, finish;
    if (!stream) {
      j = Json::parse(r->body);
      text = j["choices"][0]["text"];
      finish = j["choices"][0]["finish_reason"];
    } else {
      for (const auto& ev : Events(r->body)) {
        if (ev == "[DONE]") continue;
        Json chunk = Json::parse(ev);
        text += chunk["choices"][0]["text"].get<std::string>();
        const Json& f = chunk["choices"][0]["finish_reason"];
        if (!f.is_null()) finish = f;
      }
    }
    EXPECT_EQ(text, " world") << stream;
    EXPECT_EQ(finish, "stop") << stream;
  }
  // A stop string that never shows up changes nothing.
  engine_->set_script(Ids("hello there"));
  body = ChatBody(false, false);
  body["stop"] = Json::array({"zzz", "there!"});
  r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  j = Json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "hello there");
}

// ---- Logprobs --------------------------------------------------------------------------------

TEST_F(OpenAiServerTest, ChatLogprobs) {
  const std::string text = "The answer is 4 🎉.";
  const auto ids = Ids(text);
  engine_->set_script(ids);
  Json body = ChatBody(false, false);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  auto r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(engine_->last_request().sampling.top_logprobs, 3);
  Json j = Json::parse(r->body);
  const Json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), ids.size()) << r->body;
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Json& e = content[i];
    const std::string_view tb = *tokenizer_->TokenBytes(ids[i]);
    std::string b;
    for (const auto& x : e["bytes"]) b.push_back(static_cast<char>(x.get<int>()));
    EXPECT_EQ(b, tb);
    bytes += b;
    // Whole characters come as they are; part of one as U+FFFD.
    EXPECT_EQ(e["token"], utf8::Lossy(tb));
    if (utf8::FirstInvalid(tb) == std::string_view::npos) {
      EXPECT_EQ(e["token"], tb);
    }
    EXPECT_EQ(e["logprob"].get<double>(), FakeEngine::FakeLogprob(static_cast<int32_t>(i)));
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
    EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]);
    EXPECT_EQ(e["top_logprobs"][1]["logprob"].get<double>(), e["logprob"].get<double>() - 1);
    EXPECT_TRUE(e["top_logprobs"][1]["bytes"].is_array());
  }
  EXPECT_EQ(bytes, text);

  // Streaming: the chunks' entries concatenate to the same list.
  body["stream"] = true;
  r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  Json streamed = Json::array();
  for (const auto& ev : Events(r->body)) {
    if (ev == "[DONE]") continue;
    Json c = Json::parse(ev);
    const Json& lp = c["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (const auto& e : lp["content"]) streamed.push_back(e);
  }
  EXPECT_EQ(streamed, content);

  // logprobs without top_logprobs: entries with empty top lists; none asked: null.
  body = ChatBody(false, false);
  body["logprobs"] = true;
  r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  j = Json::parse(r->body);
  EXPECT_EQ(engine_->last_request().sampling.top_logprobs, 0);
  ASSERT_EQ(j["choices"][0]["logprobs"]["content"].size(), ids.size());
  EXPECT_TRUE(j["choices"][0]["logprobs"]["content"][0]["top_logprobs"].empty());
  r = Post("/v1/chat/completions", ChatBody(false, false).dump());
  ASSERT_TRUE(r);
  j = Json::parse(r->body);
  EXPECT_EQ(engine_->last_request().sampling.top_logprobs, -1);
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
}

TEST_F(OpenAiServerTest, LogprobsCoverOnlyTheReturnedText) {
  engine_->set_script(Ids("The answer is 4. More text"));
  Json body = ChatBody(false, false);
  body["logprobs"] = true;
  body["stop"] = ". M";
  auto r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = Json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "The answer is 4");
  std::string bytes;
  for (const auto& e : j["choices"][0]["logprobs"]["content"]) {
    for (const auto& x : e["bytes"]) bytes.push_back(static_cast<char>(x.get<int>()));
  }
  EXPECT_EQ(bytes, "The answer is 4");
}

TEST_F(OpenAiServerTest, CompletionLogprobs) {
  const std::string text = " world, again and again";
  engine_->set_script(Ids(text));
  Json body = Json::object();
  body["model"] = "deepseek-v4";
  body["prompt"] = "Hello";
  body["logprobs"] = 2;
  auto r = Post("/v1/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(engine_->last_request().sampling.top_logprobs, 2);
  Json j = Json::parse(r->body);
  const Json& lp = j["choices"][0]["logprobs"];
  const size_t n = Ids(text).size();
  ASSERT_EQ(lp["tokens"].size(), n) << r->body;
  ASSERT_EQ(lp["token_logprobs"].size(), n);
  ASSERT_EQ(lp["top_logprobs"].size(), n);
  ASSERT_EQ(lp["text_offset"].size(), n);
  std::string joined;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(lp["text_offset"][i], joined.size());
    joined += lp["tokens"][i].get<std::string>();
    EXPECT_EQ(lp["token_logprobs"][i].get<double>(), FakeEngine::FakeLogprob(int32_t(i)));
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);  // the sampled id is the first of the top 2
    EXPECT_EQ(lp["top_logprobs"][i][lp["tokens"][i].get<std::string>()], lp["token_logprobs"][i]);
  }
  EXPECT_EQ(joined, text);

  body["stream"] = true;
  r = Post("/v1/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  Json tokens = Json::array(), offsets = Json::array();
  for (const auto& ev : Events(r->body)) {
    if (ev == "[DONE]") continue;
    const Json c = Json::parse(ev);
    const Json& l = c["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const auto& t : l["tokens"]) tokens.push_back(t);
    for (const auto& o : l["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(offsets, lp["text_offset"]);
}

TEST_F(OpenAiServerTest, LogprobsValidation) {
  engine_->set_script(Ids("ok"));
  auto chat = [&](Json extra) {
    Json b = ChatBody(false, false);
    for (auto& [k, v] : extra.items()) b[k] = v;
    return Post("/v1/chat/completions", b.dump());
  };
  ExpectError(chat(Json{{"top_logprobs", 3}}), 400, "top_logprobs");
  ExpectError(chat(Json{{"logprobs", false}, {"top_logprobs", 3}}), 400, "top_logprobs");
  ExpectError(chat(Json{{"logprobs", true}, {"top_logprobs", 21}}), 400, "top_logprobs");
  ExpectError(chat(Json{{"logprobs", true}, {"top_logprobs", -1}}), 400, "top_logprobs");
  ExpectError(chat(Json{{"logprobs", "yes"}}), 400, "logprobs");
  auto r = chat(Json{{"logprobs", true}, {"top_logprobs", 20}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto completion = [&](Json logprobs) {
    Json b = Json::object();
    b["model"] = "deepseek-v4";
    b["prompt"] = "Hi";
    b["logprobs"] = std::move(logprobs);
    return Post("/v1/completions", b.dump());
  };
  ExpectError(completion(21), 400, "logprobs");
  ExpectError(completion(true), 400, "logprobs");
  r = completion(0);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

}  // namespace
}  // namespace ss::openai_server_test
