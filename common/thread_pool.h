// A fork-join thread pool. The expert worker runs one per NUMA node, a thread per physical core,
// pinned (ARCHITECTURE.md "Processes"); the reference model runs a step's row groups on one
// (common/model/model.h), unpinned.
//
// Shape. A pool of size N is the CALLING thread (worker 0) plus N-1 threads it owns (workers
// 1..N-1). `ParallelFor(n, fn)` runs fn(i, worker) for every i in [0, n) exactly once, spread
// over all N workers (the caller works too, so no core idles while it waits), and returns when
// every call has finished: a barrier. Indices are handed out dynamically (an atomic counter,
// in small grains), so WHICH worker runs an index depends on timing: callers that need
// deterministic results write each index's result to its own place (the expert engine does).
// `worker` identifies the thread running the call (0..N-1), for per-worker scratch.
//
// Pinning. Options::cpus gives each worker an OS CPU (from NumaNode::core_cpus: one per physical
// core, never two hyperthreads of one core); owned threads pin themselves at start, and the
// thread that will call ParallelFor pins itself with PinCallingThread(). A refused pin (a
// container's cpuset, a CPU outside the allowed set) logs one warning per process and the
// thread runs unpinned: the pool works the same, only placement is lost.
//
// Waiting. An idle worker polls for Options::spin_us after its last job (2 us with a pause
// instruction, then yielding the core between polls, so an oversubscribed or busy machine does
// not starve the thread it waits for), then sleeps on a futex; a new job wakes sleepers with one
// futex wake (no syscall when all are spinning). The caller waits for the others the same way.
// Back-to-back calls (one MoE layer after another) therefore cost a cache-line handoff, calls after
// a long idle one futex wake-up; bench/thread_pool_bench.cc measures both.
//
// Order. Indices are handed out in increasing order (an atomic counter, grains of consecutive
// indices) and a worker runs its grain in order, so when index i starts, every index below i has
// been taken by a worker that is running it, will run it before anything else, or has finished
// it. A task may therefore wait for a LOWER index of the same job to finish (WaitInTask), never
// for a higher one.
//
// Threads and order. ParallelFor may be called from any thread, and from several: calls are
// serialised (one job at a time). Calling ParallelFor (or RunOnEachWorker) of a pool from inside
// one of that same pool's tasks would deadlock; it is detected and returns FailedPrecondition
// without running anything. `fn` must not throw. The destructor joins the owned threads; it must
// not run while a ParallelFor is in progress.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ss {

struct ThreadPoolOptions {
  int num_threads = 1;  // N >= 1, the caller included
  // Empty: no pinning. Otherwise N OS CPU ids: cpus[0] for the caller (PinCallingThread),
  // cpus[i] for owned worker i; -1 leaves that worker unpinned.
  std::vector<int> cpus;
  int spin_us = 200;               // how long an idle worker spins before it sleeps; >= 0
  std::string name = "ss-expert";  // owned threads are named "<name>-<i>" (truncated to 15)
};

class ThreadPool {
 public:
  // Starts N-1 threads and waits until each has tried to pin itself. InvalidArgument for
  // num_threads < 1, a cpus list of the wrong length, a negative spin_us.
  static absl::StatusOr<std::unique_ptr<ThreadPool>> Create(const ThreadPoolOptions& options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // fn(i, worker) for i in [0, n), each exactly once; returns after all have returned. n <= 0
  // is a no-op. FailedPrecondition when called from inside a task of this pool.
  absl::Status ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int)> fn);
  // The same, and on_drained() exactly once as soon as every index has been handed out: on the
  // first worker that finds none left (others may still be running theirs: the job's tail), or,
  // when the job runs on one thread, just before its last index. For a caller that acts just
  // before the job ends (the expert engine's early wake of its client). n <= 0: on_drained only.
  absl::Status ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int)> fn,
                           absl::FunctionRef<void()> on_drained);

  // The same with fn(i, next, worker): `next` is the index this worker runs right after i, or
  // -1 when that is not decided yet, for a task that prefetches the next one's data. A worker
  // runs its grain in order, and while much of the job is left it takes its next grain as it
  // starts the last index of the current one (so `next` is known there too); near the end it
  // takes grains only when free, which keeps the tail balanced (plain ParallelFor jobs always
  // do). "Order" at the top of this file still holds: a grain taken ahead is the next thing
  // its worker runs.
  absl::Status ParallelForAhead(int64_t n, absl::FunctionRef<void(int64_t, int64_t, int)> fn,
                                absl::FunctionRef<void()> on_drained);

  // fn(worker) once on every worker, the caller included (worker 0): for per-thread setup such
  // as first-touching a worker's own scratch. Same rules as ParallelFor.
  absl::Status RunOnEachWorker(absl::FunctionRef<void(int)> fn);

  // Inside a task: returns once ready() holds, polling it with a pause instruction for 2 us and
  // then yielding the core between polls; it never sleeps and has no timeout. Only for a
  // condition another task of the same job makes true, and only one whose index is lower than
  // the waiting task's (see "Order" above): anything else may wait forever.
  static void WaitInTask(absl::FunctionRef<bool()> ready);

  // Pins the calling thread to cpus[0] (no-op returning true without cpus or with cpus[0] < 0).
  // Returns false (after the process's one warning) when the kernel refuses.
  bool PinCallingThread() const;

  // How many pins the kernel refused in this process (the first one is logged as a warning).
  static int64_t pin_refusals();

  // Whether every owned worker that was given a CPU is pinned to it.
  bool workers_pinned() const { return unpinned_workers_.load() == 0; }
  const std::vector<int>& cpus() const { return cpus_; }

 private:
  explicit ThreadPool(const ThreadPoolOptions& options);
  // Every ParallelFor; on_drained may be null; `ahead`: grains are taken ahead (only
  // ParallelForAhead: a plain job takes a grain only when a worker is free).
  absl::Status For(int64_t n, absl::FunctionRef<void(int64_t, int64_t, int)> fn,
                   absl::FunctionRef<void()>* on_drained, bool ahead);
  absl::Status Run(int64_t n, bool each_worker);
  void WorkerLoop(int worker);
  void RunShare(int worker);
  void WaitForOthers();

  const int size_;
  const std::vector<int> cpus_;
  const int spin_us_;
  const std::string name_;
  std::vector<std::thread> threads_;
  std::atomic<int> unpinned_workers_{0};
  std::mutex call_mu_;  // serialises callers; held for a whole job

  // The current job, written by the caller before `generation_` is bumped. No ABSL_GUARDED_BY:
  // the workers read it without call_mu_, after an acquire load of the bumped generation_.
  int64_t job_n_ = 0;
  bool job_each_ = false;  // RunOnEachWorker: index space = workers
  int64_t job_grain_ = 1;
  bool job_ahead_ = false;
  absl::FunctionRef<void(int64_t, int64_t, int)>* job_fn_ = nullptr;
  absl::FunctionRef<void(int)>* job_each_fn_ = nullptr;
  absl::FunctionRef<void()>* job_drained_ = nullptr;  // null: none
  std::atomic<bool> drained_called_{false};

  // Futex words (32-bit). Workers wait for generation_ to change; the caller waits for
  // remaining_ (owned workers still inside the job) to reach 0.
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int64_t> next_{0};
  alignas(64) std::atomic<uint32_t> remaining_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<int> caller_sleeping_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace ss
