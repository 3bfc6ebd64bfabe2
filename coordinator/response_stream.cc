#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/anthropic_api.h"
#include "coordinator/completion_parser.h"
#include "coordinator/event_translator.h"
#include "coordinator/openai_render.h"
#include "coordinator/openai_server_impl.h"
#include "coordinator/responses_api.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

using gateway::kRequestIdHeader;
using gateway::NowSeconds;
using openai::ApiError;
using openai::ChatLogprobs;
using openai::CompletionLogprobs;
using openai::Dump;
using openai::ErrorBody;
using openai::Json;
using openai::ToApiError;
using openai::ToolCallJson;
using openai::UsageJson;

}  // namespace

struct OpenAiServer::Impl::StreamState {
  Job job;
  std::string request_id;  // X-Request-Id
  std::vector<Choice> choices;
  std::unique_ptr<RequestTimer> timer;  // running until the response (and this) is destroyed
  bool finished = false;                // [DONE] was written
  bool logged = false;                  // its access record was made
  const void* response = nullptr;       // the access log's key
  int64_t created = 0;
  // /v1/messages and /v1/responses: their API's events (null: chat completions' own).
  std::unique_ptr<EventTranslator> events;
};

void OpenAiServer::Impl::Stream(Job job, std::vector<Choice> choices,
                                std::unique_ptr<RequestTimer> timer, httplib::Response& res) {
  auto st = std::make_shared<StreamState>();
  st->timer = std::move(timer);
  st->job = std::move(job);
  st->choices = std::move(choices);
  st->created = NowSeconds();
  st->request_id = res.get_header_value(kRequestIdHeader);
  st->response = &res;
  if (st->job.response) {
    st->events = std::make_unique<responses::ResponseStream>(
        *st->job.response, [this, st = st.get()](const Json& c) { StoreResponse(st->job, c); });
  } else if (st->job.anthropic) {
    st->events = std::make_unique<anthropic::MessageStream>(st->job.id, config.model_name,
                                                            st->job.PromptTokens());
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st](size_t, httplib::DataSink& sink) {
        const bool more = Provide(*st, sink);
        if (!more) {
          CancelAll(st->choices);  // the client went away: stop generating
          st->timer->Abort();
        }
        if ((!more || st->finished) && !st->logged) {
          st->logged = true;
          access.Record(st->response, {st->request_id, st->job.id, st->timer->Summary()});
        }
        return more;
      },
      [st](bool) {
        if (st->finished) return;
        CancelAll(st->choices);  // the client went away (or the server stops)
        st->timer->Abort();
      });
}

Json OpenAiServer::Impl::ChunkBase(const StreamState& st) const {
  Json c = Json::object();
  c["id"] = st.job.id;
  c["object"] = st.job.kind == Kind::kChat ? "chat.completion.chunk" : "text_completion";
  c["created"] = st.created;
  c["model"] = config.model_name;
  return c;
}

// One chunk to the client: an OpenAI `data:` event, or the route's API's events for it.
bool OpenAiServer::Impl::Write(StreamState& st, httplib::DataSink& sink, const Json& chunk) {
  if (!st.events) return WriteEvent(sink, Dump(chunk));
  return WriteText(sink, st.events->Chunk(chunk));
}

bool OpenAiServer::Impl::WriteDone(StreamState& st, httplib::DataSink& sink) {
  if (!st.events) return WriteEvent(sink, "[DONE]");
  return WriteText(sink, st.events->Done());
}

bool OpenAiServer::Impl::WriteText(httplib::DataSink& sink, const std::string& text) {
  return text.empty() || sink.write(text.data(), text.size());
}

bool OpenAiServer::Impl::WriteEvent(httplib::DataSink& sink, const std::string& data) {
  std::string line = absl::StrCat("data: ", data, "\n\n");
  return sink.write(line.data(), line.size());
}

// One chunk of choice `ch` carrying `delta` (chat) or `text` (completions) and the logprobs of
// the ids it completes (when requested); finish_reason null or given.
bool OpenAiServer::Impl::WriteDelta(StreamState& st, Choice& ch, httplib::DataSink& sink,
                                    const chat::CompletionDelta& d, const std::string& text,
                                    const char* finish,
                                    const std::vector<OutputLogprob>& logprobs) {
  const bool with_logprobs = st.job.params.sampling.top_logprobs >= 0 && !logprobs.empty();
  Json c = ChunkBase(st);
  Json choice = Json::object();
  choice["index"] = ch.index;
  if (st.job.kind == Kind::kChat) {
    Json delta = Json::object();
    if (!ch.started) delta["role"] = "assistant";
    if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
    if (!d.content.empty() || !ch.started) delta["content"] = d.content;
    size_t n_calls = d.tool_calls.size();
    if (!st.job.parallel_tool_calls) n_calls = std::min<size_t>(n_calls, ch.tool_calls == 0);
    if (n_calls > 0) {
      Json calls = Json::array();
      for (size_t k = 0; k < n_calls; ++k) {
        const size_t i = ch.tool_calls++;
        calls.push_back(
            ToolCallJson(d.tool_calls[k], CallId(st.job, ch, i), i, /*with_index=*/true));
      }
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = std::move(delta);
    choice["logprobs"] = with_logprobs ? ChatLogprobs(*tokenizer, logprobs) : Json(nullptr);
  } else {
    choice["text"] = text;
    choice["logprobs"] = with_logprobs ? CompletionLogprobs(*tokenizer, logprobs) : Json(nullptr);
  }
  choice["finish_reason"] = finish ? Json(finish) : Json(nullptr);
  if (finish) {
    choice["stop_reason"] = ch.output->stopped() ? Json(ch.output->stop_string()) : Json(nullptr);
  }
  c["choices"] = Json::array({std::move(choice)});
  ch.started = true;
  return Write(st, sink, c);
}

// Released text and logprobs -> one delta chunk (nothing written when it carries nothing).
bool OpenAiServer::Impl::EmitText(StreamState& st, Choice& ch, httplib::DataSink& sink,
                                  const OutputText::Piece& piece, bool final) {
  const std::string& text = piece.text;
  if (st.job.kind == Kind::kCompletion) {
    if (text.empty() && piece.logprobs.empty()) return true;
    return WriteDelta(st, ch, sink, {}, text, nullptr, piece.logprobs);
  }
  chat::CompletionDelta d = ch.parser->Feed(text);
  if (final) {
    chat::CompletionDelta rest = ch.parser->Finish();
    d.reasoning_content += rest.reasoning_content;
    d.content += rest.content;
    for (auto& call : rest.tool_calls) d.tool_calls.push_back(std::move(call));
  }
  if (d.empty() && piece.logprobs.empty()) return true;
  return WriteDelta(st, ch, sink, d, "", nullptr, piece.logprobs);
}

// A piece of choice `ch` as chunks: its text, and once the choice is over its finish chunk.
bool OpenAiServer::Impl::EmitPiece(StreamState& st, Choice& ch, httplib::DataSink& sink,
                                   const OutputText::Piece& piece) {
  const bool over = ch.finish != FinishReason::kNone;
  if (!EmitText(st, ch, sink, piece, over)) return false;
  if (!over || ch.finish == FinishReason::kError || ch.finish == FinishReason::kCancelled) {
    return true;
  }
  std::string reason = FinishReasonName(ch.finish);
  if (ch.tool_calls > 0 && ch.finish != FinishReason::kLength) reason = "tool_calls";
  return WriteDelta(st, ch, sink, {}, "", reason.c_str());
}

// Called repeatedly by httplib until it returns false or calls sink.done().
bool OpenAiServer::Impl::Provide(StreamState& st, httplib::DataSink& sink) {
  for (Choice& ch : st.choices) {
    if (!ch.started && st.job.kind == Kind::kChat) {
      if (!WriteDelta(st, ch, sink, {}, "", nullptr)) return false;  // the role chunk
    }
    if (const std::string& echo = st.job.prompts[ch.prompt].echo; !ch.started && !echo.empty()) {
      if (!WriteDelta(st, ch, sink, {}, echo, nullptr)) return false;
    }
  }
  bool written = true;
  const bool any = Poll(st.choices, *st.timer, [&](Choice& ch, OutputText::Piece piece) {
    written = EmitPiece(st, ch, sink, piece);
    return written;
  });
  if (!written) return false;
  SubmitPending(st.choices);
  if (!any) {
    for (const Choice& ch : st.choices) {
      if (ch.finish == FinishReason::kNone && ch.cancel->cancelled()) return false;
    }
  }
  if (const Choice* failed = Failed(st.choices)) return Fail(st, *failed, sink);  // at once
  if (Outcome(st.choices) == FinishReason::kNone) return true;
  if (st.job.params.include_usage) {
    Json c = ChunkBase(st);
    c["choices"] = Json::array();
    c["usage"] =
        UsageJson(st.job.PromptTokens(), GeneratedTokens(st.choices), CachedTokens(st.choices));
    if (!Write(st, sink, c)) return false;
  }
  st.finished = true;
  if (!WriteDone(st, sink)) return false;
  sink.done();
  return true;
}

// Ends a stream whose choice `ch` failed: the others are cancelled, an error event, [DONE].
bool OpenAiServer::Impl::Fail(StreamState& st, const Choice& ch, httplib::DataSink& sink) {
  CancelAll(st.choices);
  st.timer->Event(0, ch.finish);
  st.finished = true;
  spdlog::error("request {}: generation failed: {}: {}", st.request_id, st.job.id,
                ch.error.empty() ? "cancelled" : ch.error);
  const ApiError e = ToApiError(absl::InternalError(
      absl::StrCat("generation failed; see the server log for request ", st.request_id)));
  if (st.events) {
    if (!WriteText(sink, st.events->Error(e.message))) return false;
  } else {
    if (!WriteEvent(sink, Dump(ErrorBody(e)))) return false;
    if (!WriteEvent(sink, "[DONE]")) return false;
  }
  sink.done();
  return true;
}

}  // namespace ss
