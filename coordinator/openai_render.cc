#include "coordinator/openai_render.h"

#include <cmath>
#include <string_view>
#include <utility>

#include "coordinator/utf8.h"

namespace ss::openai {
namespace {

double LogprobValue(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

std::string_view IdBytes(const Tokenizer& tok, int32_t id) {
  auto b = tok.TokenBytes(id);
  return b ? *b : std::string_view();
}

Json ChatLogprobEntry(const Tokenizer& tok, int32_t id, float lp) {
  const std::string_view b = IdBytes(tok, id);
  Json bytes = Json::array();
  for (unsigned char c : b) bytes.push_back(static_cast<int>(c));
  Json j = Json::object();
  j["token"] = utf8::Lossy(b);
  j["logprob"] = LogprobValue(lp);
  j["bytes"] = std::move(bytes);
  return j;
}

// GPT-2's bytes_to_unicode: the code point byte `b` is written as.
uint32_t ByteLevelCodePoint(unsigned char b) {
  const auto printable = [](unsigned c) {
    return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
  };
  if (printable(b)) return b;
  uint32_t n = 0;  // the rank of b among the non-printable bytes
  for (unsigned c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
  return 0x100 + n;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

std::string TokenString(const Tokenizer& tok, int32_t id) {
  const std::string_view b = IdBytes(tok, id);
  if (tok.IsAddedToken(id)) return utf8::Lossy(b);
  std::string out;
  for (unsigned char c : b) AppendUtf8(ByteLevelCodePoint(c), out);
  return out;
}

Json ToolCallJson(const chat::ParsedToolCall& call, const std::string& id, size_t index,
                  bool with_index) {
  Json j = Json::object();
  if (with_index) j["index"] = index;
  j["id"] = id;
  j["type"] = "function";
  Json fn = Json::object();
  fn["name"] = call.name;
  fn["arguments"] = call.arguments;
  j["function"] = std::move(fn);
  return j;
}

Json UsageJson(size_t prompt, size_t completion, size_t cached) {
  Json u = Json::object();
  u["prompt_tokens"] = prompt;
  u["completion_tokens"] = completion;
  u["total_tokens"] = prompt + completion;
  u["prompt_tokens_details"] = Json{{"cached_tokens", cached}};
  return u;
}

Json ChatLogprobs(const Tokenizer& tok, const std::vector<OutputLogprob>& entries) {
  Json content = Json::array();
  for (const auto& e : entries) {
    Json j = ChatLogprobEntry(tok, e.id, e.logprobs.logprob);
    Json top = Json::array();
    for (const auto& [id, lp] : e.logprobs.top) top.push_back(ChatLogprobEntry(tok, id, lp));
    j["top_logprobs"] = std::move(top);
    content.push_back(std::move(j));
  }
  Json out = Json::object();
  out["content"] = std::move(content);
  return out;
}

Json CompletionLogprobs(const Tokenizer& tok, const std::vector<OutputLogprob>& entries) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
       offsets = Json::array();
  for (const auto& e : entries) {
    const std::string token = utf8::Lossy(IdBytes(tok, e.id));
    tokens.push_back(token);
    token_logprobs.push_back(LogprobValue(e.logprobs.logprob));
    Json top = Json::object();
    for (const auto& [id, lp] : e.logprobs.top) {
      const std::string t = utf8::Lossy(IdBytes(tok, id));
      if (!top.contains(t)) top[t] = LogprobValue(lp);
    }
    if (!top.contains(token)) top[token] = LogprobValue(e.logprobs.logprob);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(e.text_offset);
  }
  Json out = Json::object();
  out["tokens"] = std::move(tokens);
  out["token_logprobs"] = std::move(token_logprobs);
  out["top_logprobs"] = std::move(top_logprobs);
  out["text_offset"] = std::move(offsets);
  return out;
}

}  // namespace ss::openai
