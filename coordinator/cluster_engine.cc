#include "coordinator/cluster_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cluster_protocol.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace ss::coord {

namespace pb = splitserve::v1;

struct ClusterEngine::WorkerConn {
  std::string id;
  uint64_t generation = 0;
  std::unique_ptr<pb::GpuWorker::Stub> stub;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReaderWriter<pb::StepPlan, pb::StepResult>> stream;
  std::thread reader;
  int64_t kv_blocks = 0;
  std::string last_error;  // the latest step error it answered (a TP rank exits after one)
};

namespace {

// Micro-batch ids on the wire: (connection epoch << kEpochShift) | the scheduler's id, so ids
// never repeat across reconnections (a stage's inbox may still hold an old micro-batch's
// streams when the cluster reconnects).
constexpr int kEpochShift = 40;

int SamplerIndex(const ClusterConfig& c) {
  int index = 0;
  for (size_t s = 0; s + 1 < c.stages.size(); ++s)
    index += static_cast<int>(c.stages[s].workers.size());
  return index;
}

std::string WorkerList(const std::vector<std::string>& ids) {
  std::string out;
  for (const std::string& id : ids) absl::StrAppend(&out, out.empty() ? "" : ", ", id);
  return out;
}

}  // namespace

absl::Status CheckEngineOptions(const ClusterEngineOptions& options, const ClusterConfig& config) {
  const absl::Duration twice = absl::Milliseconds(2 * int64_t{config.heartbeat_interval_ms});
  if (options.stall_timeout < twice || options.step_timeout < twice) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the stall timeout (", absl::FormatDuration(options.stall_timeout),
        ") and the step timeout (", absl::FormatDuration(options.step_timeout),
        ") must be at least twice the cluster config's heartbeat_interval_ms (",
        config.heartbeat_interval_ms, " ms): progress reaches the coordinator with heartbeats"));
  }
  return absl::OkStatus();
}

ClusterEngine::ClusterEngine(ControlService& control, const ModelConfig& model,
                             ClusterEngineOptions options)
    : control_(control),
      model_(model),
      options_(options),
      sampler_index_(SamplerIndex(control.config())) {}

ClusterEngine::~ClusterEngine() { Stop(); }

void ClusterEngine::Start() {
  if (supervisor_.joinable()) return;
  supervisor_ = std::thread([this] { Supervise(); });
}

void ClusterEngine::Stop() {
  stop_.store(true);
  cv_.SignalAll();
  if (supervisor_.joinable()) supervisor_.join();
  FailAll(FinishReason::kCancelled, "");
}

bool ClusterEngine::Ready() const {
  if (!serving_.load() || draining_.load()) return false;
  absl::MutexLock lock(&mu_);
  return !SilentLocked(options_.stall_timeout).has_value();
}

std::optional<ClusterEngine::Silence> ClusterEngine::SilentLocked(absl::Duration limit) const {
  const absl::Time now = absl::Now();
  // The members' progress is read only when some micro-batch has been quiet that long anyway.
  bool quiet = false;
  for (const auto& [mb, f] : in_flight_) quiet = quiet || now - f.last_answer >= limit;
  if (!quiet) return std::nullopt;
  const std::vector<MemberInfo> members = control_.Members();  // in GpuWorkerIds() order
  std::optional<Silence> worst;
  for (const auto& [mb, f] : in_flight_) {
    absl::Time sign = f.last_answer;
    std::vector<std::string> waiting_on;
    for (size_t i = 0; i < f.answered.size() && i < members.size(); ++i) {
      if (f.answered[i]) continue;
      waiting_on.push_back(members[i].id);
      sign = std::max(sign, members[i].last_progress);
    }
    if (now - sign < limit || (worst && now - sign <= worst->silent)) continue;
    worst = Silence{mb, now - f.sent, now - sign, std::move(waiting_on)};
  }
  return worst;
}

void ClusterEngine::ReportStall(const std::optional<Silence>& stall) {
  if (stall && !stall_reported_) {
    spdlog::warn(
        "micro-batch {} stalled: unanswered for {} and no progress for {} from the workers it "
        "waits on ({}): not ready (GET /ready 503) until it is answered or progresses; it fails "
        "after {} without progress",
        stall->micro_batch,
        absl::FormatDuration(absl::Trunc(stall->unanswered, absl::Milliseconds(1))),
        absl::FormatDuration(absl::Trunc(stall->silent, absl::Milliseconds(1))),
        WorkerList(stall->waiting_on), absl::FormatDuration(options_.step_timeout));
  } else if (!stall && stall_reported_) {
    spdlog::info("no micro-batch is stalled any more: ready again");
  }
  stall_reported_ = stall.has_value();
}

void ClusterEngine::BeginDrain() { draining_.store(true); }

bool ClusterEngine::WaitIdle(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (!requests_.empty()) {
    if (absl::Now() >= deadline) return false;
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(20));
  }
  return true;
}

double ClusterEngine::KvUsage() const {
  absl::MutexLock lock(&mu_);
  if (!scheduler_ || scheduler_->kv().total_blocks() == 0) return 0.0;
  return static_cast<double>(scheduler_->kv().used_blocks()) /
         static_cast<double>(scheduler_->kv().total_blocks());
}

int64_t ClusterEngine::NumWaiting() const {
  absl::MutexLock lock(&mu_);
  return scheduler_ ? scheduler_->num_waiting() : 0;
}

int64_t ClusterEngine::NumRunning() const {
  absl::MutexLock lock(&mu_);
  return scheduler_ ? scheduler_->num_running() : 0;
}

int64_t ClusterEngine::MaxSequenceTokens() const {
  absl::MutexLock lock(&mu_);
  return scheduler_ ? MaxSequenceTokensLocked() : 0;
}

int64_t ClusterEngine::MaxSequenceTokensLocked() const {
  // The largest prompt + max_tokens the scheduler admits into an empty pool (Scheduler::Submit).
  int64_t lo = 0, hi = scheduler_->config().max_model_len;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (scheduler_->kv().cost().BlocksForTokens(mid - 1) <= scheduler_->kv().total_blocks()) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

int64_t ClusterEngine::NumPreemptions() const {
  absl::MutexLock lock(&mu_);
  return preemptions_;
}

int64_t ClusterEngine::KvBlocks() const {
  absl::MutexLock lock(&mu_);
  return scheduler_ ? scheduler_->kv().total_blocks() : 0;
}

ClusterEngine::PrefixCacheCounters ClusterEngine::PrefixCache() const {
  absl::MutexLock lock(&mu_);
  PrefixCacheCounters c = past_pools_;
  if (scheduler_) {
    c.queries += scheduler_->prefix_cache_queries();
    c.hits += scheduler_->prefix_cache_hits();
    c.blocks = scheduler_->kv().cached_blocks();
  }
  return c;
}

SubmitOutcome ClusterEngine::Submit(GenerationRequest request) {
  SubmitOutcome out;
  if (!Ready()) {
    out.status = SubmitStatus::kNotReady;
    return out;
  }
  auto stream = std::make_shared<GenerationStream>();
  // Ids the model cannot embed or bias would fail the whole micro-batch on the workers: refuse
  // here.
  std::string bad;
  auto check = [&](const char* what, int32_t id) {
    if (bad.empty() && (id < 0 || id >= model_.vocab_size)) {
      bad = absl::StrCat(what, " token id ", id, " is outside the vocabulary [0, ",
                         model_.vocab_size, ")");
    }
  };
  for (int32_t id : request.prompt) check("prompt", id);
  for (const auto& [id, bias] : request.sampling.logit_bias) check("logit_bias", id);
  if (!bad.empty()) {
    stream->Finish(FinishReason::kError, bad);
    out.stream = stream;
    return out;
  }
  absl::MutexLock lock(&mu_);
  if (!scheduler_ || !serving_.load()) {
    out.status = SubmitStatus::kNotReady;
    return out;
  }
  const sched::RequestId id = next_id_++;
  // The workers' penalties need every id of the sequence, which a resumed sequence's chunks do
  // not carry: such requests fill the cache but do not resume from it.
  const SamplingParams& sp = request.sampling;
  const bool penalised =
      sp.frequency_penalty != 0.0f || sp.presence_penalty != 0.0f || sp.repetition_penalty != 1.0f;
  sched::Request sr{id, static_cast<int64_t>(request.prompt.size()), request.sampling.max_tokens,
                    request.prompt, !penalised};
  switch (scheduler_->Submit(sr)) {
    case sched::SubmitOutcome::kQueued:
      break;
    case sched::SubmitOutcome::kQueueFull:
      out.status = SubmitStatus::kOverloaded;
      out.retry_after_s = 1;
      return out;
    case sched::SubmitOutcome::kInvalid:
      stream->Finish(FinishReason::kError, "empty prompt or max_tokens < 1");
      out.stream = stream;
      return out;
    case sched::SubmitOutcome::kTooLong:
      out.status = SubmitStatus::kRejected;
      out.error = absl::StrCat("prompt + max_tokens exceeds the model's context of ",
                               scheduler_->config().max_model_len, " tokens");
      return out;
    case sched::SubmitOutcome::kExceedsKvCapacity:
      out.status = SubmitStatus::kRejected;
      out.error =
          absl::StrCat("prompt + max_tokens (", request.prompt.size() + request.sampling.max_tokens,
                       " tokens) needs more KV cache than the cluster has: at most ",
                       MaxSequenceTokensLocked(), " tokens fit (", scheduler_->kv().total_blocks(),
                       " blocks of ", scheduler_->kv().cost().block_tokens, " tokens)");
      return out;
    case sched::SubmitOutcome::kDuplicateId:
      stream->Finish(FinishReason::kError, "internal: duplicate request id");
      out.stream = stream;
      return out;
  }
  Request& r = requests_[id];
  r.tokens = request.prompt;
  r.prompt_len = static_cast<int64_t>(request.prompt.size());
  r.req = std::move(request);
  r.stream = stream;
  r.in_scheduler = true;
  out.stream = stream;
  cv_.SignalAll();
  return out;
}

void ClusterEngine::EndRequestLocked(sched::RequestId id, FinishReason reason,
                                     const std::string& error) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  if (it->second.in_scheduler && scheduler_) scheduler_->Cancel(id);
  it->second.stream->Finish(reason, error);
  releases_.push_back(id);
  requests_.erase(it);
}

void ClusterEngine::FailAll(FinishReason reason, const std::string& error) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, r] : requests_) r.stream->Finish(reason, error);
  requests_.clear();
  releases_.clear();
  dropped_snapshots_.clear();
  in_flight_.clear();
  results_.clear();
  if (scheduler_) {
    past_pools_.queries += scheduler_->prefix_cache_queries();
    past_pools_.hits += scheduler_->prefix_cache_hits();
  }
  scheduler_.reset();
  cv_.SignalAll();
}

void ClusterEngine::Supervise() {
  while (!stop_.load()) {
    // Until every member has registered there is nothing to connect to: that wait is quiet, and
    // so is a Connect cancelled by Stop().
    const bool registered = control_.WaitAllAlive(absl::Seconds(1));
    const absl::Status connected =
        registered ? Connect() : absl::UnavailableError("members are registering");
    if (!connected.ok()) {
      if (registered && !absl::IsCancelled(connected)) {
        spdlog::warn("cluster not ready: {}", std::string(connected.message()));
      }
      Disconnect();
      const absl::Time retry = absl::Now() + absl::Milliseconds(500);
      absl::MutexLock lock(&mu_);
      while (!stop_.load() && !cv_.WaitWithDeadline(&mu_, retry)) {
      }
      continue;
    }
    spdlog::info("cluster ready: {} GPU workers, KV pool {} blocks", workers_.size(), KvBlocks());
    stall_reported_ = false;
    serving_.store(true);
    const absl::Status failure = ServeLoop();
    serving_.store(false);
    if (!failure.ok()) spdlog::error("cluster failure: {}", std::string(failure.message()));
    Disconnect();
    FailAll(stop_.load() ? FinishReason::kCancelled : FinishReason::kError,
            stop_.load() ? "" : std::string(failure.message()));
  }
}

absl::Status ClusterEngine::Connect() {
  const ClusterConfig& config = control_.config();
  const std::vector<MemberInfo> members = control_.Members();
  workers_.clear();
  int64_t min_blocks = -1;
  const absl::Time ready_deadline = absl::Now() + options_.ready_timeout;
  for (const MemberInfo& m : members) {
    workers_.push_back(std::make_unique<WorkerConn>());
    WorkerConn* w = workers_.back().get();
    w->id = m.id;
    w->generation = m.generation;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    args.SetMaxSendMessageSize(256 << 20);
    w->stub = pb::GpuWorker::NewStub(control_.credential().CreateChannel(m.address, args));
    // Poll Status until the worker has loaded its stage.
    while (true) {
      if (stop_.load()) return absl::CancelledError("stopping");
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
      pb::StatusRequest req;
      req.set_protocol_version(kClusterProtocolVersion);
      pb::WorkerStatus st;
      const grpc::Status rpc = w->stub->Status(&ctx, req, &st);
      if (rpc.ok() && st.protocol_version() != kClusterProtocolVersion) {
        return absl::FailedPreconditionError(
            absl::StrCat("worker ", m.id, " speaks cluster protocol ", st.protocol_version(),
                         ", the coordinator ", kClusterProtocolVersion));
      }
      if (rpc.ok() && !st.error().empty()) {
        control_.DeclareDead(m.id, m.generation);
        return absl::UnavailableError(
            absl::StrCat("worker ", m.id, " failed to start: ", st.error()));
      }
      if (rpc.ok() && st.ready()) {
        w->kv_blocks = st.kv_blocks();
        break;
      }
      if (!rpc.ok() && rpc.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
          rpc.error_code() != grpc::StatusCode::UNAVAILABLE) {
        return absl::UnavailableError(
            absl::StrCat("worker ", m.id, " Status: ", rpc.error_message()));
      }
      if (absl::Now() > ready_deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "worker ", m.id, " not ready after ", absl::FormatDuration(options_.ready_timeout),
            rpc.ok() ? "" : absl::StrCat(": ", rpc.error_message())));
      }
      for (const std::string& dead : control_.CheckHeartbeats()) {
        if (dead == m.id) {
          return absl::UnavailableError(
              absl::StrCat("worker ", m.id, " stopped sending heartbeats while loading"));
        }
      }
      RETURN_IF_ERROR(Superseded());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (w->kv_blocks <= 0) {
      control_.DeclareDead(m.id, m.generation);
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", m.id, " reports no KV capacity"));
    }
    min_blocks = min_blocks < 0 ? w->kv_blocks : std::min(min_blocks, w->kv_blocks);
  }

  // The scheduler: one pipeline, the stages' cost models combined.
  std::vector<sched::KvCostModel> stage_costs;
  for (const StageSpec& s : config.stages) {
    sched::KvCostOptions o;
    o.block_tokens = config.kv_block_tokens;
    o.first_layer = s.first_layer;
    o.end_layer = s.end_layer;
    o.include_mtp = false;  // the workers run no MTP yet
    absl::StatusOr<sched::KvCostModel> cost = sched::KvCostModel::FromModelConfig(model_, o);
    if (!cost.ok()) return cost.status();
    stage_costs.push_back(*cost);
  }
  absl::StatusOr<sched::KvCostModel> cost = sched::KvCostModel::Pipeline(stage_costs);
  if (!cost.ok()) return cost.status();
  sched::SchedulerConfig sc;
  sc.max_model_len = MaxModelLen(config, model_);
  sc.max_tokens_per_step = config.max_batch_tokens;
  sc.max_running = config.max_running;
  sc.max_waiting = config.max_waiting;
  sc.num_micro_batches = static_cast<int64_t>(config.stages.size());
  sc.admission_watermark_blocks = options_.admission_watermark_blocks;
  sc.prefix_caching = config.enable_prefix_caching;
  absl::StatusOr<sched::Scheduler> scheduler = sched::Scheduler::Create(sc, *cost, min_blocks);
  if (!scheduler.ok()) {
    return absl::Status(scheduler.status().code(),
                        absl::StrCat("scheduler: ", scheduler.status().message()));
  }

  // Step streams and their readers.
  for (size_t i = 0; i < workers_.size(); ++i) {
    WorkerConn& w = *workers_[i];
    w.context = std::make_unique<grpc::ClientContext>();
    w.stream = w.stub->Steps(w.context.get());
    w.reader = std::thread([this, i, &w] {
      pb::StepResult r;
      while (w.stream->Read(&r)) {
        absl::MutexLock lock(&mu_);
        results_.push_back(Result{static_cast<int>(i), false, "", std::move(r)});
        cv_.SignalAll();
        r = pb::StepResult();
      }
      const grpc::Status st = w.stream->Finish();
      absl::MutexLock lock(&mu_);
      results_.push_back(Result{static_cast<int>(i),
                                true,
                                absl::StrCat("step stream of worker ", w.id,
                                             " ended: ", st.ok() ? "closed" : st.error_message()),
                                {}});
      cv_.SignalAll();
    });
  }
  absl::MutexLock lock(&mu_);
  ++epoch_;
  if (scheduler_) {
    past_pools_.queries += scheduler_->prefix_cache_queries();
    past_pools_.hits += scheduler_->prefix_cache_hits();
  }
  scheduler_.emplace(std::move(*scheduler));
  results_.clear();
  in_flight_.clear();
  releases_.clear();
  dropped_snapshots_.clear();
  return absl::OkStatus();
}

absl::Status ClusterEngine::Superseded() const {
  const std::vector<MemberInfo> members = control_.Members();
  for (const MemberInfo& m : members) {
    if (m.dead) return absl::AbortedError(absl::StrCat("worker ", m.id, " was declared dead"));
  }
  for (const auto& w : workers_) {
    for (const MemberInfo& m : members) {
      if (m.id == w->id && m.generation != w->generation) {
        return absl::AbortedError(
            absl::StrCat("worker ", m.id, " registered again (its process was restarted)"));
      }
    }
  }
  return absl::OkStatus();
}

void ClusterEngine::Disconnect() {
  for (auto& w : workers_) {
    if (w->context) w->context->TryCancel();
  }
  for (auto& w : workers_) {
    if (w->reader.joinable()) w->reader.join();
  }
  workers_.clear();
}

void ClusterEngine::AddSampleConstraints(const Request& r, pb::SeqChunk* chunk) const {
  const SamplingParams& sp = r.req.sampling;
  if (r.req.constraint) {
    std::vector<uint32_t> mask(static_cast<size_t>((model_.vocab_size + 31) / 32), 0u);
    r.req.constraint->FillAllowed(mask);
    chunk->set_allowed_tokens(
        std::string(reinterpret_cast<const char*>(mask.data()), mask.size() * sizeof(uint32_t)));
  }
  const int64_t generated = static_cast<int64_t>(r.tokens.size()) - r.prompt_len;
  if (generated < sp.min_tokens) {
    if (!sp.ignore_eos) chunk->add_banned_tokens(model_.eos_token_id);
    for (const int32_t id : sp.stop_token_ids) {
      if (id < model_.vocab_size) chunk->add_banned_tokens(id);  // others are never drawn
    }
  }
}

void ClusterEngine::PlanLocked(std::vector<pb::StepPlan>* out) {
  // Requests whose client went away.
  std::vector<sched::RequestId> cancelled;
  for (auto& [id, r] : requests_) {
    if (r.req.cancel && r.req.cancel->cancelled()) cancelled.push_back(id);
  }
  for (sched::RequestId id : cancelled) EndRequestLocked(id, FinishReason::kCancelled, "");

  sched::StepPlan plan;
  while (true) {
    const sched::StepOutcome o = scheduler_->Step(&plan);
    if (o != sched::StepOutcome::kPlanned) break;
    pb::StepPlan msg;
    msg.set_protocol_version(kClusterProtocolVersion);
    msg.set_micro_batch_id((epoch_ << kEpochShift) | plan.micro_batch_id);
    msg.set_kv_fixed_blocks(static_cast<uint32_t>(scheduler_->kv().cost().fixed_blocks));
    for (sched::RequestId id : plan.preempted) releases_.push_back(id);
    preemptions_ += static_cast<int64_t>(plan.preempted.size());
    if (options_.on_step_tokens) {
      int64_t tokens = static_cast<int64_t>(plan.decode.size());
      for (const sched::PrefillChunk& c : plan.prefill) tokens += c.length;
      options_.on_step_tokens(tokens);
    }
    for (uint64_t id : releases_) msg.add_release(id);
    releases_.clear();
    // Drops go one plan late: this plan may still restore a snapshot evicted while planning it.
    for (uint64_t id : dropped_snapshots_) msg.add_drop_snapshots(id);
    dropped_snapshots_ = std::move(plan.dropped_snapshots);
    for (const sched::Save& save : plan.saves) {
      pb::SnapshotSave* s = msg.add_save_snapshots();
      s->set_seq_id(save.id);
      s->set_position(save.position);
      s->set_snapshot_id(save.snapshot_id);
      for (int32_t b : save.blocks) s->add_blocks(b);
    }
    for (const sched::Admission& a : plan.admissions) {
      if (auto it = requests_.find(a.id); it != requests_.end()) {
        it->second.stream->SetCachedTokens(a.cached_tokens);
        it->second.stream->MarkScheduled();
      }
    }
    InFlight flight;
    flight.sent = absl::Now();
    flight.last_answer = flight.sent;
    flight.answered.assign(workers_.size(), false);
    auto add_chunk = [&](sched::RequestId id, int64_t start, int64_t length, bool samples)
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                           Request& r = requests_.at(id);
                           pb::SeqChunk* c = msg.add_chunks();
                           c->set_seq_id(id);
                           c->set_start(start);
                           for (int64_t p = start; p < start + length; ++p)
                             c->add_tokens(r.tokens[p]);
                           c->set_samples(samples);
                           for (int32_t b : scheduler_->BlockTable(id)) c->add_block_table(b);
                           for (const sched::Restore& rs : plan.restores) {
                             if (rs.id != id || rs.tokens != start) continue;
                             c->set_restore_snapshot_id(rs.snapshot_id);
                             for (int32_t b : rs.snapshot) c->add_restore_snapshot(b);
                           }
                           pb::SamplingParams* sp = c->mutable_sampling();
                           sp->set_temperature(r.req.sampling.temperature);
                           sp->set_top_p(r.req.sampling.top_p);
                           sp->set_top_k(r.req.sampling.top_k);
                           sp->set_has_seed(r.req.sampling.seed.has_value());
                           sp->set_seed(r.req.sampling.seed.value_or(0));
                           sp->set_top_logprobs(r.req.sampling.top_logprobs);
                           for (const auto& [tok, bias] : r.req.sampling.logit_bias)
                             (*sp->mutable_logit_bias())[tok] = bias;
                           sp->set_min_p(r.req.sampling.min_p);
                           sp->set_frequency_penalty(r.req.sampling.frequency_penalty);
                           sp->set_presence_penalty(r.req.sampling.presence_penalty);
                           sp->set_repetition_penalty(r.req.sampling.repetition_penalty);
                           sp->set_prompt_tokens(r.prompt_len);
                           if (samples) AddSampleConstraints(r, c);
                           flight.all.push_back(id);
                           if (samples) flight.sampling.push_back(id);
                         };
    for (const sched::DecodeEntry& d : plan.decode) add_chunk(d.id, d.position, 1, true);
    for (const sched::PrefillChunk& p : plan.prefill) add_chunk(p.id, p.start, p.length, p.samples);
    in_flight_[plan.micro_batch_id] = std::move(flight);
    out->push_back(std::move(msg));
  }
}

void ClusterEngine::CompleteLocked(uint64_t micro_batch, InFlight& flight) {
  std::vector<sched::SampledToken> sampled;
  std::vector<sched::TokenEvent> events;
  std::map<sched::RequestId, TokenLogprobs> logprobs;  // of this micro-batch's sampled tokens
  const bool failed = !flight.error.empty();
  if (failed) {
    // Its sequences end with the error; the dummy results complete the micro-batch and are
    // dropped by the scheduler because those sequences are cancelled first.
    for (sched::RequestId id : flight.all) {
      EndRequestLocked(id, FinishReason::kError, flight.error);
    }
    for (sched::RequestId id : flight.sampling)
      sampled.push_back({id, 0, sched::FinishReason::kNone});
  } else {
    const pb::StepResult& res = *flight.sampler_result;
    for (size_t i = 0; i < flight.sampling.size(); ++i) {
      const sched::RequestId id = flight.sampling[i];
      const int32_t token = res.samples(static_cast<int>(i)).token();
      sched::FinishReason finish = sched::FinishReason::kNone;
      auto it = requests_.find(id);
      if (it != requests_.end()) {
        const SamplingParams& sp = it->second.req.sampling;
        if (token == model_.eos_token_id && !sp.ignore_eos) {
          finish = sched::FinishReason::kEos;
        } else if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), token) !=
                   sp.stop_token_ids.end()) {
          finish = sched::FinishReason::kStop;
        }
      }
      sampled.push_back({id, token, finish});
      if (it != requests_.end() && it->second.req.sampling.top_logprobs >= 0) {
        const pb::Sample& smp = res.samples(static_cast<int>(i));
        TokenLogprobs lp;
        lp.logprob = smp.logprob();
        for (const pb::TokenLogprob& t : smp.top()) lp.top.emplace_back(t.token(), t.logprob());
        logprobs[id] = std::move(lp);
      }
    }
  }
  if (absl::Status st = scheduler_->Complete(micro_batch, sampled, &events); !st.ok()) {
    spdlog::error("scheduler refused micro-batch {}: {}", micro_batch, std::string(st.message()));
    return;
  }
  for (const sched::TokenEvent& e : events) {
    auto it = requests_.find(e.id);
    if (it == requests_.end()) continue;
    Request& r = it->second;
    auto push = [&] {
      if (r.req.sampling.top_logprobs < 0) {
        r.stream->Push({e.token});
        return;
      }
      std::vector<TokenLogprobs> lp(1);
      if (auto l = logprobs.find(e.id); l != logprobs.end()) lp[0] = std::move(l->second);
      r.stream->Push({e.token}, std::move(lp));
    };
    const bool delivered =
        e.finish == sched::FinishReason::kNone || e.finish == sched::FinishReason::kLength;
    if (delivered && r.req.constraint && !r.req.constraint->Accept(e.token)) {
      r.in_scheduler = e.finish == sched::FinishReason::kNone;  // kLength: already out of it
      EndRequestLocked(e.id, FinishReason::kError,
                       absl::StrCat("generated token ", e.token, " is outside the request's ",
                                    "constraint (allowed-token mask not applied?)"));
      continue;
    }
    switch (e.finish) {
      case sched::FinishReason::kNone:
        r.tokens.push_back(e.token);
        push();
        break;
      case sched::FinishReason::kLength:
        push();
        r.in_scheduler = false;
        EndRequestLocked(e.id, FinishReason::kLength, "");
        break;
      case sched::FinishReason::kEos:
        r.in_scheduler = false;
        EndRequestLocked(e.id, FinishReason::kEos, "");
        break;
      case sched::FinishReason::kStop:
        r.in_scheduler = false;
        EndRequestLocked(e.id, FinishReason::kStop, "");
        break;
    }
  }
}

absl::Status ClusterEngine::ServeLoop() {
  std::vector<pb::StepPlan> plans;
  absl::Time last_heartbeat_check = absl::Now();
  while (!stop_.load()) {
    plans.clear();
    {
      absl::MutexLock lock(&mu_);
      // Results first: they free micro-batch slots and sequences for the next plans.
      while (!results_.empty()) {
        Result res = std::move(results_.front());
        results_.pop_front();
        if (res.broken) {
          const WorkerConn& w = *workers_[res.worker];
          control_.DeclareDead(w.id, w.generation);
          return absl::UnavailableError(
              w.last_error.empty()
                  ? res.broken_why
                  : absl::StrCat(res.broken_why, " (after its step error: ", w.last_error, ")"));
        }
        const uint64_t wire = res.result.micro_batch_id();
        auto it = (wire >> kEpochShift) == epoch_
                      ? in_flight_.find(wire & ((uint64_t{1} << kEpochShift) - 1))
                      : in_flight_.end();
        if (it == in_flight_.end()) {
          return absl::InternalError(absl::StrCat("worker ", workers_[res.worker]->id,
                                                  " answered unknown micro-batch ",
                                                  res.result.micro_batch_id()));
        }
        InFlight& f = it->second;
        ++f.answers;
        f.last_answer = absl::Now();
        f.answered[res.worker] = true;
        if (!res.result.error().empty()) workers_[res.worker]->last_error = res.result.error();
        if (!res.result.error().empty() && f.error.empty()) {
          f.error = absl::StrCat("worker ", workers_[res.worker]->id, ": ", res.result.error());
        }
        if (res.worker == sampler_index_ && res.result.error().empty()) {
          if (res.result.samples_size() != static_cast<int>(f.sampling.size())) {
            f.error = absl::StrCat("worker ", workers_[res.worker]->id, " returned ",
                                   res.result.samples_size(), " samples for ", f.sampling.size(),
                                   " sampling entries");
          } else {
            f.sampler_result = std::move(res.result);
          }
        }
        if (f.answers == static_cast<int>(workers_.size())) {
          if (options_.on_step_done && f.error.empty() && f.sampler_result) {
            options_.on_step_done(absl::ToDoubleSeconds(absl::Now() - f.sent),
                                  static_cast<double>(f.sampler_result->compute_us()) * 1e-6);
          }
          CompleteLocked(it->first, f);
          in_flight_.erase(it);
        }
      }
      std::optional<Silence> silence =
          SilentLocked(std::min(options_.stall_timeout, options_.step_timeout));
      if (silence && silence->silent >= options_.step_timeout) {
        return absl::DeadlineExceededError(
            absl::StrCat("micro-batch ", silence->micro_batch, " made no progress for ",
                         absl::FormatDuration(options_.step_timeout), " (unanswered by ",
                         WorkerList(silence->waiting_on), ")"));
      }
      if (silence && silence->silent < options_.stall_timeout) silence.reset();
      ReportStall(silence);
      PlanLocked(&plans);
      if (plans.empty()) {
        const absl::Time wake = absl::Now() + absl::Milliseconds(in_flight_.empty() ? 20 : 2);
        while (!stop_.load() && results_.empty() && !cv_.WaitWithDeadline(&mu_, wake)) {
        }
      }
    }
    for (const pb::StepPlan& plan : plans) {
      for (auto& w : workers_) {
        if (!w->stream->Write(plan)) {
          control_.DeclareDead(w->id, w->generation);
          return absl::UnavailableError(
              absl::StrCat("step stream of worker ", w->id, " refused a write"));
        }
      }
    }
    if (absl::Now() - last_heartbeat_check > absl::Milliseconds(200)) {
      last_heartbeat_check = absl::Now();
      const std::vector<std::string> dead = control_.CheckHeartbeats();
      if (!dead.empty()) {
        return absl::UnavailableError(
            absl::StrCat("worker ", dead.front(), " missed its heartbeats"));
      }
      RETURN_IF_ERROR(Superseded());
    }
  }
  return absl::OkStatus();
}

}  // namespace ss::coord
