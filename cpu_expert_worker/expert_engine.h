// The expert engine: the in-process compute API behind the worker's transports. One
// call = one MoE layer for T tokens: their hidden rows, top-k expert ids and routing weights in,
// this worker's fp32 partial of the routed sum out (ARCHITECTURE.md "The MoE call"; the kernel
// semantics are in kernels/expert_kernels.h).
//
// How a call is split over the pool (the choice, and why). A call runs the two halves of the
// kernel (kernels/expert_kernels.h, ExpertKernel::gate_up / ::down) as two parallel passes:
//  1. gate_up UNITS (expert e, a batch of <= 64 of the (token, choice) rows routed to e, an
//     I-sub-range j of s): w1/w3 rows of the sub-range, the clamped SwiGLU and the e4m3
//     quantisation of w2's input, written to this call's H rows (one per routed row, in
//     expert-sorted order). Splitting by I is what keeps decode busy (T = 1, top-6 is only 6
//     experts: 6·s units); batching rows by expert is what keeps prefill busy with skewed
//     routing:
//       P = Σ_e ceil(rows_e / 64),  C = inter_slice / min_split_cols,
//       s = max(1, min(C, ceil(split_target / P), max_splits)).
//  2. down UNITS, one per range of kDownRows output columns: w2's rows of the range for every
//     routed expert in ascending id order, each row added straight into `out` in the kernel's
//     own order. Each unit owns its columns of every token: no partial sums, no atomics, no
//     reduction pass, and w2 is read as contiguous row blocks.
// By default (ExpertEngineOptions::passes = 1) the two passes run as ONE parallel pass: the gate_up
// units come first (expert-major), then the down units, whose column ranges are guided (each about
// 1/threads of the columns still unassigned, kMaxDownRows down to kMinDownRows, so the last ones
// are narrow and the threads finish together). A down unit zeroes its columns, then adds the
// experts in ascending id order, each as soon as all of that expert's gate_up units have
// finished (ThreadPool::WaitInTask: every gate_up unit has a lower index than every down unit,
// so it is running or done). No thread waits at a barrier between the halves; the additions are
// the two-pass ones, in the same order. (passes = 2 runs them as two parallel passes with a
// barrier between and kDownRows-wide down units; bench/RESULTS.md compares the two.)
// Every output element is therefore computed and summed exactly as one kernel call over the
// whole slice computes it (ExpertKernel::run): a call's output is bit-identical to that, for any
// split, on 1 or N threads and from run to run. A worker holding whole experts (slice 0/1) rounds
// each expert's output to bf16 before adding it (round_expert_outputs), which makes its result
// the reference's routed sum bit for bit (model::RoutedSum); with n > 1 slices the partials stay
// unrounded (the caller sums them, then rounds once). Each token row is quantised to e4m3 ONCE per
// call (ExpertKernel::quantize_row, in parallel over tokens) and every unit reads those shared
// rows. Limitation: the 128-column granularity bounds the gate_up pass at 6·C units at T = 1 (96
// for Flash at n = 1, 48 at n = 2); the down units are 51 for Flash on 16 threads (dim /
// kDownRows = 64 with two passes).
//
// Memory. Everything a call touches is allocated in Create (per-worker kernel workspaces first
// touched by their own worker, the H rows, the plan arrays), on the store's NUMA node when a
// topology is given; Compute never allocates.
//
// Threads: Compute may be called from any thread; calls are serialised (one at a time, they
// use the whole pool). Not from inside a task of the same pool. The engine borrows the store
// and the pool, which must outlive it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "cpu_expert_worker/expert_store.h"
#include "cpu_expert_worker/kernels/dispatch.h"
#include "cpu_expert_worker/numa.h"

namespace ss::expert {

struct ExpertEngineOptions {
  Isa isa = Isa::kScalar;        // set from ParseIsa(--isa) ("auto" = DetectIsa())
  int64_t max_tokens = 256;      // largest T a call may carry (sizes the preallocated memory)
  int64_t max_top_k = 0;         // largest top_k; 0 = the model's num_experts_per_tok
  int64_t split_target = 128;    // units a call aims for (see above); >= 1
  int64_t min_split_cols = 128;  // narrowest I-sub-range; a multiple of 128
  int64_t max_splits = 0;        // cap on s; 0 = none (1 = one gate_up unit per expert batch)
  int passes = 1;                // 1: one pass (see above); 2: gate_up, barrier, down
  // Where the per-call memory lives; null / -1: unbound.
  const NumaTopology* topology = nullptr;
  int numa_node = -1;
};

class ExpertEngine {
 public:
  // Picks the kernel (FailedPrecondition if the CPU lacks options.isa) and preallocates.
  // InvalidArgument for non-positive sizes.
  static absl::StatusOr<std::unique_ptr<ExpertEngine>> Create(const ExpertStore& store,
                                                              ThreadPool& pool,
                                                              const ExpertEngineOptions& options);

  // out[T, dim] (fp32, overwritten) = this worker's partial routed-expert sum for `layer`:
  //   x [T, dim] bf16 bits, ids / weights [T, top_k] (weights with route_scale applied).
  // Every field is validated before anything runs; on error `out` is untouched and the engine
  // keeps serving. Errors: NotFound for a layer this worker does not hold; InvalidArgument for
  // T < 0, top_k outside [1, max_top_k], a null pointer, an expert id outside
  // [0, n_routed_experts) or a non-finite weight (naming the token and choice); ResourceExhausted
  // for T > max_tokens. T = 0 is a no-op. An id of model::kSkippedExpert (common/model/moe.h) is
  // a skipped choice: it adds nothing and reads no expert's weights.
  // `on_tail`, when given, is called once, from a pool thread, as soon as the call's last units
  // have been handed out (ThreadPool::ParallelFor's on_drained): the shm transport wakes its
  // client there, so that it spins for the answer instead of sleeping through the wake-up. Not
  // called when the request is refused, for T = 0, or when a kernel fails before the last pass.
  absl::Status Compute(int layer, int64_t T, const uint16_t* x_bf16, const int32_t* ids,
                       const float* weights, int top_k, float* out_fp32,
                       const std::function<void()>* on_tail = nullptr);

  const char* isa_name() const { return kernel_->name; }
  int64_t max_tokens() const { return options_.max_tokens; }
  int64_t max_top_k() const { return options_.max_top_k; }
  // gate_up units, their I-sub-ranges per batch and the down units of the last successful call
  // (for tests and benchmarks).
  int64_t last_units() const { return last_units_; }
  int64_t last_splits() const { return last_splits_; }
  int64_t last_down_units() const { return last_down_units_; }

  // Output columns per down unit with two passes; the widest and narrowest with one.
  static constexpr int64_t kDownRows = 64;
  static constexpr int64_t kMaxDownRows = 128, kMinDownRows = 32;

 private:
  struct Unit {
    int32_t expert;
    int32_t entry_begin;  // into the expert-sorted entries
    int32_t rows;
    int32_t col_begin, col_end;  // I-sub-range within the slice, multiples of 128
    int32_t group;               // index of the expert in groups_
  };
  struct WorkerScratch {
    NodeMemory memory;  // kernel workspace + the unit's x row pointers
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    const float** xq_rows = nullptr;  // [kMaxUnitRows] into xq_
    const float** xs_rows = nullptr;  // [kMaxUnitRows] into xs_
    absl::Status status;              // first kernel error of the current call
  };

  ExpertEngine(const ExpertStore& store, ThreadPool& pool, const ExpertEngineOptions& options,
               const ExpertKernel* kernel);
  absl::Status Validate(int layer, int64_t T, const uint16_t* x, const int32_t* ids,
                        const float* weights, int top_k, const float* out) const;
  void Plan(int64_t T, const int32_t* ids, const float* weights, int top_k,
            const ExpertSliceView* views, float* out);
  // `next`: the prefetch hint of the unit the worker runs next (NextRows; none across kinds).
  void RunGateUp(const Unit& u, const ExpertSliceView* views, int worker, NextRows next);
  // Down unit d: output columns [down_bounds_[d], down_bounds_[d + 1]) of every token.
  int64_t DownUnits() const { return static_cast<int64_t>(down_bounds_.size()) - 1; }
  void ZeroColumns(int64_t d, int64_t T, float* out) const;
  // Groups [g0, g1); `next` applies after the last group.
  void RunDown(int64_t d, int64_t g0, int64_t g1, int worker, NextRows next);
  void RunDownWhenReady(int64_t d, int64_t T, float* out, int worker, NextRows next);
  // The hint for a worker whose next index is `next` (-1: unknown) in a job of `gate_up` units
  // followed by down units, after an index of the given kind.
  NextRows HintFor(int64_t next, int64_t gate_up, bool after_gate_up,
                   const ExpertSliceView* views) const;
  // The units of a planned call; kernel errors are left in the workers' scratch.
  absl::Status TwoPasses(int64_t T, const ExpertSliceView* views, float* out,
                         absl::FunctionRef<void()> on_tail);
  absl::Status OnePass(int64_t T, const ExpertSliceView* views, float* out,
                       absl::FunctionRef<void()> on_tail);
  absl::Status FirstKernelError();  // and clears them

  const ExpertStore& store_;
  ThreadPool& pool_;
  ExpertEngineOptions options_;
  const ExpertKernel* kernel_;
  // One call at a time; guards everything below. No ABSL_GUARDED_BY: inside a call the pool's
  // workers use these members for the caller, who holds mu_ (a hand-off clang cannot see).
  std::mutex mu_;

  std::vector<WorkerScratch> scratch_;  // [pool size]
  NodeMemory act_;                      // the call's quantised rows: xq_, xs_, hq_, hs_
  float* xq_ = nullptr;                 // [max_tokens, dim], the kernel's layout
  float* xs_ = nullptr;                 // [max_tokens, dim / 128]
  float* hq_ = nullptr;                 // [max_entries, inter_slice]: w2 inputs, expert-sorted
  float* hs_ = nullptr;                 // [max_entries, inter_slice / 128]
  // Plan of the current call (capacities fixed in Create).
  std::vector<int32_t> expert_count_, expert_offset_, expert_cursor_;  // [E (+1)]
  std::vector<int32_t> entry_token_;                  // [max_tokens · max_top_k], expert-sorted
  std::vector<float> entry_weight_;                   // same
  std::vector<float*> hq_rows_, hs_rows_, out_rows_;  // same: H rows and each entry's out row
  std::vector<const ExpertSliceView*> groups_;        // experts with rows, ascending
  std::vector<int32_t> group_offsets_;                // [groups + 1] into the entries
  int64_t num_groups_ = 0;
  std::vector<Unit> units_;  // size = capacity; num_units_ used
  int64_t num_units_ = 0;
  std::vector<int32_t> group_units_;                    // [E]: gate_up units of each group
  std::unique_ptr<std::atomic<int32_t>[]> group_done_;  // [E]: of those, finished (one pass)
  std::vector<int64_t> down_bounds_;                    // [down units + 1], fixed in Create
  int64_t last_units_ = 0, last_splits_ = 0, last_down_units_ = 0;
};

}  // namespace ss::expert
