// A deterministic GenerationEngine for the gateway's tests (openai_server_test, fake_gateway).
//
// Every accepted request gets its own thread that delivers the scripted ids one per step
// (`step_delay` apart), stopping early at a stop_token_id (kStop) or max_tokens (kLength) and
// otherwise finishing with kEos. With `echo` the prompt ids are the script. It checks the
// cancellation token before every step and finishes with kCancelled, counting it in
// cancelled_count(). Knobs, all thread-safe and changeable at any time: ready, overloaded
// (Submit refuses with kOverloaded), fail (the stream finishes with kError after the first id,
// with the error string given, "fake engine failure" by default).
//
// Logprobs (sampling.top_logprobs = k >= 0) are made up but deterministic: the id at step i
// (0-based) gets logprob FakeLogprob(i) = -0.25 * (1 + i % 4), and its top list is the id itself
// followed by k - 1 alternatives 10, 11, ... (skipping the id) at FakeLogprob(i) - j for the
// j-th alternative, so it is sorted and every id is a real token of any tokenizer with more than
// 10 + k ids.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/engine.h"

namespace ss {

class FakeEngine : public GenerationEngine {
 public:
  struct Options {
    std::vector<int32_t> script;
    bool echo = false;
    std::chrono::milliseconds step_delay{0};
  };
  // Chooses each request's script (called on the Submit thread, under the engine's lock);
  // when set, it takes precedence over `echo` and `script`.
  using ScriptFn = std::function<std::vector<int32_t>(const GenerationRequest&)>;

  static float FakeLogprob(int32_t step) { return -0.25f * static_cast<float>(1 + step % 4); }
  static TokenLogprobs FakeLogprobs(int32_t id, int32_t step, int32_t k);

  explicit FakeEngine(Options options) : options_(std::move(options)) {}
  ~FakeEngine() override;  // joins every request thread (cancelled ones end at the next step)

  bool Ready() const override { return ready_.load(); }
  SubmitOutcome Submit(GenerationRequest request) override;

  void set_ready(bool v) { ready_.store(v); }
  void set_overloaded(bool v) { overloaded_.store(v); }
  void set_fail(bool v, std::string error = "fake engine failure");
  void set_script(std::vector<int32_t> script);
  void set_script_fn(ScriptFn fn);

  int cancelled_count() const { return cancelled_.load(); }
  int submitted_count() const { return submitted_.load(); }
  // The last accepted request (prompt and sampling as the gateway built them).
  GenerationRequest last_request() const;

 private:
  mutable absl::Mutex mu_;
  Options options_ ABSL_GUARDED_BY(mu_);
  ScriptFn script_fn_ ABSL_GUARDED_BY(mu_);
  std::string fail_error_ ABSL_GUARDED_BY(mu_) = "fake engine failure";
  std::atomic<bool> ready_{true}, overloaded_{false}, fail_{false};
  std::atomic<int> cancelled_{0}, submitted_{0};
  GenerationRequest last_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ss
