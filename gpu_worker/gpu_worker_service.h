// The GpuWorker gRPC service (proto/cluster.proto) of splitserve-gpu-worker:
//   Status       protocol version, ready (the stage loaded), its start-up error, KV blocks and
//                weight / KV bytes
//   Steps        the coordinator's persistent stream of step plans; every plan is answered by
//                exactly one StepResult, in the order received
//   PushStreams  the previous stage's output streams (from its worker of this TP rank), held in
//                the StreamInbox
// Every call must carry the cluster credential (proto/cluster_credential.h): one that does not
// is answered UNAUTHENTICATED before anything else and changes nothing. Every request's
// protocol_version is checked: Status and PushStreams refuse another version with
// FAILED_PRECONDITION naming both; a step plan of another version is answered with an error
// result (the stream stays open).
//
// One Steps stream at a time. A new stream starts with no sequences (it frees every sequence of
// the old one), so it is accepted only once no other stream is live (still reading plans); a
// second stream waits up to kStepsHandover for the live one to end (a coordinator that
// reconnects cancels its old stream first) and is then refused with FAILED_PRECONDITION, the
// live stream untouched. A live stream ends when its client closes it, sends `shutdown`, cancels
// it or goes away: a peer process that dies closes its connection at once, and one that hangs or
// whose host vanishes is found by keepalive pings within kKeepalive x 2, after which a restarted
// coordinator's stream is accepted.
//
// Threads. gRPC's synchronous server runs each RPC on its own thread. Plans of every Steps
// stream go to ONE executor thread, which runs them in arrival order (the scheduler's KV-block
// safety relies on it) and writes each result to the stream its plan came from. A stream's
// handler returns once the client has closed its side (or sent `shutdown`) and every plan it
// sent has been answered. Plans that arrive before the stage is loaded are answered with an
// error.
//
// Lifecycle: Start (binds; not ready) -> SetStage (ready) or SetError -> Shutdown (answers
// queued plans with an error, wakes a runner waiting for streams, closes every stream within
// `grace`). Start / SetStage / SetError / Shutdown from the controlling thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster_defaults.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/stage_link.h"
#include "gpu_worker/stage_runner.h"
#include "gpu_worker/stage_transfer.h"
#include "proto/cluster_credential.h"

namespace ss::gpu {

// Everything a loaded stage owns; the runner borrows the rest.
struct LoadedStage {
  // Whatever the backend borrows and must outlive it (the TP group's NcclComm): declared first,
  // destroyed last.
  std::shared_ptr<void> borrowed;
  // The nccl stage transport's links (stage_link.h; null under gRPC, and at the first / last
  // stage).
  std::unique_ptr<StageLink> link_in, link_out;
  // The routing counts the backend's expert client adds to (shared with the metrics' scrape).
  std::shared_ptr<ExpertHeat> heat;
  std::unique_ptr<StageBackend> backend;
  std::unique_ptr<StreamSender> sender;    // non-last stage
  std::unique_ptr<WorkerMetrics> metrics;  // optional
  std::unique_ptr<StageRunner> runner;
  int kv_block_tokens = kDefaultKvBlockTokens;
};

class GpuWorkerServer {
 public:
  static constexpr absl::Duration kStepsHandover = absl::Seconds(2);
  static constexpr absl::Duration kKeepalive = absl::Seconds(10);

  // Serves on `listen` ("host:port", port 0 = any free port), accepting calls that carry
  // `credential`. Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<GpuWorkerServer>> Start(const std::string& listen,
                                                                std::string worker_id,
                                                                ClusterCredential credential);
  ~GpuWorkerServer();  // Shutdown()s
  GpuWorkerServer(const GpuWorkerServer&) = delete;
  GpuWorkerServer& operator=(const GpuWorkerServer&) = delete;

  int port() const;
  StreamInbox& inbox();
  void SetWorkerId(std::string worker_id);
  // From now on Status reports ready and plans run on `stage`.
  void SetStage(LoadedStage stage);
  // Start-up failed: Status reports `error` (the worker stays up to report it).
  void SetError(std::string error);
  void Shutdown(absl::Duration grace = absl::Seconds(2));

  class Impl;

 private:
  explicit GpuWorkerServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ss::gpu
