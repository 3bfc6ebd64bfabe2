// Scheduler iteration tables (TensorRT-LLM capacitySchedulerTest style): each row steps the
// scheduler once, with scripted completions, and asserts the whole plan, the KV blocks in use and
// the sequences that finished. A plan reads
//   mb3 decode A@10 B@4 prefill C[0,4) D[4,6)* preempt E
// micro-batch 3 decodes A at position 10 and B at 4, prefills C's positions 0..3 and D's 4..5
// (`*`: the chunk ends the prompt and samples), and preempted E. "idle" and "busy" are the other
// StepOutcomes. The driver checks invariants after every step (budget, KV covers every planned
// token, block ids never shared, a sequence in at most one in-flight micro-batch, positions follow
// a shadow model of every request, dropped results never surface) and that the pool is all free
// when a scenario ends.
#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ss::sched {
namespace {

constexpr RequestId A = 1, B = 2, C = 3, D = 4, E = 5;

std::string Name(RequestId id) {
  return id >= 1 && id <= 26 ? std::string(1, static_cast<char>('A' + id - 1))
                             : absl::StrCat("#", id);
}

std::string Render(const StepPlan& p) {
  std::string s = absl::StrCat("mb", p.micro_batch_id);
  if (!p.decode.empty()) absl::StrAppend(&s, " decode");
  for (const DecodeEntry& e : p.decode) absl::StrAppend(&s, " ", Name(e.id), "@", e.position);
  if (!p.prefill.empty()) absl::StrAppend(&s, " prefill");
  for (const PrefillChunk& c : p.prefill) {
    absl::StrAppend(&s, " ", Name(c.id), "[", c.start, ",", c.start + c.length, ")",
                    c.samples ? "*" : "");
  }
  if (!p.preempted.empty()) absl::StrAppend(&s, " preempt");
  for (const RequestId id : p.preempted) absl::StrAppend(&s, " ", Name(id));
  return s;
}

// 4 tokens per block, `fixed` blocks of per-sequence state.
KvCostModel Small(int64_t fixed = 1) {
  return {.block_tokens = 4, .block_bytes = 100, .fixed_bytes = 100 * fixed, .fixed_blocks = fixed};
}

SchedulerConfig Config(int64_t budget, int64_t max_running, int64_t micro_batches = 1) {
  return {.max_model_len = 64,
          .max_tokens_per_step = budget,
          .max_running = max_running,
          .max_waiting = 16,
          .num_micro_batches = micro_batches};
}

// Runs a scheduler like the coordinator's step loop with a pipeline of num_micro_batches stages:
// after a planned step, the oldest micro-batch completes once the pipeline is full; after an
// idle or busy step, the oldest in flight completes. Keeps a shadow model of every request and
// checks the scheduler against it.
class Driver {
 public:
  Driver(const SchedulerConfig& config, const KvCostModel& cost, int64_t blocks)
      : config_(config), cost_(cost), s_(Create(config, cost, blocks)) {}

  Scheduler& s() { return s_; }

  SubmitOutcome Submit(RequestId id, int64_t prompt, int64_t max_new) {
    const SubmitOutcome o = s_.Submit({id, prompt, max_new, {}, true});
    if (o == SubmitOutcome::kQueued) shadow_[id] = {.prompt = prompt, .max_new = max_new};
    return o;
  }
  void MustSubmit(RequestId id, int64_t prompt, int64_t max_new) {
    ASSERT_EQ(Submit(id, prompt, max_new), SubmitOutcome::kQueued) << Name(id);
  }
  CancelOutcome Cancel(RequestId id) {
    const CancelOutcome o = s_.Cancel(id);
    EXPECT_EQ(o == CancelOutcome::kCancelled, shadow_.erase(id) == 1) << Name(id);
    CheckKv();
    return o;
  }

  // One step plus the pipeline's completions; returns the plan's rendering.
  std::string Step() {
    StepPlan plan;
    const StepOutcome o = s_.Step(&plan);
    std::string r;
    if (o == StepOutcome::kPlanned) {
      r = Render(plan);
      Check(plan);
      in_flight_.push_back(plan);
    } else {
      r = o == StepOutcome::kIdle ? "idle" : "busy";
      EXPECT_EQ(o == StepOutcome::kNoFreeMicroBatch,
                static_cast<int64_t>(in_flight_.size()) == config_.num_micro_batches);
    }
    if (o == StepOutcome::kPlanned
            ? static_cast<int64_t>(in_flight_.size()) >= config_.num_micro_batches
            : !in_flight_.empty()) {
      CompleteAt(0);
    }
    CheckKv();
    return r;
  }

  // Completes the i-th oldest in-flight micro-batch with a token per sampling entry; ids in `eos`
  // report EOS. Checks that exactly the live entries produce events.
  void CompleteAt(size_t i) {
    const StepPlan plan = in_flight_[i];
    in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
    const uint64_t mb = plan.micro_batch_id;
    std::vector<SampledToken> results;
    std::vector<TokenEvent> expected;
    auto sample = [&](RequestId id) {
      auto sh = shadow_.find(id);
      const bool eos =
          sh != shadow_.end() && eos_at.contains(id) && sh->second.emitted + 1 >= eos_at.at(id);
      const int32_t token = static_cast<int32_t>(id * 1000 + planned_epoch_[{mb, id}]);
      results.push_back({id, token, eos ? FinishReason::kEos : FinishReason::kNone});
      auto it = shadow_.find(id);
      if (it == shadow_.end() || it->second.epoch != planned_epoch_[{mb, id}]) return;  // dropped
      FinishReason f = eos ? FinishReason::kEos : FinishReason::kNone;
      if (f == FinishReason::kNone && it->second.emitted + 1 == it->second.max_new) {
        f = FinishReason::kLength;
      }
      expected.push_back({id, token, f});
    };
    for (const DecodeEntry& e : plan.decode) sample(e.id);
    for (const PrefillChunk& c : plan.prefill) {
      if (c.samples) sample(c.id);
    }
    for (const DecodeEntry& e : plan.decode) in_flight_ids_.erase(e.id);
    for (const PrefillChunk& c : plan.prefill) in_flight_ids_.erase(c.id);

    std::vector<TokenEvent> events;
    ASSERT_TRUE(s_.Complete(mb, results, &events).ok());
    EXPECT_EQ(events, expected) << "micro-batch " << mb;
    for (const TokenEvent& ev : events) {
      Shadow& sh = shadow_[ev.id];
      ++sh.emitted;
      ++tokens_[ev.id];
      if (ev.finish != FinishReason::kNone) {
        finish_[ev.id] = ev.finish;
        absl::StrAppend(&finished_, finished_.empty() ? "" : " ", Name(ev.id), ":",
                        std::string(ToString(ev.finish)));
        shadow_.erase(ev.id);
        EXPECT_FALSE(s_.Contains(ev.id));
      }
    }
  }

  // The finish events since the last call: "A:length B:eos".
  std::string TakeFinished() { return std::exchange(finished_, ""); }
  size_t num_in_flight() const { return in_flight_.size(); }
  const std::map<RequestId, int64_t>& tokens() const { return tokens_; }
  const std::map<RequestId, FinishReason>& finish() const { return finish_; }
  bool Live(RequestId id) const { return shadow_.contains(id); }
  bool InFlight(RequestId id) const { return in_flight_ids_.contains(id); }

  // Request -> the token (1-based) that comes back with EOS.
  std::map<RequestId, int64_t> eos_at;
  int64_t preemptions() const { return preemptions_; }

 private:
  struct Shadow {
    int64_t prompt = 0;
    int64_t max_new = 0;
    int64_t emitted = 0;   // tokens streamed (events)
    int64_t next_pos = 0;  // first position not yet planned
    int64_t epoch = 0;     // preemptions
  };

  static Scheduler Create(const SchedulerConfig& config, const KvCostModel& cost, int64_t blocks) {
    auto s = Scheduler::Create(config, cost, blocks);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }

  void Check(const StepPlan& plan) {
    EXPECT_LE(plan.num_tokens(), config_.max_tokens_per_step);
    EXPECT_GT(plan.num_tokens(), 0);
    std::set<RequestId> in_plan;
    for (const RequestId id : plan.preempted) {
      ++preemptions_;
      ASSERT_TRUE(shadow_.contains(id));
      shadow_[id].next_pos = 0;
      ++shadow_[id].epoch;
      EXPECT_TRUE(s_.BlockTable(id).empty());
    }
    auto enter = [&](RequestId id, int64_t end) {
      EXPECT_TRUE(in_plan.insert(id).second) << Name(id) << " twice in one plan";
      EXPECT_TRUE(in_flight_ids_.insert(id).second) << Name(id) << " in two micro-batches";
      EXPECT_GE(static_cast<int64_t>(s_.BlockTable(id).size()), cost_.BlocksForTokens(end))
          << Name(id) << "'s KV does not cover position " << end - 1;
      planned_epoch_[{plan.micro_batch_id, id}] = shadow_[id].epoch;
    };
    for (const DecodeEntry& e : plan.decode) {
      ASSERT_TRUE(shadow_.contains(e.id));
      Shadow& sh = shadow_[e.id];
      EXPECT_EQ(e.position, sh.next_pos) << Name(e.id);
      EXPECT_EQ(e.position, sh.prompt + sh.emitted - 1) << Name(e.id);
      enter(e.id, ++sh.next_pos);
    }
    for (const PrefillChunk& c : plan.prefill) {
      ASSERT_TRUE(shadow_.contains(c.id));
      Shadow& sh = shadow_[c.id];
      EXPECT_EQ(c.start, sh.next_pos) << Name(c.id);
      EXPECT_GT(c.length, 0);
      EXPECT_EQ(c.samples, c.start + c.length == sh.prompt + sh.emitted) << Name(c.id);
      EXPECT_LE(c.start + c.length, sh.prompt + sh.emitted) << Name(c.id);
      sh.next_pos += c.length;
      enter(c.id, sh.next_pos);
    }
  }

  void CheckKv() {
    std::set<int32_t> seen;
    int64_t held = 0;
    for (const auto& [id, sh] : shadow_) {
      for (const int32_t b : s_.BlockTable(id)) {
        EXPECT_TRUE(seen.insert(b).second) << "block " << b << " held twice";
      }
      held += s_.kv().BlocksHeld(id);
      RequestStatus st;
      ASSERT_TRUE(s_.GetRequestStatus(id, &st)) << Name(id);
      EXPECT_EQ(st.generated, sh.emitted) << Name(id);
    }
    EXPECT_EQ(held, s_.kv().used_blocks());
    EXPECT_LE(s_.kv().used_blocks(), s_.kv().total_blocks());
    EXPECT_EQ(s_.num_requests(), static_cast<int64_t>(shadow_.size()));
  }

  SchedulerConfig config_;
  KvCostModel cost_;
  Scheduler s_;
  std::deque<StepPlan> in_flight_;
  std::set<RequestId> in_flight_ids_;
  std::map<std::pair<uint64_t, RequestId>, int64_t> planned_epoch_;
  std::map<RequestId, Shadow> shadow_;
  std::map<RequestId, int64_t> tokens_;
  std::map<RequestId, FinishReason> finish_;
  std::string finished_;
  int64_t preemptions_ = 0;
};

// One row of an iteration table: `before` runs first (submissions, cancellations, checks), then
// one Step(); `plan` is its rendering, `used` the KV blocks in use after the row's completions,
// `finished` the sequences that ended in them.
struct Row {
  std::function<void(Driver&)> before;
  std::string plan;
  int64_t used = 0;
  std::string finished = "";
};

void RunTable(Driver& d, const std::vector<Row>& rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("row ", i, ": ", rows[i].plan));
    if (rows[i].before) rows[i].before(d);
    EXPECT_EQ(d.Step(), rows[i].plan);
    EXPECT_EQ(d.s().kv().used_blocks(), rows[i].used);
    EXPECT_EQ(d.TakeFinished(), rows[i].finished);
  }
}

void ExpectAllFree(Driver& d) {
  EXPECT_EQ(d.num_in_flight(), 0u);
  EXPECT_EQ(d.s().num_requests(), 0);
  EXPECT_EQ(d.s().num_running(), 0);
  EXPECT_EQ(d.s().num_waiting(), 0);
  EXPECT_EQ(d.s().kv().free_blocks(), d.s().kv().total_blocks());
  EXPECT_EQ(d.s().kv().num_sequences(), 0);
}

TEST(SchedulerTest, SingleRequestPrefillsInChunksThenDecodesToMaxNew) {
  Driver d(Config(/*budget=*/4, /*max_running=*/4), Small(), 32);
  d.MustSubmit(A, 10, 3);
  RunTable(d, {
                  {{}, "mb0 prefill A[0,4)", 2},
                  {{}, "mb1 prefill A[4,8)", 3},
                  {{}, "mb2 prefill A[8,10)*", 4},
                  {{}, "mb3 decode A@10", 4},
                  {{}, "mb4 decode A@11", 0, "A:length"},
                  {{}, "idle", 0},
              });
  EXPECT_EQ(d.tokens().at(A), 3);
  ExpectAllFree(d);
}

TEST(SchedulerTest, TwoRequestsFifoShareTheBudget) {
  Driver d(Config(8, 4), Small(), 32);
  d.MustSubmit(A, 6, 2);
  d.MustSubmit(B, 6, 3);
  d.MustSubmit(C, 3, 2);
  RunTable(d, {
                  // A's whole prompt, B gets the rest; C waits behind B.
                  {{}, "mb0 prefill A[0,6)* B[0,2)", 5},
                  {{}, "mb1 decode A@6 prefill B[2,6)* C[0,3)*", 5, "A:length"},
                  {{}, "mb2 decode B@6 C@3", 3, "C:length"},
                  {{}, "mb3 decode B@7", 0, "B:length"},
                  {{}, "idle", 0},
              });
  ExpectAllFree(d);
}

TEST(SchedulerTest, DecodeComesFirstPrefillGetsWhatIsLeft) {
  Driver d(Config(4, 4), Small(), 32);
  d.MustSubmit(A, 2, 5);
  d.MustSubmit(B, 2, 5);
  d.MustSubmit(C, 2, 5);
  RunTable(
      d, {
             {{}, "mb0 prefill A[0,2)* B[0,2)*", 4},
             {{}, "mb1 decode A@2 B@2 prefill C[0,2)*", 6},
             // Three decodes take 3 of the 4 tokens: D's prompt goes 1 token a step.
             {[](Driver& d) { d.MustSubmit(D, 5, 1); }, "mb2 decode A@3 B@3 C@2 prefill D[0,1)", 8},
             {{}, "mb3 decode A@4 B@4 C@3 prefill D[1,2)", 10},
             {{}, "mb4 decode A@5 B@5 C@4 prefill D[2,3)", 5, "A:length B:length"},
             {{}, "mb5 decode C@5 prefill D[3,5)*", 0, "C:length D:length"},
             {{}, "idle", 0},
         });
  ExpectAllFree(d);
}

// The chunk policy at `splitserve up`'s streamed-prefill step (max_batch_tokens 8192): a 32K-token
// prompt is prefilled in chunks of what the step has left after one decode token of each of two
// decoding sequences, which get their token in every step (never starved).
TEST(SchedulerTest, LongPromptPrefillsInLargeChunksBesideEveryDecode) {
  SchedulerConfig config = Config(/*budget=*/8192, /*max_running=*/4);
  config.max_model_len = 40000;
  Driver d(config, Small(), 10000);
  d.MustSubmit(A, 4, 8);
  d.MustSubmit(B, 4, 8);
  RunTable(d, {
                  {{}, "mb0 prefill A[0,4)* B[0,4)*", 4},
                  // A and B: 1 + ceil(covered/4) blocks each; C: 1 + ceil(8190 k/4).
                  {[](Driver& d) { d.MustSubmit(C, 32768, 1); },
                   "mb1 decode A@4 B@4 prefill C[0,8190)", 3 + 3 + 2049},
                  {{}, "mb2 decode A@5 B@5 prefill C[8190,16380)", 3 + 3 + 4096},
                  {{}, "mb3 decode A@6 B@6 prefill C[16380,24570)", 3 + 3 + 6144},
                  {{}, "mb4 decode A@7 B@7 prefill C[24570,32760)", 3 + 3 + 8191},
                  {{}, "mb5 decode A@8 B@8 prefill C[32760,32768)*", 4 + 4, "C:length"},
                  {{}, "mb6 decode A@9 B@9", 4 + 4},
                  // Their 8th token: the first came with the prompt's last chunk.
                  {{}, "mb7 decode A@10 B@10", 0, "A:length B:length"},
                  {{}, "idle", 0},
              });
  ExpectAllFree(d);
}

TEST(SchedulerTest, EosAndStopEndASequenceEarly) {
  Driver d(Config(8, 4), Small(), 32);
  d.MustSubmit(A, 3, 50);
  d.MustSubmit(B, 3, 50);
  RunTable(d, {
                  {{}, "mb0 prefill A[0,3)* B[0,3)*", 4},
                  {[](Driver& d) { d.eos_at[A] = 2; }, "mb1 decode A@3 B@3", 2, "A:eos"},
                  {{}, "mb2 decode B@4", 3},
              });
  // A stop string found by the detokenizer: the caller cancels.
  EXPECT_EQ(d.Cancel(B), CancelOutcome::kCancelled);
  EXPECT_EQ(d.Step(), "idle");
  ExpectAllFree(d);
}

TEST(SchedulerTest, KvExhaustedAdmissionWaitsAndResumesWhenBlocksFree) {
  // 6 blocks: A (16 + 4 new: worst case 19 tokens = 1 + 5 blocks) fills the pool; B waits
  // without taking anything until A ends.
  Driver d(Config(16, 4), Small(), 6);
  d.MustSubmit(A, 16, 4);
  d.MustSubmit(B, 4, 2);
  RunTable(d, {
                  {{}, "mb0 prefill A[0,16)*", 5},
                  {{}, "mb1 decode A@16", 6},
                  {{}, "mb2 decode A@17", 6},
                  {{}, "mb3 decode A@18", 0, "A:length"},
                  {{}, "mb4 prefill B[0,4)*", 2},
                  {{}, "mb5 decode B@4", 0, "B:length"},
                  {{}, "idle", 0},
              });
  ExpectAllFree(d);
}

TEST(SchedulerTest, AdmissionWatermarkKeepsBlocksForRunningSequences) {
  SchedulerConfig config = Config(16, 4);
  config.admission_watermark_blocks = 2;
  Driver d(config, Small(), 7);
  d.MustSubmit(A, 4, 3);
  d.MustSubmit(B, 4, 2);
  RunTable(d, {
                  // Empty pool: the watermark does not apply to A. Then 5 free - 2 kept: B fits.
                  {{}, "mb0 prefill A[0,4)* B[0,4)*", 4},
                  // 1 free - 2 kept: C waits.
                  {[](Driver& d) { d.MustSubmit(C, 8, 1); }, "mb1 decode A@4 B@4", 3, "B:length"},
                  // 4 free - 2 kept = 2 blocks: C gets 4 of its 8 tokens.
                  {{}, "mb2 decode A@5 prefill C[0,4)", 2, "A:length"},
                  // An admitted sequence's chunks do not keep the watermark.
                  {{}, "mb3 prefill C[4,8)*", 0, "C:length"},
              });
  ExpectAllFree(d);
}

TEST(SchedulerTest, YoungestIsPreemptedAndRecomputedFromItsPromptAndTokens) {
  // 6 blocks. A (8 + 8 new: worst 15 tokens = 5 blocks) and B (4 + 4) both fit at first. B,
  // the youngest, cannot grow and waits; when A needs B's blocks, B is preempted, requeued at
  // the front, and re-prefilled over its prompt and its one generated token once A is done.
  Driver d(Config(16, 4), Small(), 6);
  d.MustSubmit(A, 8, 8);
  d.MustSubmit(B, 4, 4);
  RunTable(d, {
                  {{}, "mb0 prefill A[0,8)* B[0,4)*", 5},
                  {{}, "mb1 decode A@8", 6},
                  {{}, "mb2 decode A@9", 6},
                  {{}, "mb3 decode A@10", 6},
                  {{}, "mb4 decode A@11", 6},
                  {[](Driver& d) {
                     RequestStatus st;
                     ASSERT_TRUE(d.s().GetRequestStatus(B, &st));
                     EXPECT_EQ(st.generated, 1);
                     EXPECT_EQ(st.processed, 4);
                   },
                   "mb5 decode A@12 preempt B", 5},
                  {[](Driver& d) {
                     RequestStatus st;
                     ASSERT_TRUE(d.s().GetRequestStatus(B, &st));
                     EXPECT_TRUE(st.waiting);
                     EXPECT_EQ(st.processed, 0);
                     EXPECT_EQ(st.prefill_target, 5);
                     EXPECT_EQ(st.preemptions, 1);
                   },
                   "mb6 decode A@13", 5},
                  {{}, "mb7 decode A@14", 0, "A:length"},
                  {{}, "mb8 prefill B[0,5)*", 3},
                  {{}, "mb9 decode B@5", 3},
                  {{}, "mb10 decode B@6", 0, "B:length"},
                  {{}, "idle", 0},
              });
  EXPECT_EQ(d.tokens().at(A), 8);
  EXPECT_EQ(d.tokens().at(B), 4);  // the token before the preemption is kept, none repeated
  ExpectAllFree(d);
}

TEST(SchedulerTest, OlderPrefillPreemptsAYoungerDecodeAlreadyInThePlan) {
  // PP 2, 4 blocks. A's prompt (12 tokens, worst case 4 blocks) is in flight when B is
  // admitted into the other micro-batch. In mb2 both are runnable: B's decode is planned first
  // (decode first), then A, older, needs a block: B leaves the plan and the pool.
  Driver d(Config(4, 4, /*micro_batches=*/2), Small(), 4);
  d.MustSubmit(A, 12, 1);
  d.MustSubmit(B, 1, 3);
  RunTable(d, {
                  {{}, "mb0 prefill A[0,4)", 2},
                  {{}, "mb1 prefill B[0,1)*", 4},       // pipeline full: mb0 completes
                  {[](Driver& d) { d.CompleteAt(0); },  // mb1 too: B has its first token
                   "mb2 prefill A[4,8) preempt B", 3},
                  {{}, "idle", 3},  // B does not fit in 1 free block; mb2 completes
                  {{}, "mb3 prefill A[8,12)*", 4},
                  {{}, "idle", 0, "A:length"},
                  {{}, "mb4 prefill B[0,2)*", 2},  // prompt + the token it had
                  {{}, "idle", 2},
                  {{}, "mb5 decode B@2", 2},
                  {{}, "idle", 0, "B:length"},
                  {{}, "idle", 0},
              });
  EXPECT_EQ(d.tokens().at(B), 3);
  ExpectAllFree(d);
}

TEST(SchedulerTest, RequestsThatCanNeverRunAreRefused) {
  Driver d(Config(8, 4), Small(), 8);  // 8 blocks: at most 28 tokens (1 fixed + 7)
  EXPECT_EQ(d.Submit(A, 60, 5), SubmitOutcome::kTooLong);  // 65 > max_model_len 64
  EXPECT_EQ(d.Submit(A, 0, 5), SubmitOutcome::kInvalid);
  EXPECT_EQ(d.Submit(A, 5, 0), SubmitOutcome::kInvalid);
  EXPECT_EQ(d.Submit(A, -1, 5), SubmitOutcome::kInvalid);
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(d.Submit(A, kHuge, kHuge), SubmitOutcome::kTooLong);
  EXPECT_EQ(d.Submit(A, 5, kHuge), SubmitOutcome::kTooLong);
  EXPECT_EQ(d.Submit(A, 30, 1), SubmitOutcome::kExceedsKvCapacity);   // 30 tokens: 9 blocks
  EXPECT_EQ(d.Submit(A, 20, 10), SubmitOutcome::kExceedsKvCapacity);  // 29 tokens: 9 blocks
  EXPECT_EQ(d.s().num_requests(), 0);
  d.MustSubmit(A, 20, 9);  // worst case 28 tokens: exactly the pool
  EXPECT_EQ(d.Submit(A, 2, 2), SubmitOutcome::kDuplicateId);
  EXPECT_EQ(ToString(SubmitOutcome::kExceedsKvCapacity), "larger than the whole KV cache");
  RunTable(d, {
                  {{}, "mb0 prefill A[0,8)", 3},
                  {{}, "mb1 prefill A[8,16)", 5},
                  {{}, "mb2 prefill A[16,20)*", 6},
              });
  for (int i = 0; i < 8; ++i) d.Step();
  EXPECT_EQ(d.s().kv().used_blocks(), 0);
  EXPECT_EQ(d.TakeFinished(), "A:length");
  ExpectAllFree(d);
}

TEST(SchedulerTest, QueueFullIsAnOutcomeAndClearsWhenRequestsAreAdmitted) {
  SchedulerConfig config = Config(8, 1);
  config.max_waiting = 2;
  Driver d(config, Small(), 32);
  d.MustSubmit(A, 2, 2);
  d.MustSubmit(B, 2, 2);
  EXPECT_EQ(d.Submit(C, 2, 2), SubmitOutcome::kQueueFull);
  EXPECT_FALSE(d.s().Contains(C));
  // max_running 1: A is admitted, B still waits.
  RunTable(d, {
                  {[](Driver& d) { EXPECT_EQ(d.Submit(C, 2, 2), SubmitOutcome::kQueueFull); },
                   "mb0 prefill A[0,2)*", 2},
                  {[](Driver& d) { d.MustSubmit(C, 2, 2); }, "mb1 decode A@2", 0, "A:length"},
                  {{}, "mb2 prefill B[0,2)*", 2},
                  {{}, "mb3 decode B@2", 0, "B:length"},
                  {{}, "mb4 prefill C[0,2)*", 2},
                  {{}, "mb5 decode C@2", 0, "C:length"},
              });
  ExpectAllFree(d);
}

TEST(SchedulerTest, CancelMidPrefillAndMidDecodeFreesKvAndOthersContinue) {
  Driver d(Config(4, 4), Small(), 32);
  d.MustSubmit(A, 3, 10);
  d.MustSubmit(B, 12, 2);
  d.MustSubmit(E, 2, 2);
  RunTable(d, {
                  {{}, "mb0 prefill A[0,3)* B[0,1)", 4},
                  {{}, "mb1 decode A@3 prefill B[1,4)", 4},
                  {[](Driver& d) {
                     EXPECT_EQ(d.Cancel(B), CancelOutcome::kCancelled);  // mid-prefill
                     EXPECT_EQ(d.s().kv().used_blocks(), 2);
                     EXPECT_EQ(d.Cancel(E), CancelOutcome::kCancelled);  // still waiting
                     EXPECT_EQ(d.Cancel(B), CancelOutcome::kUnknownId);
                     d.MustSubmit(C, 2, 2);
                   },
                   "mb2 decode A@4 prefill C[0,2)*", 5},
                  {[](Driver& d) {
                     EXPECT_EQ(d.Cancel(A), CancelOutcome::kCancelled);  // mid-decode
                     EXPECT_EQ(d.s().kv().used_blocks(), 2);
                   },
                   "mb3 decode C@2", 0, "C:length"},
                  {{}, "idle", 0},
              });
  EXPECT_EQ(d.s().Cancel(99), CancelOutcome::kUnknownId);
  ExpectAllFree(d);
}

TEST(SchedulerTest, CancelInFlightFreesKvNowAndDropsTheResultLater) {
  Driver d(Config(4, 4, 2), Small(), 32);
  d.MustSubmit(A, 4, 5);
  d.MustSubmit(B, 4, 5);
  RunTable(d, {
                  {{}, "mb0 prefill A[0,4)*", 2},
                  {{}, "mb1 prefill B[0,4)*", 4},
                  {{}, "mb2 decode A@4", 5},
                  {[](Driver& d) {
                     ASSERT_TRUE(d.InFlight(A));
                     EXPECT_EQ(d.Cancel(A), CancelOutcome::kCancelled);
                     EXPECT_EQ(d.s().kv().used_blocks(), 2);
                     // Its old entry is still in flight: the id cannot come back yet.
                     EXPECT_EQ(d.Submit(A, 4, 1), SubmitOutcome::kDuplicateId);
                   },
                   "mb3 decode B@4", 3},  // mb2 completes: A's token is dropped
                  {[](Driver& d) { d.MustSubmit(A, 4, 1); }, "mb4 prefill A[0,4)*", 5},
                  {{}, "mb5 decode B@5", 3, "A:length"},
                  {[](Driver& d) { EXPECT_EQ(d.Cancel(B), CancelOutcome::kCancelled); }, "idle", 0},
                  {{}, "idle", 0},
              });
  // The first A's prefill token and the resubmitted A's; the cancelled decode's is dropped.
  EXPECT_EQ(d.tokens().at(A), 2);
  ExpectAllFree(d);
}

TEST(SchedulerTest, TwoStagePipelineAlternatesTwoGroups) {
  Driver d(Config(8, 8, 2), Small(), 64);
  d.MustSubmit(A, 4, 3);
  d.MustSubmit(B, 4, 3);
  RunTable(d, {
                  {{}, "mb0 prefill A[0,4)* B[0,4)*", 4},
                  {[](Driver& d) {
                     d.MustSubmit(C, 4, 3);
                     d.MustSubmit(D, 4, 3);
                   },
                   "mb1 prefill C[0,4)* D[0,4)*", 8},
                  {{}, "mb2 decode A@4 B@4", 10},
                  {{}, "mb3 decode C@4 D@4", 12},
                  {{}, "mb4 decode A@5 B@5", 12},
                  {{}, "mb5 decode C@5 D@5", 6, "A:length B:length"},
                  {{}, "idle", 0, "C:length D:length"},
                  {{}, "idle", 0},
              });
  ExpectAllFree(d);
}

TEST(SchedulerTest, FourStagePipelineNeverPlansASequenceTwice) {
  Driver d(Config(5, 5, 4), Small(), 64);
  for (RequestId id : {A, B, C, D, E}) d.MustSubmit(id, 5, 2);
  RunTable(d, {
                  {{}, "mb0 prefill A[0,5)*", 3},
                  {{}, "mb1 prefill B[0,5)*", 6},
                  {{}, "mb2 prefill C[0,5)*", 9},
                  {{}, "mb3 prefill D[0,5)*", 12},            // full: mb0 completes
                  {{}, "mb4 decode A@5 prefill E[0,4)", 14},  // mb1 completes
                  {{}, "mb5 decode B@5", 14},                 // E is in flight; mb2 completes
                  {{}, "mb6 decode C@5", 14},                 // mb3 completes
                  {{}, "mb7 decode D@5", 11, "A:length"},     // mb4 completes
                  {{}, "mb8 prefill E[4,5)*", 9, "B:length"},
                  {{}, "idle", 6, "C:length"},  // C, D, E all in flight
                  {{}, "idle", 3, "D:length"},
                  {{}, "idle", 3},  // mb8: E's first token
                  {{}, "mb9 decode E@5", 3},
                  {{}, "idle", 0, "E:length"},
                  {{}, "idle", 0},
              });
  ExpectAllFree(d);
}

TEST(SchedulerTest, BusyWhenEveryMicroBatchIsInFlight) {
  auto s = Scheduler::Create(Config(4, 4, 2), Small(), 16);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->Submit({A, 4, 2, {}, true}), SubmitOutcome::kQueued);
  ASSERT_EQ(s->Submit({B, 4, 2, {}, true}), SubmitOutcome::kQueued);
  StepPlan p0, p1, p2;
  EXPECT_EQ(s->Step(&p0), StepOutcome::kPlanned);
  EXPECT_EQ(s->Step(&p1), StepOutcome::kPlanned);
  EXPECT_EQ(s->Step(&p2), StepOutcome::kNoFreeMicroBatch);
  EXPECT_EQ(s->num_in_flight(), 2);
  std::vector<TokenEvent> events;
  // Micro-batches may complete out of order.
  ASSERT_TRUE(s->Complete(p1.micro_batch_id, std::vector<SampledToken>{{B, 7}}, &events).ok());
  ASSERT_TRUE(s->Complete(p0.micro_batch_id, std::vector<SampledToken>{{A, 5}}, &events).ok());
  EXPECT_EQ(events,
            (std::vector<TokenEvent>{{B, 7, FinishReason::kNone}, {A, 5, FinishReason::kNone}}));
  EXPECT_EQ(s->Step(&p2), StepOutcome::kPlanned);
  EXPECT_EQ(Render(p2), "mb2 decode A@4 B@4");
}

TEST(SchedulerTest, CompleteRejectsResultsThatDoNotMatchThePlanAndChangesNothing) {
  auto s = Scheduler::Create(Config(8, 4), Small(), 16);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->Submit({A, 2, 2, {}, true}), SubmitOutcome::kQueued);
  ASSERT_EQ(s->Submit({B, 8, 2, {}, true}), SubmitOutcome::kQueued);
  StepPlan plan;
  ASSERT_EQ(s->Step(&plan), StepOutcome::kPlanned);
  ASSERT_EQ(Render(plan), "mb0 prefill A[0,2)* B[0,6)");  // only A samples
  std::vector<TokenEvent> events;
  EXPECT_EQ(s->Complete(7, std::vector<SampledToken>{{A, 1}}, &events).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Complete(0, std::vector<SampledToken>{}, &events).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Complete(0, std::vector<SampledToken>{{A, 1}, {B, 1}}, &events).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Complete(0, std::vector<SampledToken>{{B, 1}}, &events).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(events.empty());
  EXPECT_EQ(s->num_in_flight(), 1);
  ASSERT_TRUE(s->Complete(0, std::vector<SampledToken>{{A, 1}}, &events).ok());
  EXPECT_EQ(events.size(), 1u);
  EXPECT_EQ(s->Complete(0, std::vector<SampledToken>{{A, 1}}, &events).code(),
            absl::StatusCode::kInvalidArgument);  // already completed
}

TEST(SchedulerTest, CreateRejectsConfigsThatBreakTheGuarantees) {
  EXPECT_TRUE(Scheduler::Create(Config(4, 4), Small(), 2).ok());
  EXPECT_FALSE(Scheduler::Create(Config(4, 4), Small(), 1).ok());  // no room for a token
  EXPECT_FALSE(Scheduler::Create(Config(2, 4), Small(), 8).ok());  // budget < max_running
  EXPECT_FALSE(Scheduler::Create(Config(4, 4, 0), Small(), 8).ok());
  SchedulerConfig c = Config(4, 4);
  c.max_model_len = 0;
  EXPECT_FALSE(Scheduler::Create(c, Small(), 8).ok());
  c = Config(4, 4);
  c.admission_watermark_blocks = -1;
  EXPECT_FALSE(Scheduler::Create(c, Small(), 8).ok());
}

// Random arrivals, prompt and output lengths, EOS, cancellations, pipeline depths and pool
// sizes small enough to preempt often. Checks, at every step, the no-livelock claim of
// scheduler.h: when a micro-batch slot is free, the oldest unfinished request is planned unless
// it is in flight, and it is never preempted. Every request must end (by length, EOS or a
// cancellation) within a bounded number of steps, with exactly its tokens, and the pool must be
// all free at the end.
// Prefix caching: the first request's prefill is cut at its last block boundary, a snapshot is
// saved there, and once that micro-batch completed a request with the same first blocks starts
// at the boundary with a restore; a request cancelled in flight registers nothing and its
// snapshot is dropped.
TEST(SchedulerTest, PrefixCacheCutsSavesAndResumes) {
  KvCostModel cost = Small();
  cost.snapshot_blocks = 2;
  SchedulerConfig config = Config(16, 4);
  config.prefix_caching = true;
  auto s = Scheduler::Create(config, cost, 32);
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> prompt(10);
  for (int i = 0; i < 10; ++i) prompt[static_cast<size_t>(i)] = 100 + i;
  ASSERT_EQ(s->Submit({A, 10, 2, prompt, true}), SubmitOutcome::kQueued);
  StepPlan p;
  std::vector<TokenEvent> events;
  ASSERT_EQ(s->Step(&p), StepOutcome::kPlanned);
  EXPECT_EQ(Render(p), "mb0 prefill A[0,8)") << "cut at the last block boundary, 8";
  ASSERT_EQ(p.saves.size(), 1u);
  EXPECT_EQ(p.saves[0].id, A);
  EXPECT_EQ(p.saves[0].position, 8);
  EXPECT_EQ(p.saves[0].blocks.size(), 2u);
  EXPECT_EQ(p.admissions, (std::vector<Admission>{{A, 0}}));
  const uint64_t snapshot = p.saves[0].snapshot_id;
  // B shares A's first 9 ids; while A's micro-batch is in flight nothing is cached yet.
  std::vector<int32_t> other = prompt;
  other[9] = 7;
  ASSERT_EQ(s->Submit({B, 10, 2, other, true}), SubmitOutcome::kQueued);
  ASSERT_TRUE(s->Complete(p.micro_batch_id, {}, &events).ok());
  EXPECT_EQ(s->kv().cached_blocks(), 2 + 2);
  ASSERT_EQ(s->Step(&p), StepOutcome::kPlanned);
  EXPECT_EQ(Render(p), "mb1 prefill A[8,10)* B[8,10)*");
  EXPECT_TRUE(p.saves.empty());
  ASSERT_EQ(p.restores.size(), 1u);
  EXPECT_EQ(p.restores[0].id, B);
  EXPECT_EQ(p.restores[0].tokens, 8);
  EXPECT_EQ(p.restores[0].snapshot_id, snapshot);
  EXPECT_EQ(p.admissions, (std::vector<Admission>{{B, 8}}));
  RequestStatus st;
  ASSERT_TRUE(s->GetRequestStatus(B, &st));
  EXPECT_EQ(st.cached_tokens, 8);
  // B's table shares A's token blocks and owns its fixed block and its last block.
  const std::vector<int32_t> ta(s->BlockTable(A).begin(), s->BlockTable(A).end());
  const std::vector<int32_t> tb(s->BlockTable(B).begin(), s->BlockTable(B).end());
  ASSERT_EQ(ta.size(), 4u);
  ASSERT_EQ(tb.size(), 4u);
  EXPECT_EQ(tb[1], ta[1]);
  EXPECT_EQ(tb[2], ta[2]);
  EXPECT_NE(tb[0], ta[0]);
  EXPECT_NE(tb[3], ta[3]);
  EXPECT_EQ(s->prefix_cache_queries(), 20);
  EXPECT_EQ(s->prefix_cache_hits(), 8);
  ASSERT_TRUE(
      s->Complete(p.micro_batch_id, std::vector<SampledToken>{{A, 1}, {B, 1}}, &events).ok());
  EXPECT_TRUE(s->Cancel(A) == CancelOutcome::kCancelled &&
              s->Cancel(B) == CancelOutcome::kCancelled);

  // C is cancelled while its first chunk is in flight: nothing of it is cached, its snapshot goes.
  std::vector<int32_t> third(10, 5);
  ASSERT_EQ(s->Submit({C, 10, 2, third, true}), SubmitOutcome::kQueued);
  ASSERT_EQ(s->Step(&p), StepOutcome::kPlanned);
  ASSERT_EQ(p.saves.size(), 1u);
  const uint64_t dropped = p.saves[0].snapshot_id;
  EXPECT_EQ(s->Cancel(C), CancelOutcome::kCancelled);
  ASSERT_TRUE(s->Complete(p.micro_batch_id, {}, &events).ok());
  ASSERT_EQ(s->Submit({D, 10, 2, third, true}), SubmitOutcome::kQueued);
  ASSERT_EQ(s->Step(&p), StepOutcome::kPlanned);
  EXPECT_EQ(Render(p), "mb3 prefill D[0,8)") << "no hit";
  EXPECT_NE(std::find(p.dropped_snapshots.begin(), p.dropped_snapshots.end(), dropped),
            p.dropped_snapshots.end());
}

// Requests that may not resume (reuse_prefix false) or carry no ids are planned as without a
// cache, and with prefix caching off nothing is cut or saved.
TEST(SchedulerTest, PrefixCacheOffOrNotReusedPlansFromZero) {
  KvCostModel cost = Small();
  cost.snapshot_blocks = 2;
  for (const bool caching : {false, true}) {
    SchedulerConfig config = Config(16, 4);
    config.prefix_caching = caching;
    auto s = Scheduler::Create(config, cost, 32);
    ASSERT_TRUE(s.ok());
    const std::vector<int32_t> prompt(10, 9);
    ASSERT_EQ(s->Submit({A, 10, 1, prompt, true}), SubmitOutcome::kQueued);
    StepPlan p;
    std::vector<TokenEvent> events;
    ASSERT_EQ(s->Step(&p), StepOutcome::kPlanned);
    EXPECT_EQ(Render(p), caching ? "mb0 prefill A[0,8)" : "mb0 prefill A[0,10)*");
    EXPECT_EQ(p.saves.size(), caching ? 1u : 0u);
    ASSERT_TRUE(
        s->Complete(p.micro_batch_id,
                    caching ? std::vector<SampledToken>{} : std::vector<SampledToken>{{A, 1}},
                    &events)
            .ok());
    ASSERT_EQ(s->Submit({B, 10, 1, prompt, false}), SubmitOutcome::kQueued);
    ASSERT_EQ(s->Submit({C, 10, 1, {}, true}), SubmitOutcome::kQueued);
    ASSERT_EQ(s->Step(&p), StepOutcome::kPlanned);
    EXPECT_TRUE(p.restores.empty());
    for (const PrefillChunk& c : p.prefill) {
      EXPECT_TRUE(c.id == A || c.start == 0) << Name(c.id);
    }
  }
}

TEST(SchedulerStressTest, PreemptionNeverLivelocksAndNothingLeaks) {
  int64_t total_preemptions = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937_64 rng(seed);
    auto uniform = [&](int64_t lo, int64_t hi) {
      return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
    };
    const int64_t fixed = uniform(1, 3);
    const int64_t blocks = uniform(fixed + 4, 40);
    SchedulerConfig config;
    config.max_model_len = 64;
    config.max_running = uniform(1, 8);
    config.max_tokens_per_step = uniform(config.max_running, 24);
    config.max_waiting = 1000;
    config.num_micro_batches = uniform(1, 4);
    config.admission_watermark_blocks = uniform(0, 1) * uniform(0, 3);
    Driver d(config, Small(fixed), blocks);

    const int n = 40;
    std::vector<RequestId> order;  // accepted, in arrival order
    std::map<RequestId, int64_t> max_new;
    std::set<RequestId> cancelled;
    int next = 0;
    int64_t step = 0;
    const int64_t kMaxSteps = 20000;
    for (; step < kMaxSteps; ++step) {
      // Arrivals over the first steps.
      while (next < n && uniform(0, 3) == 0) {
        const RequestId id = 100 + next++;
        const int64_t p = uniform(1, 40), m = uniform(1, 24);
        const SubmitOutcome o = d.Submit(id, p, m);
        if (p + m > 64) {
          EXPECT_EQ(o, SubmitOutcome::kTooLong);
        } else if (Small(fixed).BlocksForTokens(p + m - 1) > blocks) {
          EXPECT_EQ(o, SubmitOutcome::kExceedsKvCapacity);
        } else {
          ASSERT_EQ(o, SubmitOutcome::kQueued);
          order.push_back(id);
          max_new[id] = m;
          if (uniform(0, 4) == 0) d.eos_at[id] = uniform(1, m);
        }
      }
      // Rare cancellations of a random live request.
      if (!order.empty() && uniform(0, 60) == 0) {
        const RequestId id = order[static_cast<size_t>(uniform(0, order.size() - 1))];
        if (d.Live(id)) {
          EXPECT_EQ(d.Cancel(id), CancelOutcome::kCancelled);
          cancelled.insert(id);
        }
      }
      // Sometimes a micro-batch other than the oldest completes first.
      if (d.num_in_flight() > 1 && uniform(0, 7) == 0) {
        d.CompleteAt(static_cast<size_t>(uniform(1, d.num_in_flight() - 1)));
      }

      RequestId oldest = 0;
      for (const RequestId id : order) {
        if (d.Live(id)) {
          oldest = id;
          break;
        }
      }
      const bool oldest_runnable =
          oldest != 0 && !d.InFlight(oldest) &&
          d.num_in_flight() < static_cast<size_t>(config.num_micro_batches);
      RequestStatus before{};
      if (oldest != 0) {
        ASSERT_TRUE(d.s().GetRequestStatus(oldest, &before));
      }
      const std::string r = d.Step();
      if (oldest_runnable) {
        const std::string tag = absl::StrCat(" ", Name(oldest));
        EXPECT_NE(r.find(tag + "@"), r.find(tag + "[")) << r << " misses the oldest" << tag;
      }
      if (oldest != 0 && d.Live(oldest)) {
        RequestStatus after;
        ASSERT_TRUE(d.s().GetRequestStatus(oldest, &after));
        EXPECT_EQ(after.preemptions, before.preemptions);
        EXPECT_GE(after.processed, before.processed);
      }
      if (next == n && d.s().num_requests() == 0 && d.num_in_flight() == 0) break;
    }
    ASSERT_LT(step, kMaxSteps) << "did not finish: livelock";
    for (const RequestId id : order) {
      if (cancelled.contains(id)) continue;
      ASSERT_TRUE(d.finish().contains(id)) << Name(id);
      if (d.eos_at.contains(id) && d.eos_at.at(id) < max_new[id]) {
        EXPECT_EQ(d.finish().at(id), FinishReason::kEos);
        EXPECT_EQ(d.tokens().at(id), d.eos_at.at(id));
      } else if (d.eos_at.contains(id)) {
        EXPECT_EQ(d.tokens().at(id), max_new[id]) << Name(id);  // EOS on the last token
      } else {
        EXPECT_EQ(d.finish().at(id), FinishReason::kLength);
        EXPECT_EQ(d.tokens().at(id), max_new[id]) << Name(id);
      }
    }
    ExpectAllFree(d);
    for (const RequestId id : order) {
      RequestStatus st;
      EXPECT_FALSE(d.s().GetRequestStatus(id, &st));
    }
    total_preemptions += d.preemptions();
  }
  // The pools are small enough that the preemption path is exercised heavily.
  EXPECT_GT(total_preemptions, 500);
}

}  // namespace
}  // namespace ss::sched
