#include "gpu_worker/stage_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster_protocol.h"
#include "gpu_worker/sampler.h"
#include "gpu_worker/step_progress.h"

namespace ss::gpu {

namespace pb = ::splitserve::v1;

namespace {

// The penalties of `p` into `config` (an unset repetition_penalty, 0, means 1: off).
void SetPenalties(const pb::SamplingParams& p, SamplingConfig* config) {
  config->frequency_penalty = p.frequency_penalty();
  config->presence_penalty = p.presence_penalty();
  config->repetition_penalty = p.repetition_penalty() == 0.0f ? 1.0f : p.repetition_penalty();
}

// The sampling chunks' tokens into `result`, in the plan's order: the backend's where it gave one
// (StageOutput::tokens), else SampleToken on the chunk's logits -- those in parallel over the
// chunks (OpenMP on the worker's cores; SampleToken is pure, and each draw depends only on its
// chunk), so a step of many sampled sequences does not sample them one after another. The
// first failing chunk's error (in the plan's order), naming its sequence.
absl::Status SampleChunks(const pb::StepPlan& plan, std::span<const StageChunk> batch,
                          const std::vector<SamplingConfig>& sampling,
                          const std::vector<std::vector<uint32_t>>& allowed,
                          const TokenHistories& histories, const StageOutput& out, int64_t vocab,
                          pb::StepResult* result) {
  struct Draw {
    size_t chunk = 0, si = 0;
    absl::StatusOr<SampledToken> token = absl::UnknownError("not drawn");
  };
  std::vector<Draw> draws;  // the chunks sampled here
  size_t si = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].samples) continue;
    const bool given = si < out.tokens.size() && out.tokens[si] >= 0;
    if (!given &&
        (si >= out.logits.size() || static_cast<int64_t>(out.logits[si].size()) != vocab)) {
      return absl::InternalError(
          absl::StrCat("sequence ", batch[i].seq_id, ": the backend returned no logits to sample"));
    }
    if (!given) draws.push_back({.chunk = i, .si = si});
    ++si;
  }
  const int64_t n = static_cast<int64_t>(draws.size());
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (int64_t d = 0; d < n; ++d) {
    Draw& w = draws[static_cast<size_t>(d)];
    const StageChunk& ch = batch[w.chunk];
    const pb::SeqChunk& c = plan.chunks(static_cast<int>(w.chunk));
    SamplingInputs inputs;
    inputs.history = histories.Find(ch.seq_id);
    inputs.allowed = allowed[w.si];
    inputs.banned = std::span<const int32_t>(c.banned_tokens().data(), c.banned_tokens_size());
    const int64_t position = ch.start + static_cast<int64_t>(ch.tokens.size()) - 1;
    w.token = SampleToken(out.logits[w.si].data(), vocab, sampling[w.si], position, inputs);
  }
  size_t next = 0;  // the next draw, in chunk order
  si = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].samples) continue;
    pb::Sample* sample = result->add_samples();
    sample->set_seq_id(batch[i].seq_id);
    if (si < out.tokens.size() && out.tokens[si] >= 0) {  // the backend's greedy token
      sample->set_token(out.tokens[si++]);
      continue;
    }
    const absl::StatusOr<SampledToken>& t = draws[next++].token;
    const SamplingConfig& s = sampling[si++];
    if (!t.ok()) {
      return absl::Status(t.status().code(),
                          absl::StrCat("sequence ", batch[i].seq_id, ": ", t.status().message()));
    }
    sample->set_token(t->token);
    if (s.top_logprobs >= 0) {
      sample->set_logprob(t->logprob);
      for (const auto& [id, lp] : t->top) {
        pb::TokenLogprob* tl = sample->add_top();
        tl->set_token(id);
        tl->set_logprob(lp);
      }
    }
  }
  return absl::OkStatus();
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void ExportExpertHeat(metrics::Metrics& m, const std::string& worker,
                      std::shared_ptr<const ExpertHeat> heat) {
  // Each counter with the value it should hold: the counters follow at each scrape.
  struct Follower {
    prometheus::Counter* counter = nullptr;
    std::function<uint64_t(const ExpertHeat&)> value;
    uint64_t done = 0;
  };
  struct Exported {
    std::shared_ptr<const ExpertHeat> heat;
    std::vector<uint64_t> done;                  // what the expert counters hold
    std::vector<prometheus::Counter*> counters;  // layer-major, as ExpertHeat::Snapshot
    std::vector<Follower> followers;
  };
  auto e = std::make_shared<Exported>();
  e->heat = std::move(heat);
  const ExpertHeat& h = *e->heat;
  for (int l = h.first_layer(); l < h.end_layer(); ++l) {
    for (int x = 0; x < h.n_experts(); ++x) {
      e->counters.push_back(&m.Counter(
          "gpu_worker_expert_routed_total",
          "routed choices of each expert on the expert path (decode, CPU-path prefill)",
          {{"layer", std::to_string(l)}, {"expert", std::to_string(x)}, {"worker", worker}}));
    }
    for (ChoicePath p : {ChoicePath::kCpu, ChoicePath::kGpu}) {
      e->followers.push_back(
          {&m.Counter("gpu_worker_routed_choices_total",
                      "routed choices computed on the GPU (resident experts) or the CPU",
                      {{"layer", std::to_string(l)},
                       {"path", p == ChoicePath::kGpu ? "gpu" : "cpu"},
                       {"worker", worker}}),
           [l, p](const ExpertHeat& s) { return s.choices(l, p); }});
    }
  }
  e->followers.push_back(
      {&m.Counter("gpu_worker_expert_cpu_read_bytes_total",
                  "bytes of routed-expert weights the CPU read for this worker's choices",
                  {{"worker", worker}}),
       [](const ExpertHeat& s) { return s.cpu_read_bytes(); }});
  e->followers.push_back(
      {&m.Counter("gpu_worker_expert_rebalances_total",
                  "resident experts replaced by hotter ones while serving", {{"worker", worker}}),
       [](const ExpertHeat& s) { return s.rebalance_swaps(); }});
  e->followers.push_back({&m.Counter("gpu_worker_expert_rebalance_bytes_total",
                                     "bytes copied to the GPU by the resident experts' rebalance",
                                     {{"worker", worker}}),
                          [](const ExpertHeat& s) { return s.rebalance_bytes(); }});
  e->done.assign(e->counters.size(), 0);
  m.OnScrape([e] {
    e->heat->Refresh();
    const std::vector<uint64_t> now = e->heat->Snapshot();
    for (size_t i = 0; i < now.size() && i < e->counters.size(); ++i) {
      if (now[i] > e->done[i]) e->counters[i]->Increment(static_cast<double>(now[i] - e->done[i]));
      e->done[i] = now[i];
    }
    for (Follower& f : e->followers) {
      const uint64_t v = f.value(*e->heat);
      if (v > f.done) f.counter->Increment(static_cast<double>(v - f.done));
      f.done = v;
    }
  });
}

WorkerMetrics::WorkerMetrics(metrics::Metrics& m, const std::string& worker, int first_layer,
                             int end_layer)
    : first_layer_(first_layer),
      steps_(m.Counter("gpu_worker_steps_total", "step plans run", {{"worker", worker}})),
      errors_(m.Counter("gpu_worker_step_errors_total", "step plans answered with an error",
                        {{"worker", worker}})),
      kv_used_(m.Gauge("gpu_worker_kv_tokens_used", "KV positions held by live sequences",
                       {{"worker", worker}})),
      kv_capacity_(
          m.Gauge("gpu_worker_kv_tokens_capacity", "KV capacity in tokens", {{"worker", worker}})),
      kv_usage_(m.Gauge("gpu_worker_kv_usage_perc", "KV usage, 0..1", {{"worker", worker}})),
      sequences_(m.Gauge("gpu_worker_sequences", "sequences holding state", {{"worker", worker}})),
      streamed_steps_(m.Counter("gpu_worker_routed_experts_steps_total",
                                "steps by where their routed experts ran",
                                {{"path", "streamed"}, {"worker", worker}})),
      cpu_steps_(m.Counter("gpu_worker_routed_experts_steps_total",
                           "steps by where their routed experts ran",
                           {{"path", "cpu"}, {"worker", worker}})),
      streamed_rows_(m.Counter("gpu_worker_routed_experts_rows_total",
                               "tokens of the steps by where their routed experts ran",
                               {{"path", "streamed"}, {"worker", worker}})),
      cpu_rows_(m.Counter("gpu_worker_routed_experts_rows_total",
                          "tokens of the steps by where their routed experts ran",
                          {{"path", "cpu"}, {"worker", worker}})),
      streamed_bytes_(m.Counter("gpu_worker_streamed_bytes_total",
                                "routed-expert bytes copied host to device by streamed steps",
                                {{"worker", worker}})),
      h2d_gbps_(m.Gauge("gpu_worker_streamed_h2d_gbps",
                        "the last streamed step's achieved host-to-device GB/s (bytes / span)",
                        {{"worker", worker}})),
      copy_busy_(m.Gauge("gpu_worker_streamed_copy_busy_ratio",
                         "the last streamed step's copy-engine busy fraction (copy seconds / span)",
                         {{"worker", worker}})),
      threshold_(m.Gauge("gpu_worker_gpu_prefill_threshold_rows",
                         "rows from which a step's routed experts stream to the GPU (+Inf: never, "
                         "0: no streamed path)",
                         {{"worker", worker}})) {
  const char* help = "wall time of one part of one layer per micro-batch";
  auto hist = [&](int layer, const char* part) {
    return &m.Histogram("layer_latency_seconds", help,
                        {{"layer", std::to_string(layer)}, {"part", part}, {"worker", worker}});
  };
  for (int l = first_layer; l < end_layer; ++l) {
    attention_.push_back(hist(l, "attention"));
    moe_gpu_.push_back(hist(l, "moe_gpu"));
    moe_cpu_.push_back(hist(l, "moe_cpu"));
    allreduce_.push_back(hist(l, "allreduce"));
  }
  pp_receive_ = hist(first_layer, "pp_transfer");
  pp_send_ = hist(end_layer - 1, "pp_transfer");
  auto step = [&](const char* part) {
    return &m.Histogram("gpu_worker_step_seconds",
                        "wall time of a step plan on this worker, whole (total) and its backend "
                        "run (layers, head, logits to the host) and sampling",
                        {{"part", part}, {"worker", worker}});
  };
  step_total_ = step("total");
  step_backend_ = step("backend");
  step_sample_ = step("sample");
  for (const char* how : {"none", "launched", "captured", "replayed"}) {
    graph_steps_.push_back(&m.Counter(
        "gpu_worker_graph_steps_total",
        "steps by how their layers ran: none (no CUDA graphs: cpu backend, streamed step), "
        "launched (kernel by kernel, a new step shape), captured (a shape's second sight), "
        "replayed",
        {{"how", how}, {"worker", worker}}));
    graph_seconds_.push_back(&m.Histogram("gpu_worker_graph_step_seconds",
                                          "wall time of a step's backend run, by how its layers "
                                          "ran (gpu_worker_graph_steps_total)",
                                          {{"how", how}, {"worker", worker}}));
  }
}

void WorkerMetrics::ObserveStep(const StageTimings& t, int64_t rows, const StepSeconds& s,
                                bool ok) {
  steps_.Increment();
  if (!ok) errors_.Increment();
  threshold_.Set(t.gpu_prefill_threshold == std::numeric_limits<int64_t>::max()
                     ? std::numeric_limits<double>::infinity()
                     : static_cast<double>(t.gpu_prefill_threshold));
  if (ok && t.experts_streamed) {
    streamed_steps_.Increment();
    streamed_rows_.Increment(static_cast<double>(rows));
    streamed_bytes_.Increment(static_cast<double>(t.streamed_bytes));
    if (t.streamed_span_seconds > 0) {
      h2d_gbps_.Set(static_cast<double>(t.streamed_bytes) / t.streamed_span_seconds / 1e9);
      copy_busy_.Set(t.streamed_copy_seconds / t.streamed_span_seconds);
    }
  } else if (ok) {
    cpu_steps_.Increment();
    cpu_rows_.Increment(static_cast<double>(rows));
  }
  for (size_t i = 0; i < t.attention.size() && i < attention_.size(); ++i) {
    attention_[i]->Observe(t.attention[i]);
    moe_gpu_[i]->Observe(t.moe_gpu[i]);
    moe_cpu_[i]->Observe(t.moe_cpu[i]);
    if (i < t.allreduce.size() && i < allreduce_.size()) allreduce_[i]->Observe(t.allreduce[i]);
  }
  if (s.receive > 0) pp_receive_->Observe(s.receive);
  if (s.send > 0) pp_send_->Observe(s.send);
  step_total_->Observe(s.total);
  if (s.backend > 0) {
    step_backend_->Observe(s.backend);
    const auto how = static_cast<size_t>(t.graph);
    if (ok && how < graph_steps_.size()) {
      graph_steps_[how]->Increment();
      graph_seconds_[how]->Observe(s.backend);
    }
  }
  if (s.sample > 0) step_sample_->Observe(s.sample);
}

void WorkerMetrics::SetKv(const KvUsage& kv) {
  kv_used_.Set(static_cast<double>(kv.used_tokens));
  kv_capacity_.Set(static_cast<double>(kv.capacity_tokens));
  kv_usage_.Set(kv.capacity_tokens > 0
                    ? static_cast<double>(kv.used_tokens) / static_cast<double>(kv.capacity_tokens)
                    : 0.0);
  sequences_.Set(static_cast<double>(kv.sequences));
}

StageRunner::StageRunner(StageBackend* backend, const StageRole& role, StreamInbox* inbox,
                         StreamSender* sender, WorkerMetrics* metrics, const RunnerOptions& options,
                         StageLinks links)
    : backend_(backend),
      role_(role),
      metrics_(metrics),
      options_(options),
      grpc_in_(links.in == nullptr && inbox != nullptr ? std::make_unique<GrpcStageInput>(inbox)
                                                       : nullptr),
      grpc_out_(links.out == nullptr && sender != nullptr
                    ? std::make_unique<GrpcStageOutput>(sender)
                    : nullptr),
      in_(role.stage > 0 ? (links.in != nullptr ? links.in : grpc_in_.get()) : nullptr),
      out_(!role.last_stage() ? (links.out != nullptr ? links.out : grpc_out_.get()) : nullptr),
      device_streams_((links.in != nullptr && links.in->memory() == StageMemory::kDevice) ||
                      (links.out != nullptr && links.out->memory() == StageMemory::kDevice)) {}

pb::StepResult StageRunner::RunPlan(const pb::StepPlan& plan) {
  const auto t0 = std::chrono::steady_clock::now();
  pb::StepResult result;
  result.set_micro_batch_id(plan.micro_batch_id());
  StageTimings timings;
  if (plan.chunks_size() > 0) {
    const int every = options_.layer_timing_every;
    bool prefill = false;
    for (const pb::SeqChunk& c : plan.chunks())
      prefill |= c.tokens_size() >= kAlwaysTimedChunkTokens;
    timings.layers = every > 0 && (chunk_plans_ % every == 0 || prefill);
    ++chunk_plans_;
  }
  StepSeconds seconds;
  group_broken_ = false;
  link_broken_ = false;
  NoteStepProgress();
  const absl::Status st = Run(plan, &result, &timings, &seconds);
  NoteStepProgress();
  if (!st.ok()) {
    result.clear_samples();
    result.set_error(
        absl::StrCat("stage ", role_.stage, " (worker ", role_.worker_id, "): ", st.message()));
    if (group_broken_ && role_.tp_size > 1 && options_.on_group_broken) {
      options_.on_group_broken(result.error());
    }
    if (link_broken_ && options_.on_link_broken) options_.on_link_broken(result.error());
  }
  const auto t1 = std::chrono::steady_clock::now();
  result.set_compute_us(std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count());
  if (metrics_) {
    int64_t rows = 0;
    for (const pb::SeqChunk& c : plan.chunks()) rows += c.tokens_size();
    seconds.total = std::chrono::duration<double>(t1 - t0).count();
    metrics_->ObserveStep(timings, rows, seconds, st.ok());
    metrics_->SetKv(backend_->kv_usage());
  }
  return result;
}

void StageRunner::ReleaseAll() {
  backend_->ReleaseAll();
  histories_.Clear();
}

absl::Status StageRunner::Send(uint64_t id, int64_t rows, int64_t width, const void* streams,
                               std::string_view failure) {
  const absl::Status st =
      out_->Send(id, rows, width, streams, failure, absl::Now() + options_.push_deadline);
  if (!st.ok() && out_->paired()) link_broken_ = true;
  return st;
}

void StageRunner::PushError(uint64_t id, const std::string& error, int64_t rows) {
  if (out_ == nullptr) return;
  const ModelConfig& mc = backend_->config();
  // Best effort: a failure breaks a paired link (and is the step's to report); otherwise the next
  // stage fails the micro-batch by its own deadline.
  (void)Send(id, rows, mc.hc_mult * mc.dim, nullptr, error.empty() ? "failed" : error);
}

absl::Status StageRunner::Run(const pb::StepPlan& plan, pb::StepResult* result,
                              StageTimings* timings, StepSeconds* seconds) {
  const uint64_t mb = plan.micro_batch_id();
  const bool has_chunks = plan.chunks_size() > 0;
  const ModelConfig& mc = backend_->config();
  const int64_t width = mc.hc_mult * mc.dim;
  int64_t T = 0;  // the plan's tokens
  for (const pb::SeqChunk& c : plan.chunks()) T += c.tokens_size();
  const bool paired_in = in_ != nullptr && in_->paired();
  auto fail = [&](const absl::Status& st) {
    if (has_chunks) {
      PushError(mb, std::string(st.message()), T);
      if (in_ != nullptr && !paired_in) in_->Skip(mb);
    }
    return st;
  };
  // A paired link: the plan's message first, whatever follows (stage_link.h).
  StageLink::Received received;
  if (has_chunks && paired_in) {
    const auto r0 = std::chrono::steady_clock::now();
    auto got = in_->Receive(mb, T, width, absl::Now() + options_.stream_wait);
    seconds->receive = SecondsSince(r0);
    if (!got.ok()) {
      link_broken_ = true;
      group_broken_ = true;
      return fail(got.status());
    }
    received = *std::move(got);
  }
  if (plan.protocol_version() != kClusterProtocolVersion) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("step plan protocol version ", plan.protocol_version(),
                     ", this worker speaks version ", kClusterProtocolVersion)));
  }
  for (const uint64_t id : plan.release()) {
    backend_->Release(id);
    histories_.Release(id);
  }
  for (const uint64_t id : plan.drop_snapshots()) backend_->DropSnapshot(id);
  if (!has_chunks) return absl::OkStatus();

  std::vector<StageChunk> batch;
  std::vector<SamplingConfig> sampling;
  std::vector<std::vector<uint32_t>> allowed;  // per sampling entry; empty: unconstrained
  for (const pb::SeqChunk& c : plan.chunks()) {
    StageChunk ch;
    ch.seq_id = c.seq_id();
    ch.start = c.start();
    ch.tokens = std::span<const int32_t>(c.tokens().data(), c.tokens_size());
    ch.samples = c.samples();
    ch.block_table = std::span<const int32_t>(c.block_table().data(), c.block_table_size());
    ch.restore_snapshot =
        std::span<const int32_t>(c.restore_snapshot().data(), c.restore_snapshot_size());
    ch.restore_snapshot_id = c.restore_snapshot_id();
    ch.table_fixed_blocks = plan.kv_fixed_blocks();
    batch.push_back(ch);
    if (!c.samples()) continue;
    const pb::SamplingParams& p = c.sampling();
    SamplingConfig s;
    s.temperature = p.temperature();
    s.top_p = p.top_p();
    s.top_k = p.top_k();
    s.seed = p.has_seed() ? p.seed() : DefaultSeed(options_.process_seed, c.seq_id());
    s.top_logprobs = p.top_logprobs();
    for (const auto& [tok, bias] : p.logit_bias()) s.logit_bias.emplace_back(tok, bias);
    std::sort(s.logit_bias.begin(), s.logit_bias.end());  // the map's order is unspecified
    s.min_p = p.min_p();
    SetPenalties(p, &s);
    absl::Status st = ValidateSampling(s);
    const size_t mask_bytes = static_cast<size_t>((mc.vocab_size + 31) / 32) * 4;
    if (st.ok() && !c.allowed_tokens().empty() && c.allowed_tokens().size() != mask_bytes) {
      st = absl::InvalidArgumentError(absl::StrCat("allowed_tokens has ", c.allowed_tokens().size(),
                                                   " bytes, the vocabulary needs ", mask_bytes));
    }
    for (const int32_t id : c.banned_tokens()) {
      if (st.ok() && (id < 0 || id >= mc.vocab_size)) {
        st = absl::InvalidArgumentError(
            absl::StrCat("banned token ", id, " is not in the vocabulary"));
      }
    }
    if (!st.ok()) {
      return fail(
          absl::InvalidArgumentError(absl::StrCat("sequence ", c.seq_id(), ": ", st.message())));
    }
    batch.back().greedy =
        IsPlainGreedy(s) && c.allowed_tokens().empty() && c.banned_tokens().empty();
    sampling.push_back(s);
    allowed.emplace_back(c.allowed_tokens().size() / 4);
    if (!c.allowed_tokens().empty()) {
      std::memcpy(allowed.back().data(), c.allowed_tokens().data(), c.allowed_tokens().size());
    }
  }
  if (absl::Status st = backend_->Check(batch); !st.ok()) return fail(st);

  if (in_ != nullptr && !paired_in) {
    const auto r0 = std::chrono::steady_clock::now();
    auto got = in_->Receive(mb, T, width, absl::Now() + options_.stream_wait);
    seconds->receive = SecondsSince(r0);
    if (!got.ok()) {
      group_broken_ = true;  // the peers may have received theirs and run
      return fail(got.status());
    }
    received = *std::move(got);
  }
  if (in_ != nullptr && received.failed) {
    return fail(
        absl::AbortedError(absl::StrCat("the previous stage failed micro-batch ", mb,
                                        received.failure.empty() ? "" : ": ", received.failure)));
  }
  StageOutput out;
  const auto b0 = std::chrono::steady_clock::now();
  if (absl::Status st =
          device_streams_
              ? backend_->RunDevice(batch, received.streams, &out, timings)
              : backend_->Run(batch, static_cast<const float*>(received.streams), &out, timings);
      !st.ok()) {
    group_broken_ = true;
    return fail(st);
  }
  seconds->backend = SecondsSince(b0);
  auto drop = [&](const absl::Status& st) {
    for (const StageChunk& ch : batch) histories_.Release(ch.seq_id);
    if (role_.tp_size > 1) return st;  // the ranks' states stay identical (see the header)
    for (const StageChunk& ch : batch) backend_->Release(ch.seq_id);
    return st;
  };
  for (const pb::SnapshotSave& save : plan.save_snapshots()) {
    const absl::Status st =
        backend_->SaveSnapshot(save.seq_id(), save.position(), save.snapshot_id(),
                               std::span<const int32_t>(save.blocks().data(), save.blocks_size()));
    if (st.ok()) continue;
    if (!role_.last_stage() && out_ != nullptr) {
      (void)Send(mb, T, width, nullptr, "failed");  // the message the next stage waits for
    }
    return drop(absl::Status(st.code(), absl::StrCat("snapshot of sequence ", save.seq_id(), " at ",
                                                     save.position(), ": ", st.message())));
  }
  if (!role_.last_stage()) {
    if (out_ == nullptr) return drop(absl::InternalError("no transport to the next stage"));
    const auto s0 = std::chrono::steady_clock::now();
    const bool device = out_->memory() == StageMemory::kDevice;
    if ((out_->paired() && (out.rows != T || out.width != width)) ||
        (!device && static_cast<int64_t>(out.streams.size()) != out.rows * out.width)) {
      (void)Send(mb, T, width, nullptr, "failed");  // the message the next stage waits for
      return drop(
          absl::InternalError(absl::StrCat("the stage's output streams are [", out.rows, ", ",
                                           out.width, "], the plan's [", T, ", ", width, "]")));
    }
    const absl::Status st =
        Send(mb, out.rows, out.width, device ? out.device_streams : out.streams.data(), {});
    seconds->send = SecondsSince(s0);
    return st.ok() ? st : drop(st);
  }
  if (role_.tp_rank != 0) return absl::OkStatus();
  for (int i = 0; i < plan.chunks_size(); ++i) {
    const pb::SamplingParams& p = plan.chunks(i).sampling();
    SamplingConfig penalties;
    SetPenalties(p, &penalties);
    if (!penalties.has_penalties()) continue;
    const StageChunk& ch = batch[static_cast<size_t>(i)];
    if (absl::Status st = histories_.Observe(ch.seq_id, ch.start, ch.tokens, p.prompt_tokens());
        !st.ok()) {
      return drop(st);
    }
  }
  const auto sample0 = std::chrono::steady_clock::now();
  if (absl::Status st =
          SampleChunks(plan, batch, sampling, allowed, histories_, out, mc.vocab_size, result);
      !st.ok()) {
    result->clear_samples();
    return drop(st);
  }
  seconds->sample = SecondsSince(sample0);
  return absl::OkStatus();
}

}  // namespace ss::gpu
