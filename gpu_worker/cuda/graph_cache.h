// The step's layers as one CUDA graph (StepGraphCache): the launches RunLayers enqueues (the
// routed experts' host calls as host nodes on the side stream, the TP collectives as NCCL's
// captured kernels, the timing marks as event nodes) captured once per step shape and replayed.
//
// The key (GraphKeyOf) is everything the captured launches take from the host, in this order:
//   T, the number of chunks, the longest chunk's rows, the attention's rows per launch, whether
//   the routed experts run, whether the step is timed;
//   per chunk: its rows, its indexer selections, its score columns, the end of its table;
//   per layer: the longest candidate list;
//   the addresses of the scratch arena, the upload, the candidate lists, the decoded rows, the
//   indexer's scores and selections, the KV pool, then the routed-experts provider's buffers
//   (RoutedExpertsProvider::AppendGraphKey).
// The step's inputs (streams, ids, positions, compressor arrays, KvTokens, tables, entry
// addresses) are uploaded into the same buffers every step, before the graph runs, so they are
// not part of the key.
//
// Rules (Run), per step:
//   * the key equals the instantiated graph's key: the graph is launched (a replay);
//   * else the key equals the previous step's key (the pending key): the layers are captured
//     (thread-local capture mode), the instantiated graph updated in place where only parameters
//     changed (cudaGraphExecUpdate), else instantiated anew with node priorities
//     (cudaGraphInstantiateFlagUseNodePriority), then launched. The instantiated key is cleared
//     before the capture, so a failed capture leaves no key to replay;
//   * else the layers are launched one by one and the key becomes the pending key: a shape is
//     captured on its second sight only.
// set_enabled(false) launches every step one by one (the same kernels, the same bits);
// set_enabled clears the pending key either way.
//
// Threading: the step's thread, one step at a time. The object owns the instantiated graph.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace ss::gpu::cuda_backend_internal {

struct StepState;  // step.h

// The graph key of a step whose inputs and buffers are ready (see above).
std::vector<int64_t> GraphKeyOf(const StepState& s);

class StepGraphCache {
 public:
  StepGraphCache() = default;
  StepGraphCache(const StepGraphCache&) = delete;
  StepGraphCache& operator=(const StepGraphCache&) = delete;
  ~StepGraphCache() { Reset(); }

  bool enabled() const { return enabled_; }
  void set_enabled(bool on) {
    enabled_ = on;
    pending_key_.clear();
  }
  // Graphs captured (instantiated, or updated in place), and graph launches, since creation.
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

  // The step's layers under the rules above: `layers` enqueues them on `stream` (with
  // `*capturing` true while it runs under capture). Returns whether `layers` ran (false: the
  // instantiated graph was launched without it). An error leaves the stream's work to the
  // caller's clean-up.
  absl::StatusOr<bool> Run(std::vector<int64_t> key, cudaStream_t stream, bool* capturing,
                           absl::FunctionRef<absl::Status()> layers);
  // Destroys the instantiated graph.
  void Reset();

 private:
  bool enabled_ = true;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<int64_t> key_, pending_key_;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace ss::gpu::cuda_backend_internal
