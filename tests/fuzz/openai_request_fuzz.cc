// Fuzz target: the gateway's request parsing (coordinator/openai_request.h) on arbitrary bodies.
// Invariant: every body is accepted or refused with a status that renders as a 400 — nothing
// throws and nothing crashes; accepted parameters lie in their documented ranges.
#include <cmath>
#include <cstdint>
#include <string>

#include "coordinator/openai_request.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ss::fuzz::Input in(data, size);
  const bool chat = in.Byte() & 1;
  const std::string body_text(in.Rest());
  auto refused = [](const absl::Status& s) {
    const ss::openai::ApiError e = ss::openai::ToApiError(s);
    ss::fuzz::Require(e.status == 400, "a parse error that is not a 400");
    (void)ss::openai::Dump(ss::openai::ErrorBody(e));
    return 0;
  };
  absl::StatusOr<ss::openai::Json> body = ss::openai::ParseBody(body_text);
  if (!body.ok()) return refused(body.status());
  const absl::StatusOr<ss::openai::GenerationParams> p =
      ss::openai::ParseGenerationParams(*body, chat);
  if (!p.ok()) return refused(p.status());
  ss::fuzz::Require(p->sampling.temperature >= 0.0f && p->sampling.temperature <= 2.0f,
                    "temperature out of range");
  ss::fuzz::Require(p->sampling.top_p > 0.0f && p->sampling.top_p <= 1.0f, "top_p out of range");
  ss::fuzz::Require(!p->max_tokens || *p->max_tokens >= 1, "max_tokens < 1");
  ss::fuzz::Require(p->stop.size() <= 4, "more than 4 stop strings");
  ss::fuzz::Require(p->sampling.top_logprobs <= ss::openai::kMaxTopLogprobs,
                    "top_logprobs above the limit");
  ss::chat::EncodeOptions opts;
  if (absl::Status s = ss::openai::ParseThinking(*body, &opts); !s.ok()) return refused(s);
  (void)ss::openai::Dump(*body);  // invalid UTF-8 in strings is replaced, never thrown
  return 0;
}
