// Runs one step plan (proto StepPlan) on this worker's stage and answers it (StepResult):
// releases ended sequences, validates, takes the previous stage's streams (stage > 0) or embeds
// (stage 0), runs the stage's layers on the backend, pushes the output streams to the next stage
// (non-last) or samples (last stage), and records metrics.
//
// Errors of a step go in StepResult.error, naming the sequence or layer at fault; the runner
// keeps serving. A step that fails before any state changed (protocol version, a malformed
// chunk, a start mismatch, KV capacity, bad sampling parameters) leaves every sequence as it
// was; one that fails later drops the step's sequences (backend.h). In both cases a non-last
// stage pushes the error downstream so the next stage fails the micro-batch at once.
//
// Sampling positions: the draw for a chunk is made at its last position (start + n - 1), seeded
// by SamplingParams.seed when has_seed, else by a per-process random value mixed with the
// sequence id (sampler.h). The penalties read the sequence's tokens, which the last stage's rank 0
// keeps from the chunks of every sequence whose parameters set one (token_histories.h); a chunk's
// banned_tokens and allowed_tokens apply to its draw only.
//
// Tensor parallelism (role.tp_size > 1). Every rank of the stage runs every plan; only the last
// stage's rank 0 samples. What fails before the backend runs (the plan's checks, the backend's
// Check) fails identically on every rank, since the ranks hold the same state; an error the
// previous stage pushed normally does too (each rank gets its counterpart rank's, and a stage
// that fails a micro-batch fails it on every rank), so the group stays in step. (Where it does
// not -- a previous-stage rank failed alone after its stage's last collective -- the ranks that
// ran wait in a collective until its deadline and then break the group as below.) A failure that
// may hit one rank alone -- the backend's Run (its collectives may now be out of step with the
// peers') or streams that did not arrive -- breaks the group: the runner answers the step with the
// error and calls `on_group_broken` (the worker then aborts its communicator and exits). Failures
// after a successful Run (the push to the next stage, sampling) drop no sequence on a TP rank, so
// the ranks' states stay identical; the coordinator fails and releases those sequences.
//
// The stage transport (stage_link.h): the streams come from the input end (stage > 0) and go to
// the output end (non-last), through the backend's RunDevice when a link keeps them in device
// memory (nccl), else its Run (grpc). On a paired link (nccl) the runner receives a plan's
// message before anything else, and sends exactly one message (the streams, or a failure) for
// every plan with chunks, so the two ends stay paired whatever fails. A paired link that breaks
// cannot be used again: the step answers the error and `on_link_broken` is called (the worker
// exits 1).
//
// Threads: RunPlan from one thread at a time (the worker's executor).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/expert_heat.h"
#include "gpu_worker/stage_link.h"
#include "gpu_worker/stage_transfer.h"
#include "gpu_worker/token_histories.h"
#include "gpu_worker/worker_config.h"
#include "proto/cluster.pb.h"

namespace ss::gpu {

// The worker's Prometheus series, created up front for the stage's layers.
//   layer_latency_seconds{layer, part, worker}  part: attention, moe_gpu, moe_cpu, allreduce,
//                                               pp_transfer (receive on the first layer, send
//                                               on the last)
//   gpu_worker_steps_total{worker}, gpu_worker_step_errors_total{worker}
//   gpu_worker_kv_tokens_used{worker}, gpu_worker_kv_tokens_capacity{worker},
//   gpu_worker_kv_usage_perc{worker} (0..1), gpu_worker_sequences{worker}
// Where the routed experts of each successful step ran (StageTimings, streamed_prefill.h):
//   gpu_worker_routed_experts_steps_total{path, worker}, ..._rows_total{path, worker}
//                                               path: streamed (copied to the GPU) or cpu
//   gpu_worker_streamed_bytes_total{worker}      bytes copied host -> device by streamed steps
//   gpu_worker_streamed_h2d_gbps{worker}         the last streamed step's bytes / span, GB/s
//   gpu_worker_streamed_copy_busy_ratio{worker}  its copy seconds / span (0..1)
//   gpu_worker_gpu_prefill_threshold_rows{worker}  rows from which a step streams (+Inf: never;
//                                               0: no streamed path), as of the last step
// The expert path's statistics (expert_heat.h) as counters brought up to date at each scrape
// (created up front, per layer and expert of the stage):
//   gpu_worker_expert_routed_total{layer, expert, worker}  choices of that expert
//   gpu_worker_routed_choices_total{layer, path, worker}   choices computed on path gpu (resident
//                                               experts) or cpu; the hit rate is gpu ÷ (gpu + cpu)
//   gpu_worker_expert_cpu_read_bytes_total{worker}  expert bytes the CPU read for the choices
//   gpu_worker_expert_rebalances_total{worker}      resident experts replaced by hotter ones
//   gpu_worker_expert_rebalance_bytes_total{worker} bytes copied to the GPU for them
void ExportExpertHeat(metrics::Metrics& m, const std::string& worker,
                      std::shared_ptr<const ExpertHeat> heat);

// One step's wall time on this worker, by part (seconds): the previous stage's streams received,
// the backend's Run (the layers, the head and the logits on the host), the sampling, the streams
// sent to the next stage, and the whole step plan.
struct StepSeconds {
  double receive = 0, backend = 0, sample = 0, send = 0, total = 0;
};

class WorkerMetrics {
 public:
  WorkerMetrics(metrics::Metrics& m, const std::string& worker_id, int first_layer, int end_layer);
  // A step of `rows` tokens: the layers' parts from `t`, the step's own parts from `s`
  // (gpu_worker_step_seconds{part="total"|"backend"|"sample"}; receive and send as the first and
  // last layer's pp_transfer); per-layer parts only where `t` has them (StageTimings::layers).
  void ObserveStep(const StageTimings& t, int64_t rows, const StepSeconds& s, bool ok);
  void SetKv(const KvUsage& kv);

 private:
  int first_layer_;
  std::vector<prometheus::Histogram*> attention_, moe_gpu_, moe_cpu_, allreduce_;
  prometheus::Histogram* pp_receive_;
  prometheus::Histogram* pp_send_;
  prometheus::Histogram* step_total_;
  prometheus::Histogram* step_backend_;
  prometheus::Histogram* step_sample_;
  // By StepGraph (backend.h): steps, and their backend runs' seconds
  // (gpu_worker_graph_steps_total / gpu_worker_graph_step_seconds{how}).
  std::vector<prometheus::Counter*> graph_steps_;
  std::vector<prometheus::Histogram*> graph_seconds_;
  prometheus::Counter& steps_;
  prometheus::Counter& errors_;
  prometheus::Gauge& kv_used_;
  prometheus::Gauge& kv_capacity_;
  prometheus::Gauge& kv_usage_;
  prometheus::Gauge& sequences_;
  prometheus::Counter& streamed_steps_;
  prometheus::Counter& cpu_steps_;
  prometheus::Counter& streamed_rows_;
  prometheus::Counter& cpu_rows_;
  prometheus::Counter& streamed_bytes_;
  prometheus::Gauge& h2d_gbps_;
  prometheus::Gauge& copy_busy_;
  prometheus::Gauge& threshold_;
};

// Steps with a chunk of at least this many tokens have their layers timed whenever
// layer_timing_every > 0.
inline constexpr int64_t kAlwaysTimedChunkTokens = 64;

struct RunnerOptions {
  absl::Duration stream_wait = absl::Seconds(120);  // stage > 0: for the previous stage's streams
  absl::Duration push_deadline = absl::Seconds(60);
  uint64_t process_seed = 0;  // unseeded sampling
  // The per-layer timings (WorkerMetrics' layer_latency_seconds) of every Nth step plan with
  // chunks, from the first, and of every plan with a chunk of at least kAlwaysTimedChunkTokens
  // tokens (prefill: the timing marks cost nothing measurable there, and sampling would miss most
  // of a prompt's chunks; a decode batch of many one-token chunks stays sampled): 1 every one, 0
  // none. The step's other metrics count every step.
  int layer_timing_every = 1;
  // TP > 1: called (on the runner's thread, before RunPlan returns) with the error of a step that
  // may have left the TP group's collectives out of step. Optional.
  std::function<void(const std::string& why)> on_group_broken;
  // Called (on the runner's thread) with the error of a step that broke a stage link. Optional.
  std::function<void(const std::string& why)> on_link_broken;
};

// A stage's two transport ends (stage_link.h), borrowed; a null end with an inbox or sender given
// is the grpc transport's (or none: the first or last stage).
struct StageLinks {
  StageLink* in = nullptr;
  StageLink* out = nullptr;
};

class StageRunner {
 public:
  // Under the grpc transport `inbox` is needed on stage > 0 and `sender` on a non-last stage
  // (the runner reaches them through GrpcStageInput / GrpcStageOutput); under the nccl one,
  // `links`. `metrics` is optional. All are borrowed and must outlive the runner.
  StageRunner(StageBackend* backend, const StageRole& role, StreamInbox* inbox,
              StreamSender* sender, WorkerMetrics* metrics, const RunnerOptions& options,
              StageLinks links = {});

  ::splitserve::v1::StepResult RunPlan(const ::splitserve::v1::StepPlan& plan);
  // Frees every sequence of the backend (a new step stream begins).
  void ReleaseAll();

 private:
  absl::Status Run(const ::splitserve::v1::StepPlan& plan, ::splitserve::v1::StepResult* result,
                   StageTimings* timings, StepSeconds* seconds);
  // `rows`: the plan's tokens (a paired link's message has the plan's size, failed or not).
  void PushError(uint64_t micro_batch_id, const std::string& error, int64_t rows);
  // Sends on out_ (`streams` null with a failure), noting a broken paired link.
  absl::Status Send(uint64_t micro_batch_id, int64_t rows, int64_t width, const void* streams,
                    std::string_view failure);

  StageBackend* backend_;
  const StageRole role_;
  WorkerMetrics* metrics_;
  const RunnerOptions options_;
  // The grpc transport's ends over `inbox` and `sender`, where no link is given.
  const std::unique_ptr<StageLink> grpc_in_, grpc_out_;
  StageLink* const in_;        // stage > 0: where the streams come from
  StageLink* const out_;       // non-last stage: where they go
  const bool device_streams_;  // a link in device memory: the backend runs RunDevice
  bool group_broken_ = false;  // the current step's failure may have split the TP group
  bool link_broken_ = false;   // the current step broke a stage link
  int64_t chunk_plans_ = 0;    // plans with chunks run so far (layer_timing_every)
  TokenHistories histories_;   // the last stage's rank 0: penalised sequences' tokens
};

}  // namespace ss::gpu
