#include "tests/coordinator/fake_engine.h"

#include <algorithm>
#include <utility>

namespace ss {

FakeEngine::~FakeEngine() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
}

void FakeEngine::set_script(std::vector<int32_t> script) {
  absl::MutexLock lock(&mu_);
  options_.script = std::move(script);
}

void FakeEngine::set_fail(bool v, std::string error) {
  absl::MutexLock lock(&mu_);
  fail_error_ = std::move(error);
  fail_.store(v);
}

void FakeEngine::set_script_fn(ScriptFn fn) {
  absl::MutexLock lock(&mu_);
  script_fn_ = std::move(fn);
}

GenerationRequest FakeEngine::last_request() const {
  absl::MutexLock lock(&mu_);
  return last_;
}

TokenLogprobs FakeEngine::FakeLogprobs(int32_t id, int32_t step, int32_t k) {
  TokenLogprobs lp;
  lp.logprob = FakeLogprob(step);
  if (k > 0) lp.top.emplace_back(id, lp.logprob);
  for (int32_t alt = 10, j = 1; j < k; ++alt) {
    if (alt == id) continue;
    lp.top.emplace_back(alt, lp.logprob - static_cast<float>(j));
    ++j;
  }
  return lp;
}

SubmitOutcome FakeEngine::Submit(GenerationRequest request) {
  SubmitOutcome out;
  if (!ready_.load()) {
    out.status = SubmitStatus::kNotReady;
    return out;
  }
  if (overloaded_.load()) {
    out.status = SubmitStatus::kOverloaded;
    out.retry_after_s = 2;
    return out;
  }
  if (!request.cancel) request.cancel = std::make_shared<CancellationToken>();
  auto stream = std::make_shared<GenerationStream>();
  out.stream = stream;
  submitted_.fetch_add(1);
  absl::MutexLock lock(&mu_);
  last_ = request;
  std::vector<int32_t> script = script_fn_      ? script_fn_(request)
                                : options_.echo ? request.prompt
                                                : options_.script;
  const bool fail = fail_.load();
  const auto delay = options_.step_delay;
  threads_.emplace_back([this, stream, script = std::move(script), fail, delay,
                         fail_error = fail_error_, req = std::move(request)] {
    int32_t emitted = 0;
    for (int32_t id : script) {
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      if (req.cancel->cancelled()) {
        cancelled_.fetch_add(1);
        stream->Finish(FinishReason::kCancelled);
        return;
      }
      const auto& stops = req.sampling.stop_token_ids;
      if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
        stream->Finish(FinishReason::kStop);
        return;
      }
      const int32_t k = req.sampling.top_logprobs;
      if (k >= 0) {
        stream->Push({id}, {FakeLogprobs(id, emitted, k)});
      } else {
        stream->Push({id});
      }
      ++emitted;
      if (fail) {
        stream->Finish(FinishReason::kError, fail_error);
        return;
      }
      if (emitted >= req.sampling.max_tokens) {
        stream->Finish(FinishReason::kLength);
        return;
      }
    }
    if (req.cancel->cancelled()) {
      cancelled_.fetch_add(1);
      stream->Finish(FinishReason::kCancelled);
      return;
    }
    stream->Finish(FinishReason::kEos);
  });
  return out;
}

}  // namespace ss
