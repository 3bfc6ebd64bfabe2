// The GPU worker's step progress: a process-wide count of work done inside steps, which the
// heartbeat carries to the coordinator (proto/cluster.proto HeartbeatRequest.progress) so that
// it can tell a long micro-batch that is being worked on from a hung one (cluster_engine.h
// "Stalls").
//
// The count rises at every step's start and end (StageRunner), after every layer of the cpu
// backend, and after every expert call answered (RoutedExpertsClient, one per chunk of a layer's
// rows; HostRoutedExperts for experts computed on the host). A step therefore shows progress at
// least once per layer whose routed experts run on the host or in an expert worker, and at its
// start and end otherwise. Waiting (for the previous stage's streams, an expert worker's answer, a
// collective) is not progress. Only changes of the value carry meaning; it never decreases.
//
// Process-wide rather than owned: it is the process's liveness signal, like the heartbeat that
// carries it, and the points that advance it (backends, the expert client) are built without
// knowing the worker. Threads: any; relaxed atomics.
#pragma once

#include <atomic>
#include <cstdint>

namespace ss::gpu {

namespace step_progress_internal {
inline std::atomic<uint64_t> count{0};
}  // namespace step_progress_internal

// Records one unit of work done.
inline void NoteStepProgress() {
  step_progress_internal::count.fetch_add(1, std::memory_order_relaxed);
}

// The count so far.
inline uint64_t StepProgress() {
  return step_progress_internal::count.load(std::memory_order_relaxed);
}

}  // namespace ss::gpu
