#include "coordinator/engine.h"

#include <utility>

namespace ss {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kEos: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

void GenerationStream::Push(std::vector<int32_t> tokens) { Push(std::move(tokens), {}); }

void GenerationStream::Push(std::vector<int32_t> tokens, std::vector<TokenLogprobs> logprobs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_ != FinishReason::kNone) return;
    pending_.insert(pending_.end(), tokens.begin(), tokens.end());
    if (!logprobs.empty()) has_logprobs_ = true;
    if (has_logprobs_) {
      logprobs.resize(tokens.size());
      pending_logprobs_.resize(pending_.size() - tokens.size());
      for (auto& lp : logprobs) pending_logprobs_.push_back(std::move(lp));
    }
  }
  cv_.notify_all();
}

void GenerationStream::Finish(FinishReason reason, std::string error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_ != FinishReason::kNone) return;
    finish_ = reason == FinishReason::kNone ? FinishReason::kError : reason;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

std::optional<GenerationEvent> GenerationStream::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto has_news = [&] {
    return !pending_.empty() || (finish_ != FinishReason::kNone && !finish_delivered_);
  };
  if (!cv_.wait_for(lock, timeout, has_news)) return std::nullopt;
  GenerationEvent event;
  event.tokens.swap(pending_);
  event.logprobs.swap(pending_logprobs_);
  if (finish_ != FinishReason::kNone) {
    event.finish = finish_;
    event.error = error_;
    finish_delivered_ = true;
  }
  return event;
}

}  // namespace ss
