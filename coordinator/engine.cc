#include "coordinator/engine.h"

#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ss {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kEos:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "error";
}

void GenerationStream::Push(std::vector<int32_t> tokens) { Push(std::move(tokens), {}); }

void GenerationStream::Push(std::vector<int32_t> tokens, std::vector<TokenLogprobs> logprobs) {
  {
    absl::MutexLock lock(&mu_);
    if (finish_ != FinishReason::kNone) return;
    pending_.insert(pending_.end(), tokens.begin(), tokens.end());
    if (!logprobs.empty()) has_logprobs_ = true;
    if (has_logprobs_) {
      logprobs.resize(tokens.size());
      pending_logprobs_.resize(pending_.size() - tokens.size());
      for (auto& lp : logprobs) pending_logprobs_.push_back(std::move(lp));
    }
  }
  cv_.SignalAll();
}

void GenerationStream::Finish(FinishReason reason, std::string error) {
  {
    absl::MutexLock lock(&mu_);
    if (finish_ != FinishReason::kNone) return;
    finish_ = reason == FinishReason::kNone ? FinishReason::kError : reason;
    error_ = std::move(error);
  }
  cv_.SignalAll();
}

void GenerationStream::SetCachedTokens(int64_t tokens) {
  absl::MutexLock lock(&mu_);
  cached_tokens_ = tokens;
}

void GenerationStream::MarkScheduled() {
  absl::MutexLock lock(&mu_);
  if (!scheduled_) scheduled_ = std::chrono::steady_clock::now();
}

bool GenerationStream::HasNews() const {
  return !pending_.empty() || (finish_ != FinishReason::kNone && !finish_delivered_);
}

std::optional<GenerationEvent> GenerationStream::Next(std::chrono::milliseconds timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  absl::MutexLock lock(&mu_);
  while (!HasNews()) {
    if (cv_.WaitWithDeadline(&mu_, deadline) && !HasNews()) return std::nullopt;
  }
  GenerationEvent event;
  event.tokens.swap(pending_);
  event.logprobs.swap(pending_logprobs_);
  event.cached_tokens = cached_tokens_;
  event.scheduled = scheduled_;
  if (finish_ != FinishReason::kNone) {
    event.finish = finish_;
    event.error = error_;
    finish_delivered_ = true;
  }
  return event;
}

}  // namespace ss
