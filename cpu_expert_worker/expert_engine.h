// The expert engine: the in-process compute API behind the worker's transports (issue 3). One
// call = one MoE layer for T tokens: their hidden rows, top-k expert ids and routing weights in,
// this worker's fp32 partial of the routed sum out (ARCHITECTURE.md "The MoE call"; the kernel
// semantics are in kernels/expert_kernels.h).
//
// How a call is split over the pool (the choice, and why). The kernels take one expert's slice
// and any 128-multiple sub-range of its intermediate dimension, so the work of a call is cut
// into UNITS, each one kernel call:
//   (expert e, a batch of <= 64 of the (token, choice) rows routed to e, an I-sub-range j of s)
// in canonical order: experts ascending, row batches in token-major order, sub-ranges
// ascending. Each unit writes its own partial rows [rows, dim] (no sharing, no atomics); a
// second parallel pass sums, for every token and block of output columns, that token's partial
// rows in the canonical order into `out`. Splitting by I is what keeps decode busy (T = 1, top-6
// is only 6 experts: 6·s units); batching rows by expert is what keeps prefill busy with skewed
// routing; the number of sub-ranges falls as T grows, so large batches do not multiply partial
// memory:
//   P = Σ_e ceil(rows_e / 64),  C = inter_slice / min_split_cols,
//   s = max(1, min(C, ceil(split_target / P), partial_rows_capacity / (T·top_k), max_splits)).
// Each token row is quantised to e4m3 ONCE per call (ExpertKernel::quantize_row, in parallel
// over tokens) and every unit's kernel call reads those shared rows (ExpertCall::xq_rows), so
// narrow units no longer pay a per-unit re-quantisation of x (before: ~35 us per 4096-wide
// row and unit with the scalar quantiser; bench/RESULTS.md). The result is bit-identical to
// each unit quantising its own rows.
// The units, their order and s depend only on the request and the options — never on the
// thread count or on timing — so a call's output is bit-identical on 1 or N threads and from
// run to run. With s = 1 (e.g. max_splits = 1) it is bit-identical to one kernel call over the
// whole slice; with s > 1 it differs from that only in fp32 summation order of w2's partials.
// Limitation: the 128-column granularity bounds decode parallelism at 6·C units (96 for Flash
// at n = 1, 48 at n = 2); a larger pool leaves cores idle at T = 1.
//
// Memory. Everything a call touches is allocated in Create (per-worker kernel workspaces and
// gather buffers first-touched by their own worker, the partial rows, the plan arrays), on the
// store's NUMA node when a topology is given; Compute never allocates.
//
// Threads: Compute may be called from any thread; calls are serialised (one at a time, they
// use the whole pool). Not from inside a task of the same pool. The engine borrows the store
// and the pool, which must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cpu_expert_worker/expert_store.h"
#include "cpu_expert_worker/kernels/dispatch.h"
#include "cpu_expert_worker/numa.h"
#include "cpu_expert_worker/thread_pool.h"

namespace ss::expert {

struct ExpertEngineOptions {
  Isa isa = Isa::kScalar;        // set from ParseIsa(--isa) ("auto" = DetectIsa())
  int64_t max_tokens = 256;      // largest T a call may carry (sizes the preallocated memory)
  int64_t max_top_k = 0;         // largest top_k; 0 = the model's num_experts_per_tok
  int64_t split_target = 128;    // units a call aims for (see above); >= 1
  int64_t min_split_cols = 128;  // narrowest I-sub-range; a multiple of 128
  int64_t max_splits = 0;        // cap on s; 0 = none (1 = one kernel call per expert batch)
  // Partial rows preallocated: max(this, max_tokens · max_top_k). 0 = 1024.
  int64_t partial_rows = 0;
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
  // [0, n_routed_experts) or a non-finite weight (naming the token and choice);
  // ResourceExhausted for T > max_tokens. T = 0 is a no-op.
  absl::Status Compute(int layer, int64_t T, const uint16_t* x_bf16, const int32_t* ids,
                       const float* weights, int top_k, float* out_fp32);

  const char* isa_name() const { return kernel_->name; }
  int64_t max_tokens() const { return options_.max_tokens; }
  int64_t max_top_k() const { return options_.max_top_k; }
  // Units and sub-ranges of the last successful call (for tests and benchmarks).
  int64_t last_units() const { return last_units_; }
  int64_t last_splits() const { return last_splits_; }

 private:
  struct Unit {
    int32_t expert;
    int32_t entry_begin;  // into the expert-sorted entries
    int32_t rows;
    int32_t col_begin, col_end;  // I-sub-range within the slice, multiples of 128
    int64_t partial_row;         // first row of its partial output
  };
  struct WorkerScratch {
    NodeMemory memory;  // kernel workspace + gathered x rows + ids + weights
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    const float** xq_rows = nullptr;  // [kRowBatch] into xq_
    const float** xs_rows = nullptr;  // [kRowBatch] into xs_
    int32_t* ids = nullptr;    // [kRowBatch], all 0
    float* weights = nullptr;  // [kRowBatch]
    absl::Status status;       // first kernel error of the current call
  };

  ExpertEngine(const ExpertStore& store, ThreadPool& pool, const ExpertEngineOptions& options,
               const ExpertKernel* kernel);
  absl::Status Validate(int layer, int64_t T, const uint16_t* x, const int32_t* ids,
                        const float* weights, int top_k, const float* out) const;
  void Plan(int64_t T, const int32_t* ids, const float* weights, int top_k);
  void RunUnit(const Unit& u, const ExpertSliceView* views, int worker);

  const ExpertStore& store_;
  ThreadPool& pool_;
  ExpertEngineOptions options_;
  const ExpertKernel* kernel_;
  std::mutex mu_;  // one call at a time; guards everything below

  std::vector<WorkerScratch> scratch_;  // [pool size]
  NodeMemory partial_;                  // [partial_capacity_, dim] fp32
  NodeMemory act_;                      // the call's quantised rows: xq_ then xs_
  float* xq_ = nullptr;                 // [max_tokens, dim], the kernel's layout
  float* xs_ = nullptr;                 // [max_tokens, dim / 128]
  int64_t partial_capacity_ = 0;
  // Plan of the current call (capacities fixed in Create).
  std::vector<int32_t> expert_count_, expert_offset_, expert_cursor_;  // [E (+1)]
  std::vector<int32_t> entry_token_;  // [max_tokens · max_top_k], expert-sorted
  std::vector<float> entry_weight_;   // same
  std::vector<Unit> units_;           // size = capacity; num_units_ used
  int64_t num_units_ = 0;
  std::vector<int32_t> token_offset_, token_cursor_;  // [max_tokens + 1]
  std::vector<int64_t> contrib_;                      // partial rows per token, canonical order
  int64_t last_units_ = 0, last_splits_ = 0;
};

}  // namespace ss::expert
