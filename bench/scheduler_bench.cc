// Step-planning overhead of the coordinator's scheduler: microseconds per Step() + Complete()
// with 64 running sequences and 1000 waiting requests, on DeepSeek-V4-Flash's KV cost model
// (128-token blocks, 8 window blocks per sequence since 2026-11-30 (32 before), a 24 GB pool), as
// ratios to two baselines measured in the same run: std::sort of 64 shuffled ints, and one Step()
// of an empty scheduler.
//
//   decode64        64 sequences decoding (prompt 1000), 1000 waiting behind max_running = 64
//   decode64-pp4    the same with 4 micro-batches in flight (16 sequences each)
//   churn64         64 running with short outputs (prompt 200, 32 new): every step some finish,
//                   waiting ones are admitted and prefilled in chunks; finished ones resubmit
//
//   build/bin/scheduler_bench [--iters N] [--repeats N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <vector>

#include "common/model_config.h"
#include "coordinator/kv_accounting.h"
#include "coordinator/scheduler.h"
#include "tests/tools/test_configs.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace ss::sched;

// DeepSeek-V4-Flash's config.json (tests/tools/test_configs.h).
ss::ModelConfig FlashConfig() {
  auto c = ss::ParseModelConfig(ss::testing_util::kFlashConfig, "Flash config.json");
  if (!c.ok()) std::abort();
  return *c;
}

template <typename F>
double BestSeconds(int repeats, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

struct Scenario {
  const char* name;
  int64_t micro_batches;
  int64_t prompt;
  int64_t max_new;
};

// A scheduler in steady state: 64 running (past their prefill when max_new is long), 1000
// waiting. Completions come back in plan order, the oldest micro-batch first.
class Loop {
 public:
  Loop(const Scenario& sc, const KvCostModel& cost, int64_t blocks) : sc_(sc) {
    SchedulerConfig config{.max_model_len = 1 << 20,
                           .max_tokens_per_step = 2048,
                           .max_running = 64,
                           .max_waiting = 2000,
                           .num_micro_batches = sc.micro_batches};
    auto s = Scheduler::Create(config, cost, blocks);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
      std::exit(1);
    }
    s_.emplace_back(*std::move(s));
    for (int i = 0; i < 1064; ++i) Submit();
    plans_.resize(static_cast<size_t>(sc.micro_batches));
    for (int i = 0; i < 200; ++i) Iterate();  // prefill everything running
  }

  // One pipeline beat: plan a micro-batch; when all are in flight, complete the oldest.
  void Iterate() {
    Scheduler& s = s_[0];
    // Never one of the in-flight plans: fewer than micro_batches are in flight here.
    StepPlan& plan = plans_[next_ % plans_.size()];
    const bool planned = s.Step(&plan) == StepOutcome::kPlanned;
    if (planned) {
      ++next_;
      in_flight_.push_back(&plan);
      ++steps_;
      decodes_ += static_cast<int64_t>(plan.decode.size());
      prefill_tokens_ += plan.num_tokens() - static_cast<int64_t>(plan.decode.size());
    }
    if (static_cast<int64_t>(in_flight_.size()) >= sc_.micro_batches ||
        (!planned && !in_flight_.empty())) {
      const StepPlan* done = in_flight_.front();
      in_flight_.pop_front();
      results_.clear();
      for (const DecodeEntry& e : done->decode) results_.push_back({e.id, 7});
      for (const PrefillChunk& c : done->prefill) {
        if (c.samples) results_.push_back({c.id, 7});
      }
      events_.clear();
      if (!s.Complete(done->micro_batch_id, results_, &events_).ok()) std::abort();
      for (const TokenEvent& ev : events_) {
        if (ev.finish != FinishReason::kNone) Submit();
      }
    }
  }

  int64_t running() const { return s_[0].num_running(); }
  int64_t waiting() const { return s_[0].num_waiting(); }
  void ResetStats() { steps_ = decodes_ = prefill_tokens_ = 0; }
  double decodes_per_step() const { return static_cast<double>(decodes_) / steps_; }
  double prefill_per_step() const { return static_cast<double>(prefill_tokens_) / steps_; }

 private:
  void Submit() {
    if (s_[0].Submit({next_id_++, sc_.prompt, sc_.max_new, {}, true}) != SubmitOutcome::kQueued) {
      std::abort();
    }
  }

  Scenario sc_;
  std::vector<Scheduler> s_;  // a vector: Scheduler has no default constructor
  std::vector<StepPlan> plans_;
  std::deque<const StepPlan*> in_flight_;
  std::vector<SampledToken> results_;
  std::vector<TokenEvent> events_;
  uint64_t next_ = 0;
  RequestId next_id_ = 1;
  int64_t steps_ = 0, decodes_ = 0, prefill_tokens_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 20000, repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
  }
  auto cost = KvCostModel::FromModelConfig(FlashConfig());
  if (!cost.ok()) return 1;
  const int64_t blocks = cost->BlocksInPool(24'000'000'000);
  std::printf("cost model: %s, pool %lld blocks\n", cost->DebugString().c_str(),
              static_cast<long long>(blocks));

  // Baseline 1: sort 64 shuffled ints.
  std::vector<int> shuffled(64), work(64);
  std::iota(shuffled.begin(), shuffled.end(), 0);
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(1));
  volatile int sink = 0;
  const double sort_us = 1e6 / iters * BestSeconds(repeats, [&] {
                           for (int i = 0; i < iters; ++i) {
                             work = shuffled;
                             std::sort(work.begin(), work.end());
                             sink = sink + work[static_cast<size_t>(i) & 63];
                           }
                         });
  // Baseline 2: one Step() of an empty scheduler.
  auto empty = Scheduler::Create(
      {.max_model_len = 1 << 20, .max_tokens_per_step = 2048, .max_running = 64}, *cost, blocks);
  if (!empty.ok()) return 1;
  StepPlan plan;
  const double empty_us = 1e6 / iters * BestSeconds(repeats, [&] {
                            for (int i = 0; i < iters; ++i)
                              sink = sink + static_cast<int>(empty->Step(&plan));
                          });
  std::printf("baseline: sort 64 ints %.3f us, empty Step() %.3f us\n", sort_us, empty_us);

  const Scenario scenarios[] = {
      {"decode64", 1, 1000, 1 << 18},
      {"decode64-pp4", 4, 1000, 1 << 18},
      {"churn64", 1, 200, 32},
  };
  std::printf("%-14s %8s %8s %9s %9s %10s %10s %10s\n", "scenario", "running", "waiting",
              "decode/st", "pfill/st", "us/step", "x sort64", "x empty");
  for (const Scenario& sc : scenarios) {
    double best = 1e30, decodes = 0, prefill = 0;
    int64_t running = 0, waiting = 0;
    for (int r = 0; r < repeats; ++r) {
      Loop loop(sc, *cost, blocks);  // fresh each repeat: decode never reaches max_new
      running = loop.running();
      waiting = loop.waiting();
      loop.ResetStats();
      best = std::min(best, BestSeconds(1, [&] {
                        for (int i = 0; i < iters; ++i) loop.Iterate();
                      }));
      decodes = loop.decodes_per_step();
      prefill = loop.prefill_per_step();
    }
    const double us = 1e6 * best / iters;
    std::printf("%-14s %8lld %8lld %9.1f %9.1f %10.3f %10.1f %10.1f\n", sc.name,
                static_cast<long long>(running), static_cast<long long>(waiting), decodes, prefill,
                us, us / sort_us, us / empty_us);
  }
  return sink == 12345678 ? 1 : 0;
}
