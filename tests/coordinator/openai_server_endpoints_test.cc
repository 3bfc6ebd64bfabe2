// The OpenAI gateway end to end on loopback (openai_server_test_util.h): the routes that generate
// nothing (models, health, ready, tokenize, detokenize, ping, version, load), CORS, request ids,
// API keys and error bodies.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/coordinator/openai_server_test_util.h"

namespace ss::openai_server_test {
namespace {

TEST_F(OpenAiServerTest, ModelsHealthReady) {
  auto r = client_->Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  Json j = Json::parse(r->body);
  EXPECT_EQ(j["data"][0]["id"], "deepseek-v4");
  r = client_->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = client_->Get("/ready");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  engine_->set_ready(false);
  ExpectError(client_->Get("/ready"), 503);
  ExpectError(Post("/v1/chat/completions", ChatBody(false, false).dump()), 503);
}

TEST_F(OpenAiServerTest, CompletionsTokenizeDetokenize) {
  engine_->set_script(Ids(" world!"));
  auto r = Post("/v1/completions", R"({"model":"deepseek-v4","prompt":"Hello","max_tokens":8})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = Json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], " world!");
  EXPECT_EQ(j["usage"]["prompt_tokens"], Ids("Hello").size());

  // vLLM's shapes: /tokenize {prompt} -> {count, max_model_len, tokens, token_strs}.
  r = Post("/tokenize", R"({"model":"deepseek-v4","prompt":"Hello world"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  j = Json::parse(r->body);
  Json ids = Json(Ids("Hello world"));
  EXPECT_EQ(j["tokens"], ids);
  EXPECT_EQ(j["count"], ids.size());
  EXPECT_GT(j["max_model_len"].get<int>(), 0);
  EXPECT_TRUE(j["token_strs"].is_null());
  // token_strs spell the tokens as the vocabulary does (byte-level: a space is U+0120).
  r = Post("/tokenize", R"({"prompt":"Hello world","return_token_strs":true})");
  ASSERT_TRUE(r);
  j = Json::parse(r->body);
  ASSERT_EQ(j["token_strs"].size(), ids.size()) << r->body;
  std::string joined;
  for (const Json& t : j["token_strs"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, "Hello\u0120world") << r->body;
  ExpectError(Post("/tokenize", R"({"prompt":"x","add_special_tokens":true})"), 400,
              "add_special_tokens");
  EXPECT_EQ(Post("/tokenize", R"({"prompt":"x","add_special_tokens":false})")->status, 200);
  // /detokenize {tokens} -> {prompt}.
  Json req = Json::object();
  req["tokens"] = ids;
  r = Post("/detokenize", req.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Json::parse(r->body)["prompt"], "Hello world");
  ExpectError(Post("/detokenize", R"({"tokens":[-1]})"), 400, "tokens");
}

// /ping (open, like /health), /version, /load; CORS per the configured origins; completion ids
// are random (unique across restarts), not a counter.
TEST_F(OpenAiServerTest, PingVersionLoadCorsAndUniqueIds) {
  TearDown();
  GatewayConfig config;
  config.api_keys = {"sk-good"};
  config.version = "9.8.7 (commit abc)";
  config.allowed_origins = {"http://localhost:3000"};
  Start(config);
  const httplib::Headers key{{"Authorization", "Bearer sk-good"}};
  auto r = client_->Get("/ping");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(Post("/ping", "")->status, 200);
  EXPECT_EQ(client_->Get("/version")->status, 401);
  r = client_->Get("/version", key);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(Json::parse(r->body)["version"], "9.8.7 (commit abc)");
  r = client_->Get("/load", key);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(Json::parse(r->body)["server_load"], 0);
  // A preflight from an allowed origin needs no key; one from another origin is refused.
  httplib::Request pre;
  pre.method = "OPTIONS";
  pre.path = "/v1/chat/completions";
  pre.headers = {{"Origin", "http://localhost:3000"},
                 {"Access-Control-Request-Method", "POST"},
                 {"Access-Control-Request-Headers", "authorization, content-type"}};
  r = client_->send(pre);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
  EXPECT_NE(r->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  pre.headers = {{"Origin", "http://evil.example"}, {"Access-Control-Request-Method", "POST"}};
  r = client_->send(pre);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
  // An actual request from the allowed origin carries the headers; another origin's does not.
  engine_->set_script(Ids("ok"));
  httplib::Headers h = key;
  h.emplace("Origin", "http://localhost:3000");
  r = Post("/v1/chat/completions", ChatBody(false, false).dump(), h);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_NE(r->get_header_value("Access-Control-Expose-Headers").find("X-Request-Id"),
            std::string::npos);
  const std::string id1 = Json::parse(r->body)["id"];
  h = key;
  h.emplace("Origin", "http://evil.example");
  r = Post("/v1/chat/completions", ChatBody(false, false).dump(), h);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
  const std::string id2 = Json::parse(r->body)["id"];
  // chatcmpl- and 32 hex digits, different each time.
  EXPECT_EQ(id1.rfind("chatcmpl-", 0), 0u) << id1;
  EXPECT_EQ(id1.size(), 9u + 32u) << id1;
  EXPECT_NE(id1, id2);
  EXPECT_EQ(r->get_header_value("X-Request-Id").size(), 32u);
}

TEST_F(OpenAiServerTest, Errors) {
  engine_->set_script(Ids("ok"));
  ExpectError(Post("/v1/chat/completions", "{not json"), 400);
  ExpectError(Post("/v1/chat/completions", "[1,2]"), 400);
  ExpectError(Post("/v1/chat/completions", "\xff\xfe"), 400);
  auto with = [&](const char* key, Json value) {
    Json b = ChatBody(false, false);
    b[key] = std::move(value);
    return Post("/v1/chat/completions", b.dump());
  };
  ExpectError(with("temperature", "hot"), 400, "temperature");
  ExpectError(with("temperature", 9), 400, "temperature");
  ExpectError(with("max_tokens", -5), 400, "max_tokens");
  ExpectError(with("max_tokens", 1.5), 400, "max_tokens");
  // 0 parses as an unsigned JSON integer: the lower bound must hold for it too (found by
  // tests/fuzz/openai_request_fuzz.cc).
  ExpectError(with("max_tokens", 0), 400, "max_tokens");
  ExpectError(with("max_completion_tokens", 0), 400, "max_completion_tokens");
  ExpectError(with("n", 0), 400, "n");
  ExpectError(with("top_k", "x"), 400, "top_k");
  ExpectError(with("stream", "yes"), 400, "stream");
  ExpectError(with("messages", "hi"), 400, "messages");
  ExpectError(with("messages", Json::array()), 400, "messages");
  ExpectError(with("messages", Json::array({Json{{"role", "wizard"}, {"content", "x"}}})), 400,
              "messages");
  ExpectError(with("stop", 5), 400, "stop");
  ExpectError(with("chat_template_kwargs", Json{{"thinking", "yes"}}), 400,
              "chat_template_kwargs.thinking");
  ExpectError(with("model", 42), 400, "model");
  ExpectError(with("model", "gpt-4"), 404, "model");
  // Too long: prompt + max_tokens > 4096.
  ExpectError(with("max_tokens", 4096), 400, "messages");
  Json big = ChatBody(false, false);
  std::string words;
  for (int i = 0; i < 3000; ++i) words += " hello";
  big["messages"][0]["content"] = words;
  big["max_tokens"] = 2000;  // ~3000 prompt tokens + 2000 > 4096
  auto r = Post("/v1/chat/completions", big.dump());
  ExpectError(r, 400, "messages");
  EXPECT_EQ(Json::parse(r->body)["error"]["code"], "context_length_exceeded");
  // Body over the limit.
  std::string huge(2 << 20, 'a');
  ExpectError(Post("/v1/chat/completions", huge), 413);
  ExpectError(client_->Get("/v1/nothing"), 404);
  // Overload -> 503 with Retry-After.
  engine_->set_overloaded(true);
  r = Post("/v1/chat/completions", ChatBody(false, false).dump());
  ExpectError(r, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "2");
  engine_->set_overloaded(false);
  // Engine failure -> 500.
  engine_->set_fail(true);
  ExpectError(Post("/v1/chat/completions", ChatBody(false, false).dump()), 500);
  engine_->set_fail(false);
  // A valid request right after all that succeeds.
  r = Post("/v1/chat/completions", ChatBody(false, false).dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// ~125k nested `[` (a ~300 KB body) wherever a request may hold JSON: refused with a 400 at parse
// time, and the server keeps serving. Recursive copies and renders of such a value overflowed the
// stack of the handling thread and took the process down.
TEST_F(OpenAiServerTest, DeeplyNestedJsonIsRefused) {
  engine_->set_script(Ids("ok"));
  const std::string deep = std::string(125'000, '[') + std::string(125'000, ']');
  const std::string user = R"({"role":"user","content":"hi"})";
  const std::string head = R"({"model":"deepseek-v4",)";
  const std::string bodies[] = {
      head + R"("messages":[{"role":"user","content":"hi","x":)" + deep + "}]}",
      head + R"("messages":[{"role":"user","content":)" + deep + "}]}",
      head + R"("messages":[)" + user + R"(],"tools":)" + deep + "}",
      head + R"("messages":[)" + user +
          R"(],"tools":[{"type":"function","function":{"name":"f","parameters":)" + deep + "}}]}",
      head + R"("messages":[)" + user + R"(],"response_format":{"type":"json_schema","s":)" + deep +
          "}}",
  };
  for (const std::string& body : bodies) {
    ASSERT_LT(body.size(), 300'000u);
    for (const char* path : {"/v1/chat/completions", "/tokenize"}) {
      auto r = Post(path, body);
      ExpectError(r, 400);
      EXPECT_NE(r->body.find("nested deeper than 64 levels"), std::string::npos) << r->body;
    }
  }
  ExpectError(
      Post("/tokenize", R"({"messages":[{"role":"user","content":"hi","x":)" + deep + "}]}"), 400);
  ExpectError(Post("/detokenize", R"({"ids":)" + deep + "}"), 400);
  ExpectError(Post("/v1/completions", head + R"("prompt":)" + deep + "}"), 400);
  // JSON inside a string: a tool call's `arguments` are parsed with the same bounds.
  Json args = ChatBody(false, false);
  Json call = {{"id", "c1"},
               {"type", "function"},
               {"function", {{"name", "f"}, {"arguments", R"({"a":)" + deep + "}"}}}};
  args["messages"].push_back(
      Json{{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array({call})}});
  args["messages"].push_back(Json{{"role", "user"}, {"content", "and?"}});
  auto r = Post("/v1/chat/completions", args.dump());
  ExpectError(r, 400, "messages");
  EXPECT_NE(r->body.find("arguments: JSON nested deeper than 64 levels"), std::string::npos)
      << r->body;
  // 64 levels are accepted; 65 are not.
  auto nested = [&](int depth) {
    Json b = ChatBody(false, false);
    // The body, `messages` and messages[0] are 3 levels.
    b["messages"][0]["x"] = Json::parse(std::string(depth - 3, '[') + std::string(depth - 3, ']'));
    return Post("/tokenize", b.dump());
  };
  r = nested(64);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  ExpectError(nested(65), 400);
  // Still serving.
  r = Post("/v1/chat/completions", ChatBody(false, false).dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(OpenAiServerTest, ApiKeys) {
  TearDown();
  GatewayConfig config;
  config.api_keys = {"sk-good"};
  Start(config);
  engine_->set_script(Ids("ok"));
  auto r = Post("/v1/chat/completions", ChatBody(false, false).dump());
  ExpectError(r, 401);
  ExpectError(Post("/v1/chat/completions", ChatBody(false, false).dump(),
                   {{"Authorization", "Bearer sk-bad"}}),
              401);
  ExpectError(client_->Get("/v1/models", {{"Authorization", "Bearer sk-bad"}}), 401);
  r = Post("/v1/chat/completions", ChatBody(false, false).dump(),
           {{"Authorization", "Bearer sk-good"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = client_->Get("/health");  // liveness stays open
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// Issue 23 row 11: a server error tells the client a request id and nothing internal (the engine's
// error string named segments, PIDs and workers); the details go to the log under that id. Every
// response carries X-Request-Id; a client's own (of safe characters) is used. Client errors (4xx)
// keep their specific messages.
TEST_F(OpenAiServerTest, ServerErrorsCarryARequestIdAndNoDetails) {
  engine_->set_script(Ids("ok"));
  engine_->set_fail(true, "worker gpu0 (pid 4242): segment /splitserve-4242-experts SECRET");
  auto r = Post("/v1/chat/completions", ChatBody(false, false).dump());
  ExpectError(r, 500);
  const std::string id = r->get_header_value("X-Request-Id");
  EXPECT_FALSE(id.empty());
  for (const char* leak : {"SECRET", "4242", "gpu0", "segment"}) {
    EXPECT_EQ(r->body.find(leak), std::string::npos) << r->body;
  }
  EXPECT_NE(r->body.find(id), std::string::npos) << r->body;
  // Streaming: the in-band error event is just as generic.
  r = Post("/v1/chat/completions", ChatBody(true, false).dump(), {{"X-Request-Id", "client-7.a"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("X-Request-Id"), "client-7.a");
  EXPECT_EQ(r->body.find("SECRET"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("see the server log for request client-7.a"), std::string::npos)
      << r->body;
  engine_->set_fail(false);
  // An id the log could not take verbatim is replaced; every route answers with one.
  r = Post("/v1/chat/completions", ChatBody(false, false).dump(), {{"X-Request-Id", "a b\\"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("X-Request-Id"), "a b\\");
  EXPECT_FALSE(r->get_header_value("X-Request-Id").empty());
  EXPECT_NE(r->get_header_value("X-Request-Id"), id);
  Json b = ChatBody(false, false);
  b["temperature"] = "hot";
  r = Post("/v1/chat/completions", b.dump());
  ExpectError(r, 400, "temperature");
  EXPECT_NE(r->body.find("temperature"), std::string::npos);
  EXPECT_FALSE(r->get_header_value("X-Request-Id").empty());
}

}  // namespace
}  // namespace ss::openai_server_test
