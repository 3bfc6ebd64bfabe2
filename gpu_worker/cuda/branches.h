// The branch streams of a step (StepBranches): a layer's work off its critical path runs on a
// stream of its own, forked from the step's stream when its input is ready and joined back before
// its output is read; in a captured graph the branches are parallel branches of the graph.
//   kBranchKv      wkv's latent: norm, RoPE, FP8 simulation, staging, and the ring writes;
//   kBranchComp    the main compressor and its records;
//   kBranchIndex   the indexer's compressor and its keys;
//   kBranchHc      the hyper-connections' Sinkhorn (from HcPre's logits, joined before HcPost);
//   kBranchIndexQ  the indexer's query, scores and top-k;
//   kBranchIndexW  the indexer's head weights.
// The indexer's branches (a ratio-4 layer's attention waits for its top-k) have the device's
// greatest stream priority, the others its least (Create); graph nodes keep their stream's
// priority.
//
// Fork(k, from) makes branch k wait for everything enqueued on `from` so far; Done(k) marks the
// end of its work so far, which Wait(s, k) makes stream s wait for. MarkFork(k, from) and
// TakeFork(k) are Fork's two halves, for a branch that starts from an earlier point of `from`
// than the work enqueued on `from` before the branch's own. Every call enqueues only (one event
// record or wait) and returns the CUDA error. One step at a time, from the step's thread.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace ss::gpu::cuda_backend_internal {

enum BranchId : int {
  kBranchKv = 0,
  kBranchComp = 1,
  kBranchIndex = 2,
  kBranchHc = 3,
  kBranchIndexQ = 4,
  kBranchIndexW = 5,
  kBranches = 6,
};

class StepBranches {
 public:
  StepBranches() = default;
  StepBranches(const StepBranches&) = delete;
  StepBranches& operator=(const StepBranches&) = delete;
  ~StepBranches();

  // Creates the streams (non-blocking; priority `greatest` for the indexer's branches, `least`
  // for the others) and their fork and join events, on the current device.
  absl::Status Create(int least, int greatest);

  cudaStream_t stream(int k) const { return branch_[k]; }
  cudaError_t MarkFork(int k, cudaStream_t from) { return cudaEventRecord(fork_[k], from); }
  cudaError_t TakeFork(int k) { return cudaStreamWaitEvent(branch_[k], fork_[k], 0); }
  cudaError_t Fork(int k, cudaStream_t from) {
    const cudaError_t e = MarkFork(k, from);
    return e == cudaSuccess ? TakeFork(k) : e;
  }
  cudaError_t Done(int k) { return cudaEventRecord(joined_[k], branch_[k]); }
  cudaError_t Wait(cudaStream_t s, int k) { return cudaStreamWaitEvent(s, joined_[k], 0); }
  // Waits for every branch stream (a failed step's clean-up; errors ignored).
  void SynchronizeAll();

 private:
  cudaStream_t branch_[kBranches] = {};
  cudaEvent_t fork_[kBranches] = {}, joined_[kBranches] = {};
};

}  // namespace ss::gpu::cuda_backend_internal
