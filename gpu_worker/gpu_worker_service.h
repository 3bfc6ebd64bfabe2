// The GpuWorker gRPC service (proto/cluster.proto) of splitserve-gpu-worker:
//   Status       protocol version, ready (the stage loaded), its start-up error, KV blocks and
//                weight / KV bytes
//   Steps        the coordinator's persistent stream of step plans; every plan is answered by
//                exactly one StepResult, in the order received
//   PushStreams  the previous stage's output streams (from its worker of this TP rank), held in
//                the StreamInbox
// Every request's protocol_version is checked: Status and PushStreams refuse another version
// with FAILED_PRECONDITION naming both; a step plan of another version is answered with an
// error result (the stream stays open).
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

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/stage_link.h"
#include "gpu_worker/stage_runner.h"
#include "gpu_worker/stage_transfer.h"

namespace ss::gpu {

// Everything a loaded stage owns; the runner borrows the rest.
struct LoadedStage {
  // Whatever the backend borrows and must outlive it (the TP group's NcclComm): declared first,
  // destroyed last.
  std::shared_ptr<void> borrowed;
  // The nccl stage transport's links (stage_link.h; null under gRPC, and at the first / last
  // stage).
  std::unique_ptr<StageLink> link_in, link_out;
  std::unique_ptr<StageBackend> backend;
  std::unique_ptr<StreamSender> sender;    // non-last stage
  std::unique_ptr<WorkerMetrics> metrics;  // optional
  std::unique_ptr<StageRunner> runner;
  int kv_block_tokens = 128;
};

class GpuWorkerServer {
 public:
  // Serves on `listen` ("host:port", port 0 = any free port). Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<GpuWorkerServer>> Start(const std::string& listen,
                                                                std::string worker_id);
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
