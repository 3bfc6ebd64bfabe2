// The real GenerationEngine: the continuous-batching scheduler (scheduler.h) driving the GPU
// workers of a cluster over their step streams (proto/cluster.proto, service GpuWorker).
//
// Life of the cluster, as the engine's supervisor thread sees it:
//   connect   wait until every GPU worker of the config is registered and alive (control
//             service), poll each one's Status until it is ready, size the scheduler's KV pool
//             as the smallest pool any worker reports, and open one Steps stream per worker.
//   serve     the step loop: plan micro-batches (up to one per pipeline stage in flight), write
//             each plan to every worker (every stage, every TP rank) in planning order, read
//             results (a reader thread per stream); a micro-batch completes once every worker
//             has answered it, with the samples of the last stage's TP rank 0, and fails when
//             any worker answered it with an error; hand the sampled tokens back to the
//             scheduler and the requests' streams.
//   fail      a stream that breaks, a worker declared dead (missed heartbeats) or a micro-batch
//             without a sign of life for `step_timeout` (Stalls) ends every request in flight
//             with kError (naming the cause; for a stream that broke after its worker answered a
//             step with an error -- a TP rank leaves after such a step -- that error too) and
//             closes every stream; the engine goes back to `connect` and serves again once the
//             cluster is whole (a restarted worker registers again; the control service declares a
//             dead TP rank's peers dead too, so a stage's group is formed anew: control_service.h).
//             Workers start every Steps stream with no sequences, so nothing stale survives. A
//             worker that registers again (a restarted process: control_service.h) while the engine
//             is connecting or serving counts as a broken stream of its old process.
// Ready() is true only while serving a complete pipeline: not while connecting, draining, or while
// a micro-batch is stalled. Submit() refuses with kNotReady while not serving and with
// kOverloaded when the waiting queue is full.
//
// Stalls. A micro-batch's latest sign of life is the latest of: when it was sent, when a worker
// answered it, and when any worker that has not answered it yet last made progress (its
// heartbeats' step progress changed: control_service.h, gpu_worker/step_progress.h). A
// micro-batch silent for `stall_timeout` is stalled (a GPU worker, or an expert worker one waits
// on, is stopped or hung): Ready() is false, and a warning names the micro-batch and the workers
// it waits on; Ready() turns true again once it is answered or shows progress. One silent for
// `step_timeout` fails the cluster (above). So a micro-batch may take any time while its workers
// keep working (a long prefill on slow expert workers), and a hung step is still noticed after
// `stall_timeout` of silence. Progress arrives with the heartbeats, up to one heartbeat interval
// late, so both timeouts must be at least twice the cluster config's heartbeat_interval_ms
// (CheckEngineOptions), and longer than the longest stretch of a step without progress (one layer
// of a micro-batch, step_progress.h).
//
// A failed micro-batch (a worker answered it with an error) ends only its own sequences with
// kError; the cluster keeps serving the others.
//
// Sampling entries: a sampled token equal to the model's EOS id finishes kEos, one in the
// request's stop_token_ids kStop (neither is delivered); max_tokens finishes kLength.
//
// Threads: Submit, Ready and the getters from any thread. Start once, Stop from the owner.
// The engine's mutex is taken before the control service's (it reads members' progress under it).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model_config.h"
#include "coordinator/control_service.h"
#include "coordinator/engine.h"
#include "coordinator/scheduler.h"
#include "proto/cluster.grpc.pb.h"

namespace ss::coord {

struct ClusterEngineOptions {
  // A micro-batch without a sign of life (Stalls) this long fails the cluster ...
  absl::Duration step_timeout = absl::Seconds(120);
  // ... and this long: it is stalled, Ready() is false.
  absl::Duration stall_timeout = absl::Seconds(10);
  absl::Duration ready_timeout = absl::Seconds(600);  // per connect attempt: workers loading
  absl::Duration rpc_timeout = absl::Seconds(5);      // Status calls
  // Called with each planned step's token count (decode ids + prefill chunk tokens), under the
  // engine's lock: must be cheap and thread-safe (vLLM's iteration_tokens_total histogram).
  std::function<void(int64_t)> on_step_tokens;
  // Called with each micro-batch answered without error by every worker, under the engine's lock
  // (cheap, thread-safe): the seconds from its plan to its last answer, and the seconds the
  // sampling worker reported spending on it (StepResult.compute_us). The difference is the
  // step's transport and queueing.
  std::function<void(double round_trip_s, double worker_s)> on_step_done;
  // Free blocks kept back at admission (fewer preemptions); see SchedulerConfig.
  int64_t admission_watermark_blocks = 0;
};

// InvalidArgument naming the values unless step_timeout and stall_timeout are at least twice the
// cluster config's heartbeat_interval_ms (Stalls).
absl::Status CheckEngineOptions(const ClusterEngineOptions& options, const ClusterConfig& config);

class ClusterEngine : public GenerationEngine {
 public:
  // `control` must outlive the engine. The KV cost model is built from `model` and the config's
  // block size for each stage's layer range. The engine's calls to the workers carry
  // control.credential().
  ClusterEngine(ControlService& control, const ModelConfig& model, ClusterEngineOptions options);
  ~ClusterEngine() override;  // Stop()s

  // Starts the supervisor thread (connects in the background).
  void Start();
  // Ends every request (kCancelled), closes the streams, joins the threads. Idempotent.
  void Stop();
  // Refuse new requests (Submit: kNotReady) and let the running ones finish.
  void BeginDrain();
  // Waits until no request is queued or running, up to `timeout`. True when idle.
  bool WaitIdle(absl::Duration timeout);

  bool Ready() const override;
  SubmitOutcome Submit(GenerationRequest request) override;

  // For metrics: KV blocks in use / total (0 when not serving), requests waiting / running.
  double KvUsage() const;
  int64_t NumWaiting() const;
  int64_t NumRunning() const;
  // The largest prompt + max_tokens a request may ask for: the model's context, or less where
  // the KV pool holds less (0 when not serving).
  int64_t MaxSequenceTokens() const;
  // Sequences preempted (their KV freed, to be recomputed) since start.
  int64_t NumPreemptions() const;
  // Total KV blocks of the current pool (0 when not serving).
  int64_t KvBlocks() const;
  // Prefix cache: prompt tokens looked up and served from the cache since start (over every
  // pool the engine had), and the blocks the current pool's cache holds.
  struct PrefixCacheCounters {
    int64_t queries = 0, hits = 0, blocks = 0;
  };
  PrefixCacheCounters PrefixCache() const;

 private:
  struct Request {
    GenerationRequest req;
    std::shared_ptr<GenerationStream> stream;
    std::vector<int32_t> tokens;  // prompt, then every generated token
    int64_t prompt_len = 0;
    bool in_scheduler = false;
  };
  struct WorkerConn;  // one GPU worker's stub, step stream and reader thread
  // The per-draw parts of a sampling chunk: min_tokens' banned ids.
  void AddSampleConstraints(const Request& r, splitserve::v1::SeqChunk* chunk) const;
  struct Result {
    int worker = 0;
    bool broken = false;  // the stream ended
    std::string broken_why;
    splitserve::v1::StepResult result;
  };
  struct InFlight {
    std::vector<sched::RequestId> sampling;  // the plan's sampling entries, in order
    std::vector<sched::RequestId> all;       // every sequence of the plan
    absl::Time sent;
    absl::Time last_answer;      // `sent`, then the time of its latest answer
    std::vector<bool> answered;  // per worker (GpuWorkerIds() order)
    int answers = 0;             // workers that answered
    std::optional<splitserve::v1::StepResult> sampler_result;
    std::string error;  // first error any worker reported
  };

  void Supervise();
  // Connects to every registered worker and builds the scheduler. An error says why the cluster
  // is not whole or a worker failed to start; kCancelled once Stop() was called. Supervisor
  // thread only.
  absl::Status Connect();
  // Runs steps until a failure (the error describes it) or Stop() (OK). Supervisor thread only.
  absl::Status ServeLoop();
  void Disconnect();
  // kAborted, saying why, once the connected workers are no longer the cluster: a member was
  // declared dead, or one of workers_ registered again since it was connected. Supervisor thread
  // only.
  absl::Status Superseded() const;
  // Ends every request with `reason` (and `error`); clears the scheduler. Takes mu_.
  void FailAll(FinishReason reason, const std::string& error) ABSL_LOCKS_EXCLUDED(mu_);
  // Plans as many micro-batches as may be in flight into `out`.
  void PlanLocked(std::vector<splitserve::v1::StepPlan>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies one completed micro-batch.
  void CompleteLocked(uint64_t micro_batch, InFlight& flight) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndRequestLocked(sched::RequestId id, FinishReason reason, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // An in-flight micro-batch without a sign of life (Stalls).
  struct Silence {
    uint64_t micro_batch = 0;
    absl::Duration unanswered;            // since it was sent
    absl::Duration silent;                // since its latest sign of life
    std::vector<std::string> waiting_on;  // the workers that have not answered it
  };
  // The in-flight micro-batch silent the longest, when silent for `limit` or more.
  std::optional<Silence> SilentLocked(absl::Duration limit) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes a stall beginning or ending (a warning naming it, or ready again). Supervisor thread.
  void ReportStall(const std::optional<Silence>& stall);

  ControlService& control_;
  const ModelConfig model_;
  const ClusterEngineOptions options_;
  const int sampler_index_;  // the last stage's TP rank 0, in GpuWorkerIds() order

  std::atomic<bool> serving_{false};
  std::atomic<bool> draining_{false};
  std::atomic<bool> stop_{false};
  std::thread supervisor_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // submissions, results, stop
  std::optional<sched::Scheduler> scheduler_ ABSL_GUARDED_BY(mu_);
  std::map<sched::RequestId, Request> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> releases_ ABSL_GUARDED_BY(mu_);           // for the next plan
  std::vector<uint64_t> dropped_snapshots_ ABSL_GUARDED_BY(mu_);  // for the next plan
  std::map<uint64_t, InFlight> in_flight_ ABSL_GUARDED_BY(mu_);
  std::deque<Result> results_ ABSL_GUARDED_BY(mu_);
  sched::RequestId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by every successful Connect
  int64_t MaxSequenceTokensLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PrefixCacheCounters past_pools_ ABSL_GUARDED_BY(mu_);
  int64_t preemptions_ ABSL_GUARDED_BY(mu_) = 0;      // counters of replaced schedulers
  std::vector<std::unique_ptr<WorkerConn>> workers_;  // supervisor thread only
  bool stall_reported_ = false;                       // supervisor thread only
};

}  // namespace ss::coord
