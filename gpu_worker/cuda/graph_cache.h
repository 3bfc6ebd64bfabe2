// The step's layers as one CUDA graph (StepGraphCache): the launches RunLayers enqueues (the
// routed experts' host calls as host nodes on the side stream, the TP collectives as NCCL's
// captured kernels, the timing marks as event nodes) captured once per step shape and replayed.
//
// The key (GraphKeyOf) is everything the captured launches take from the host, in this order:
//   T, the number of chunks, the longest chunk's rows, the attention's rows per launch, whether
//   the routed experts run, whether the step records its timing marks, whether the indexer runs
//   in one launch (a decode step), its columns and selections then, the tables' room;
//   per chunk: its rows, and where the indexer runs chunk by chunk its selections, its score
//   columns and the end of its table;
//   per layer: the longest candidate list;
//   the addresses of the scratch arena, the upload, the candidate lists, the decoded rows, the
//   indexer's scores and selections, the KV pool, then the routed-experts provider's buffers
//   (RoutedExpertsProvider::AppendGraphKey).
// A decode step's sizes are rounded up (StepPlan, kDecodeSizeStep), so a sequence's decode
// replays one graph over many positions: at one sequence (Flash's sizes) a new key every 256
// positions below 2,048 (the indexer's k, the candidate lists), then every 1,024 (the score
// columns) and every 64 blocks of its table.
// The step's inputs (streams, ids, positions, compressor arrays, KvTokens, tables, entry
// addresses) are uploaded into the same buffers every step, before the graph runs, so they are
// not part of the key.
//
// The cache keeps kSlots graphs, one a slot; the caller picks a step's slot (the backend: whether
// the step records its timing marks, so steps timed now and then replay a graph of their own
// instead of displacing the untimed steps'). Rules (Run), per step, within its slot:
//   * the key equals the slot's instantiated graph's key: the graph is launched (a replay);
//   * else the key equals the slot's previous key (its pending key): the layers are captured
//     (thread-local capture mode), the slot's instantiated graph updated in place where only
//     parameters changed (cudaGraphExecUpdate), else instantiated anew with node priorities
//     (cudaGraphInstantiateFlagUseNodePriority), then launched. The instantiated key is cleared
//     before the capture, so a failed capture leaves no key to replay;
//   * else the layers are launched one by one and the key becomes the slot's pending key: a shape
//     is captured on its second sight only.
// set_enabled(false) launches every step one by one (the same kernels, the same bits);
// set_enabled clears the pending keys either way.
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

  static constexpr int kSlots = 2;

  bool enabled() const { return enabled_; }
  void set_enabled(bool on) {
    enabled_ = on;
    for (Slot& s : slots_) s.pending_key.clear();
  }
  // Graphs captured (instantiated, or updated in place), and graph launches, since creation.
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

  // The step's layers under the rules above, in slot `slot` (0 <= slot < kSlots): `layers`
  // enqueues them on `stream` (with `*capturing` true while it runs under capture). Returns
  // whether `layers` ran (false: the instantiated graph was launched without it). An error leaves
  // the stream's work to the caller's clean-up.
  absl::StatusOr<bool> Run(std::vector<int64_t> key, int slot, cudaStream_t stream, bool* capturing,
                           absl::FunctionRef<absl::Status()> layers);
  // Destroys the instantiated graphs.
  void Reset();

 private:
  struct Slot {
    cudaGraphExec_t exec = nullptr;
    std::vector<int64_t> key, pending_key;
  };
  bool enabled_ = true;
  Slot slots_[kSlots];
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace ss::gpu::cuda_backend_internal
