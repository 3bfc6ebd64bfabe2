#include "coordinator/scheduler.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ss::sched {

std::string_view ToString(SubmitOutcome o) {
  switch (o) {
    case SubmitOutcome::kQueued:
      return "queued";
    case SubmitOutcome::kQueueFull:
      return "queue full";
    case SubmitOutcome::kInvalid:
      return "invalid length";
    case SubmitOutcome::kTooLong:
      return "longer than the maximum sequence length";
    case SubmitOutcome::kExceedsKvCapacity:
      return "larger than the whole KV cache";
    case SubmitOutcome::kDuplicateId:
      return "duplicate request id";
  }
  return "?";
}

std::string_view ToString(CancelOutcome o) {
  switch (o) {
    case CancelOutcome::kCancelled:
      return "cancelled";
    case CancelOutcome::kUnknownId:
      return "unknown request id";
  }
  return "?";
}

std::string_view ToString(StepOutcome o) {
  switch (o) {
    case StepOutcome::kPlanned:
      return "planned";
    case StepOutcome::kIdle:
      return "idle";
    case StepOutcome::kNoFreeMicroBatch:
      return "no free micro-batch";
  }
  return "?";
}

std::string_view ToString(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
  }
  return "?";
}

int64_t StepPlan::num_tokens() const {
  int64_t n = static_cast<int64_t>(decode.size());
  for (const PrefillChunk& c : prefill) n += c.length;
  return n;
}

void StepPlan::Clear() {
  decode.clear();
  prefill.clear();
  preempted.clear();
  restores.clear();
  saves.clear();
  admissions.clear();
  dropped_snapshots.clear();
}

absl::StatusOr<Scheduler> Scheduler::Create(const SchedulerConfig& config, const KvCostModel& cost,
                                            int64_t total_kv_blocks) {
  const SchedulerConfig& c = config;
  if (c.max_model_len < 1 || c.max_tokens_per_step < 1 || c.max_running < 1 || c.max_waiting < 0 ||
      c.num_micro_batches < 1 || c.admission_watermark_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler: max_model_len ", c.max_model_len, ", max_tokens_per_step ",
        c.max_tokens_per_step, ", max_running ", c.max_running, ", num_micro_batches ",
        c.num_micro_batches, " must be >= 1; max_waiting ", c.max_waiting,
        ", admission_watermark_blocks ", c.admission_watermark_blocks, " must be >= 0"));
  }
  if (c.max_tokens_per_step < c.max_running) {
    // Otherwise decode entries could use the whole budget and starve the oldest prefill.
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: max_tokens_per_step = ", c.max_tokens_per_step,
                     " must be >= max_running = ", c.max_running));
  }
  if (total_kv_blocks <= cost.fixed_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: ", total_kv_blocks, " KV blocks cannot hold one token (",
                     cost.fixed_blocks, " fixed blocks per sequence)"));
  }
  absl::StatusOr<KvAccounting> kv =
      KvAccounting::Create(cost, total_kv_blocks, config.prefix_caching);
  if (!kv.ok()) return kv.status();
  return Scheduler(config, *std::move(kv));
}

Scheduler::Scheduler(const SchedulerConfig& config, KvAccounting kv)
    : config_(config), kv_(std::move(kv)) {
  micro_batches_.resize(static_cast<size_t>(config.num_micro_batches));
  running_.reserve(static_cast<size_t>(config.max_running));
}

int64_t Scheduler::num_in_flight() const {
  int64_t n = 0;
  for (const MicroBatch& mb : micro_batches_) n += mb.busy ? 1 : 0;
  return n;
}

bool Scheduler::GetRequestStatus(RequestId id, RequestStatus* status) const {
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  const Seq& s = slots_[it->second];
  *status = {.waiting = s.waiting,
             .in_flight = s.in_flight,
             .processed = s.processed,
             .prefill_target = s.prefill_target,
             .generated = s.generated,
             .preemptions = s.preemptions,
             .cached_tokens = s.cached_tokens};
  return true;
}

uint32_t Scheduler::AllocSlot() {
  if (free_slots_.empty()) {
    slots_.emplace_back();
    return static_cast<uint32_t>(slots_.size() - 1);
  }
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void Scheduler::FreeSlot(uint32_t slot) {
  Seq& s = slots_[slot];
  index_.erase(s.id);
  s.live = false;
  ++s.occupancy;
  free_slots_.push_back(slot);
}

void Scheduler::RemoveRunning(uint32_t slot) {
  auto it = std::find(running_.begin(), running_.end(), slot);
  assert(it != running_.end());
  running_.erase(it);
}

void Scheduler::Finish(uint32_t slot) {
  kv_.Release(slots_[slot].id);
  RemoveRunning(slot);
  FreeSlot(slot);
}

SubmitOutcome Scheduler::Submit(const Request& r) {
  if (r.prompt_tokens < 1 || r.max_new_tokens < 1) return SubmitOutcome::kInvalid;
  // Compared one by one first: the sum of two huge client values must not overflow.
  if (r.prompt_tokens > config_.max_model_len || r.max_new_tokens > config_.max_model_len ||
      r.prompt_tokens + r.max_new_tokens > config_.max_model_len) {
    return SubmitOutcome::kTooLong;
  }
  if (kv_.cost().BlocksForTokens(r.prompt_tokens + r.max_new_tokens - 1) > kv_.total_blocks()) {
    return SubmitOutcome::kExceedsKvCapacity;
  }
  if (index_.contains(r.id) || cancelled_in_flight_.contains(r.id)) {
    return SubmitOutcome::kDuplicateId;
  }
  if (num_waiting() >= config_.max_waiting) return SubmitOutcome::kQueueFull;

  const uint32_t slot = AllocSlot();
  Seq& s = slots_[slot];
  const uint32_t occupancy = s.occupancy;
  s = Seq{};
  s.occupancy = occupancy;
  s.id = r.id;
  s.arrival = next_arrival_++;
  s.prompt_tokens = r.prompt_tokens;
  s.max_new_tokens = r.max_new_tokens;
  s.prefill_target = r.prompt_tokens;
  if (config_.prefix_caching && static_cast<int64_t>(r.prompt.size()) == r.prompt_tokens) {
    s.tokens.assign(r.prompt.begin(), r.prompt.end());
    s.reuse_prefix = r.reuse_prefix;
  }
  s.live = true;
  s.waiting = true;
  index_.emplace(r.id, slot);
  waiting_.push_back(slot);
  return SubmitOutcome::kQueued;
}

CancelOutcome Scheduler::Cancel(RequestId id) {
  auto it = index_.find(id);
  if (it == index_.end()) return CancelOutcome::kUnknownId;
  const uint32_t slot = it->second;
  Seq& s = slots_[slot];
  kv_.Release(id);
  if (s.waiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), slot));
  } else {
    RemoveRunning(slot);
  }
  if (s.in_flight) cancelled_in_flight_.insert(id);
  FreeSlot(slot);
  return CancelOutcome::kCancelled;
}

void Scheduler::PreemptYoungest(StepPlan* plan, int64_t* budget) {
  const uint32_t slot = running_.back();
  running_.pop_back();
  Seq& v = slots_[slot];
  if (v.in_plan) {
    // Only decode entries of younger sequences can be in the plan already: prefill is planned
    // oldest first, after decode, and admission does not happen in a step that preempts.
    assert(v.plan_decode);
    plan->decode.erase(std::find_if(plan->decode.begin(), plan->decode.end(),
                                    [&](const DecodeEntry& e) { return e.id == v.id; }));
    *budget += 1;
    v.in_plan = false;
  }
  kv_.Release(v.id);
  ++v.incarnation;
  ++v.preemptions;
  v.processed = 0;
  v.prefill_target = v.prompt_tokens + v.generated;
  v.waiting = true;
  waiting_.push_front(slot);
  plan->preempted.push_back(v.id);
}

int64_t Scheduler::MakeRoom(uint32_t slot, StepPlan* plan, int64_t* budget) {
  const Seq& s = slots_[slot];
  while (true) {
    const int64_t reach = kv_.TokensReachable(s.id);
    if (reach > s.processed || running_.back() == slot) return reach;
    PreemptYoungest(plan, budget);
  }
}

StepOutcome Scheduler::Step(StepPlan* plan) {
  plan->Clear();
  MicroBatch* mb = nullptr;
  for (MicroBatch& m : micro_batches_) {
    if (!m.busy) {
      mb = &m;
      break;
    }
  }
  if (mb == nullptr) return StepOutcome::kNoFreeMicroBatch;
  int64_t budget = config_.max_tokens_per_step;

  // 1. Decode, oldest first. Preemption only pops younger sequences off running_'s back.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    const uint32_t slot = running_[i];
    Seq& s = slots_[slot];
    if (s.in_flight || s.processed < s.prefill_target) continue;
    const int64_t need = s.processed + 1;
    if (kv_.TokensCovered(s.id) < need) {
      if (MakeRoom(slot, plan, &budget) < need) continue;
      kv_.Grow(s.id, need);
    }
    plan->decode.push_back({s.id, s.processed});
    s.processed = need;
    s.in_plan = true;
    s.plan_decode = true;
    --budget;
  }

  // 2a. Prefill of admitted sequences, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    const uint32_t slot = running_[i];
    Seq& s = slots_[slot];
    if (s.in_flight || s.processed >= s.prefill_target) continue;
    const int64_t reach = MakeRoom(slot, plan, &budget);  // may refund budget
    const int64_t length = CutAtSnapshotPoint(
        s, s.processed, std::min({s.prefill_target - s.processed, budget, reach - s.processed}));
    if (length <= 0) continue;
    kv_.Grow(s.id, s.processed + length);
    plan->prefill.push_back({s.id, s.processed, length, s.processed + length == s.prefill_target});
    s.processed += length;
    MaybeSave(slot, s.processed, plan);
    s.in_plan = true;
    s.plan_decode = false;
    budget -= length;
  }

  // 2b. Admission in arrival order; the head blocks the queue. Never preempts, and not in a step
  // that preempted (the victim would be re-admitted into the blocks just taken from it).
  while (budget > 0 && !waiting_.empty() && plan->preempted.empty()) {
    const uint32_t slot = waiting_.front();
    Seq& s = slots_[slot];
    if (s.in_flight || num_running() >= config_.max_running) break;
    const int64_t reserve = running_.empty() ? 0 : config_.admission_watermark_blocks;
    const PrefixHit hit = s.reuse_prefix ? kv_.Lookup(s.tokens, s.prefill_target - 1) : PrefixHit{};
    const int64_t start = hit.tokens;
    const int64_t length =
        CutAtSnapshotPoint(s, start,
                           std::min({s.prefill_target - start, budget,
                                     kv_.TokensReachableWith(hit, reserve) - start}));
    if (length <= 0) break;
    SnapshotTicket restore;
    kv_.Admit(s.id, hit, start + length, &restore);
    if (start > 0) plan->restores.push_back({s.id, start, restore.id, std::move(restore.blocks)});
    if (!s.admitted_once) {
      s.admitted_once = true;
      s.cached_tokens = start;
      plan->admissions.push_back({s.id, start});
      if (!s.tokens.empty()) {
        prefix_queries_ += s.prefill_target;
        prefix_hits_ += start;
      }
    }
    waiting_.pop_front();
    s.waiting = false;
    running_.push_back(slot);
    plan->prefill.push_back({s.id, start, length, start + length == s.prefill_target});
    s.processed = start + length;
    MaybeSave(slot, s.processed, plan);
    s.in_plan = true;
    s.plan_decode = false;
    budget -= length;
  }

  if (plan->decode.empty() && plan->prefill.empty()) {
    for (PendingSave& p : planned_saves_) kv_.AbortSnapshot(p.ticket);  // none: nothing planned
    planned_saves_.clear();
    return StepOutcome::kIdle;
  }

  // Commit: entries in plan order (decode, then prefill; each oldest first = running_ order).
  mb->busy = true;
  mb->id = next_micro_batch_++;
  mb->entries.clear();
  mb->num_sampling = static_cast<int64_t>(plan->decode.size());
  for (const bool decode_pass : {true, false}) {
    size_t k = 0;
    for (const uint32_t slot : running_) {
      Seq& s = slots_[slot];
      if (!s.in_plan || s.plan_decode != decode_pass) continue;
      assert(decode_pass || plan->prefill[k].id == s.id);
      const bool samples = decode_pass || plan->prefill[k++].samples;
      if (!decode_pass && samples) ++mb->num_sampling;
      mb->entries.push_back({slot, s.occupancy, s.incarnation, s.id, samples, s.processed});
      s.in_flight = true;
    }
  }
  for (const uint32_t slot : running_) slots_[slot].in_plan = false;
  mb->saves = std::move(planned_saves_);
  planned_saves_.clear();
  plan->dropped_snapshots = kv_.TakeEvictedSnapshots();
  plan->micro_batch_id = mb->id;
  return StepOutcome::kPlanned;
}

absl::Status Scheduler::Complete(uint64_t micro_batch_id, std::span<const SampledToken> results,
                                 std::vector<TokenEvent>* events) {
  MicroBatch* mb = nullptr;
  for (MicroBatch& m : micro_batches_) {
    if (m.busy && m.id == micro_batch_id) mb = &m;
  }
  if (mb == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: micro-batch ", micro_batch_id, " is not in flight"));
  }
  if (static_cast<int64_t>(results.size()) != mb->num_sampling) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: micro-batch ", micro_batch_id, " has ", mb->num_sampling,
                     " sampling entries, got ", results.size(), " results"));
  }
  size_t k = 0;
  for (const FlightEntry& e : mb->entries) {
    if (!e.samples) continue;
    if (results[k].id != e.id) {
      return absl::InvalidArgumentError(
          absl::StrCat("scheduler: micro-batch ", micro_batch_id, " result ", k, " is for request ",
                       results[k].id, ", the plan has request ", e.id));
    }
    ++k;
  }

  CompleteCache(*mb);
  k = 0;
  for (const FlightEntry& e : mb->entries) {
    const SampledToken* r = e.samples ? &results[k++] : nullptr;
    Seq& s = slots_[e.slot];
    if (!s.live || s.occupancy != e.occupancy) {
      cancelled_in_flight_.erase(e.id);  // cancelled while in flight: dropped
      continue;
    }
    s.in_flight = false;
    if (s.incarnation != e.incarnation || r == nullptr) continue;  // preempted, or mid-prompt
    ++s.generated;
    if (!s.tokens.empty()) s.tokens.push_back(r->token);
    FinishReason finish = r->finish;
    if (finish == FinishReason::kNone && s.generated >= s.max_new_tokens) {
      finish = FinishReason::kLength;
    }
    events->push_back({e.id, r->token, finish});
    if (finish != FinishReason::kNone) Finish(e.slot);
  }
  mb->busy = false;
  mb->entries.clear();
  return absl::OkStatus();
}

int64_t Scheduler::CutAtSnapshotPoint(const Seq& s, int64_t start, int64_t length) const {
  if (s.tokens.empty()) return length;
  const int64_t B = kv_.cost().block_tokens;
  const int64_t point = s.prefill_target / B * B;
  return start < point && start + length > point ? point - start : length;
}

void Scheduler::MaybeSave(uint32_t slot, int64_t end, StepPlan* plan) {
  const Seq& s = slots_[slot];
  if (s.tokens.empty() ||
      end != s.prefill_target / kv_.cost().block_tokens * kv_.cost().block_tokens) {
    return;
  }
  PendingSave p{slot, s.occupancy, s.incarnation, s.id, end, {}};
  if (!kv_.BeginSnapshot(s.id, end, config_.admission_watermark_blocks, &p.ticket)) return;
  plan->saves.push_back({s.id, end, p.ticket.id, p.ticket.blocks});
  planned_saves_.push_back(std::move(p));
}

void Scheduler::CompleteCache(MicroBatch& mb) {
  auto valid = [&](uint32_t slot, uint32_t occupancy, uint32_t incarnation) {
    const Seq& s = slots_[slot];
    return s.live && s.occupancy == occupancy && s.incarnation == incarnation;
  };
  for (const FlightEntry& e : mb.entries) {
    const Seq& s = slots_[e.slot];
    if (s.tokens.empty() || !valid(e.slot, e.occupancy, e.incarnation)) continue;
    kv_.Register(s.id, std::span<const int32_t>(s.tokens).first(
                           static_cast<size_t>(std::min<int64_t>(e.end, s.tokens.size()))));
  }
  for (const PendingSave& p : mb.saves) {
    if (valid(p.slot, p.occupancy, p.incarnation)) {
      kv_.CommitSnapshot(p.id, p.position, p.ticket);
    } else {
      kv_.AbortSnapshot(p.ticket);
    }
  }
  mb.saves.clear();
}

}  // namespace ss::sched
