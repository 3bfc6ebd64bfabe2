#include "cpu_expert_worker/expert_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/int_math.h"
#include "common/model/moe.h"
#include "common/status.h"

namespace ss::expert {
namespace {

constexpr size_t kAlign = 64;

size_t AlignUp(size_t v) { return RoundUp(v, kAlign); }

// The down units' column bounds: kDownRows each (threads = 0), or guided for `threads` threads:
// each range about 1/threads of the columns left, a multiple of 16 in [kMinDownRows,
// kMaxDownRows] (the last one may be narrower).
std::vector<int64_t> DownBounds(int64_t dim, int threads) {
  std::vector<int64_t> b{0};
  while (b.back() < dim) {
    const int64_t left = dim - b.back();
    int64_t w = ExpertEngine::kDownRows;
    if (threads > 0) {
      w = std::clamp(RoundUp(CeilDiv(left, int64_t{threads}), int64_t{16}),
                     ExpertEngine::kMinDownRows, ExpertEngine::kMaxDownRows);
    }
    b.push_back(b.back() + std::min(w, left));
  }
  return b;
}

}  // namespace

ExpertEngine::ExpertEngine(const ExpertStore& store, ThreadPool& pool,
                           const ExpertEngineOptions& options, const ExpertKernel* kernel)
    : store_(store), pool_(pool), options_(options), kernel_(kernel) {}

absl::StatusOr<std::unique_ptr<ExpertEngine>> ExpertEngine::Create(
    const ExpertStore& store, ThreadPool& pool, const ExpertEngineOptions& options) {
  ASSIGN_OR_RETURN(const ExpertKernel* kernel, KernelFor(options.isa));
  ExpertEngineOptions o = options;
  if (o.max_top_k == 0) o.max_top_k = store.config().n_activated_experts;
  if (o.max_tokens < 1 || o.max_top_k < 1 || o.split_target < 1 || o.max_splits < 0 ||
      o.min_split_cols < kActBlock || o.min_split_cols % kActBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert engine: max_tokens ", o.max_tokens, ", max_top_k ", o.max_top_k, ", split_target ",
        o.split_target, ", min_split_cols ", o.min_split_cols, ", max_splits ", o.max_splits,
        ": sizes must be >= 1 (max_splits >= 0; min_split_cols a multiple of 128)"));
  }
  if (o.passes != 1 && o.passes != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert engine: passes ", o.passes, ": expected 1 or 2"));
  }
  const int64_t max_entries = o.max_tokens * o.max_top_k;
  if (max_entries > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert engine: max_tokens x max_top_k = ", max_entries, " is too large"));
  }
  if (store.tile_rows() != 0 && kernel->tile_rows != 0 &&
      store.tile_rows() % kernel->tile_rows != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert engine: the store holds weights in tiles of ", store.tile_rows(), " rows; the ",
        kernel->name, " kernel reads tiles of ", kernel->tile_rows, " (load the store for it)"));
  }
  if (store.dim() % kDownRows != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert engine: dim ", store.dim(), " is not a multiple of ", kDownRows));
  }
  std::unique_ptr<ExpertEngine> e(new ExpertEngine(store, pool, o, kernel));
  const int64_t dim = store.dim(), E = store.num_experts(), I = store.inter_slice();
  const int node = o.topology != nullptr ? o.numa_node : -1;

  const size_t xq_bytes = AlignUp(o.max_tokens * dim * sizeof(float));
  const size_t xs_bytes = AlignUp(o.max_tokens * (dim / kActBlock) * sizeof(float));
  const size_t hq_bytes = AlignUp(max_entries * I * sizeof(float));
  const size_t hs_bytes = AlignUp(max_entries * (I / kActBlock) * sizeof(float));
  ASSIGN_OR_RETURN(e->act_,
                   AllocateNodeMemory(o.topology, xq_bytes + xs_bytes + hq_bytes + hs_bytes, node));
  uint8_t* act = e->act_.data();
  e->xq_ = reinterpret_cast<float*>(act);
  e->xs_ = reinterpret_cast<float*>(act + xq_bytes);
  e->hq_ = reinterpret_cast<float*>(act + xq_bytes + xs_bytes);
  e->hs_ = reinterpret_cast<float*>(act + xq_bytes + xs_bytes + hq_bytes);
  if (reinterpret_cast<uintptr_t>(e->xq_) % kAlign != 0) {
    return absl::InternalError("expert engine: activation buffer is not 64-byte aligned");
  }
  e->expert_count_.resize(E);
  e->expert_offset_.resize(E + 1);
  e->expert_cursor_.resize(E);
  e->entry_token_.resize(max_entries);
  e->entry_weight_.resize(max_entries);
  e->hq_rows_.resize(max_entries);
  e->hs_rows_.resize(max_entries);
  e->out_rows_.resize(max_entries);
  e->groups_.resize(E);
  e->group_offsets_.resize(E + 1);
  e->units_.resize(o.split_target + max_entries);
  e->group_units_.resize(E);
  e->group_done_ = std::make_unique<std::atomic<int32_t>[]>(E);
  e->down_bounds_ = DownBounds(dim, o.passes == 1 ? pool.size() : 0);

  // Per-worker scratch, allocated and first touched by its own worker.
  const size_t ws_bytes = ExpertUnitWorkspaceBytes(dim, I);
  const size_t x_bytes = AlignUp(2 * kMaxUnitRows * sizeof(const float*));
  e->scratch_.resize(pool.size());
  std::vector<absl::Status> alloc(pool.size());
  RETURN_IF_ERROR(pool.RunOnEachWorker([&](int w) {
    WorkerScratch& s = e->scratch_[w];
    auto mem = AllocateNodeMemory(o.topology, AlignUp(ws_bytes) + x_bytes, node);
    if (!mem.ok()) {
      alloc[w] = mem.status();
      return;
    }
    s.memory = std::move(*mem);
    std::memset(s.memory.data(), 0, s.memory.size());  // first touch on this worker's core
    uint8_t* p = s.memory.data();
    s.workspace = p;
    s.workspace_bytes = ws_bytes;
    s.xq_rows = reinterpret_cast<const float**>(p + AlignUp(ws_bytes));
    s.xs_rows = s.xq_rows + kMaxUnitRows;
  }));
  for (const absl::Status& st : alloc) RETURN_IF_ERROR(st);
  // First touch of the activation rows, spread over the node's threads.
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t act_bytes = static_cast<int64_t>(e->act_.size());
  RETURN_IF_ERROR(pool.ParallelFor(CeilDiv(act_bytes, kChunk), [&](int64_t i, int) {
    std::memset(act + i * kChunk, 0, std::min(kChunk, act_bytes - i * kChunk));
  }));
  return e;
}

absl::Status ExpertEngine::Validate(int layer, int64_t T, const uint16_t* x, const int32_t* ids,
                                    const float* weights, int top_k, const float* out) const {
  if (store_.layer_views(layer) == nullptr) {
    return absl::NotFoundError(absl::StrCat("layer ", layer, " is not held by this worker"));
  }
  if (T < 0) return absl::InvalidArgumentError(absl::StrCat("T = ", T, " < 0"));
  if (T > options_.max_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "T = ", T, " tokens exceeds this worker's preallocated max_tokens ", options_.max_tokens,
        " (split the batch or restart the worker with a larger --max_tokens)"));
  }
  if (top_k < 1 || top_k > options_.max_top_k) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k = ", top_k, " is outside [1, ", options_.max_top_k, "]"));
  }
  if (T == 0) return absl::OkStatus();
  if (x == nullptr || ids == nullptr || weights == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("null pointer among x, ids, weights, out");
  }
  const int64_t E = store_.num_experts(), dim = store_.dim();
  for (int64_t i = 0; i < T * top_k; ++i) {
    if (ids[i] == model::kSkippedExpert) continue;
    if (ids[i] < 0 || ids[i] >= E) {
      return absl::InvalidArgumentError(absl::StrCat("expert id ", ids[i], " (token ", i / top_k,
                                                     ", choice ", i % top_k, ") is outside [0, ", E,
                                                     ")"));
    }
    if (!std::isfinite(weights[i])) {
      return absl::InvalidArgumentError(absl::StrCat("routing weight ", weights[i], " (token ",
                                                     i / top_k, ", choice ", i % top_k,
                                                     ") is not finite"));
    }
  }
  for (int64_t i = 0; i < T * dim; ++i) {
    if ((x[i] & 0x7f80) == 0x7f80) {
      return absl::InvalidArgumentError(
          absl::StrCat("x[", i / dim, ", ", i % dim, "] is not finite (bf16 bits ", x[i], ")"));
    }
  }
  return absl::OkStatus();
}

void ExpertEngine::Plan(int64_t T, const int32_t* ids, const float* weights, int top_k,
                        const ExpertSliceView* views, float* out) {
  const int64_t E = store_.num_experts(), entries = T * top_k, dim = store_.dim();
  const int64_t I = store_.inter_slice(), C = I / kActBlock;  // 128-column chunks
  const int64_t max_s = std::max<int64_t>(1, I / options_.min_split_cols);
  std::fill(expert_count_.begin(), expert_count_.end(), 0);
  for (int64_t i = 0; i < entries; ++i) {
    if (ids[i] != model::kSkippedExpert) ++expert_count_[ids[i]];
  }
  int64_t P = 0, groups = 0;
  expert_offset_[0] = 0;
  group_offsets_[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    expert_offset_[e + 1] = expert_offset_[e] + expert_count_[e];
    P += CeilDiv(expert_count_[e], kMaxUnitRows);
    if (expert_count_[e] > 0) {
      groups_[groups] = &views[e];
      group_offsets_[++groups] = expert_offset_[e + 1];
    }
  }
  std::copy(expert_offset_.begin(), expert_offset_.end() - 1, expert_cursor_.begin());
  for (int64_t i = 0; i < entries; ++i) {  // token-major within an expert
    if (ids[i] == model::kSkippedExpert) continue;
    const int32_t pos = expert_cursor_[ids[i]]++;
    const int64_t t = i / top_k;
    entry_token_[pos] = static_cast<int32_t>(t);
    entry_weight_[pos] = weights[i];
    hq_rows_[pos] = hq_ + pos * I;
    hs_rows_[pos] = hs_ + pos * (I / kActBlock);
    out_rows_[pos] = out + t * dim;
  }
  num_groups_ = groups;

  int64_t s = P > 0 ? std::min(max_s, CeilDiv(options_.split_target, P)) : 1;  // P 0: all skipped
  if (options_.max_splits > 0) s = std::min(s, options_.max_splits);
  s = std::max<int64_t>(s, 1);
  // Sub-range j of s covers the 128-column chunks [j·C/s, (j+1)·C/s) (at least min_split_cols).
  int64_t n = 0;
  for (int64_t e = 0, g = 0; e < E; ++e) {
    if (expert_count_[e] == 0) continue;
    const int64_t first = n;
    for (int64_t b = 0; b < expert_count_[e]; b += kMaxUnitRows) {
      const int32_t rows = static_cast<int32_t>(std::min(kMaxUnitRows, expert_count_[e] - b));
      for (int64_t j = 0; j < s; ++j) {
        units_[n++] = Unit{static_cast<int32_t>(e),
                           static_cast<int32_t>(expert_offset_[e] + b),
                           rows,
                           static_cast<int32_t>(j * C / s * kActBlock),
                           static_cast<int32_t>((j + 1) * C / s * kActBlock),
                           static_cast<int32_t>(g)};
      }
    }
    group_units_[g] = static_cast<int32_t>(n - first);
    group_done_[g].store(0, std::memory_order_relaxed);
    ++g;
  }
  num_units_ = n;
  last_units_ = n;
  last_splits_ = s;
  last_down_units_ = DownUnits();
}

NextRows ExpertEngine::HintFor(int64_t next, int64_t gate_up, bool after_gate_up,
                               const ExpertSliceView* views) const {
  if (next < 0 || (next < gate_up) != after_gate_up || num_groups_ == 0) return {};
  if (after_gate_up) {
    const Unit& u = units_[next];
    return {&views[u.expert], u.col_begin, u.col_end};
  }
  const int64_t d = next - gate_up;
  return {groups_[0], down_bounds_[d], down_bounds_[d + 1]};
}

void ExpertEngine::RunGateUp(const Unit& u, const ExpertSliceView* views, int worker,
                             NextRows next) {
  WorkerScratch& s = scratch_[worker];
  const int64_t dim = store_.dim(), nb = dim / kActBlock;
  for (int32_t i = 0; i < u.rows; ++i) {
    const int64_t t = entry_token_[u.entry_begin + i];
    s.xq_rows[i] = xq_ + t * dim;
    s.xs_rows[i] = xs_ + t * nb;
  }
  GateUpCall c;
  c.rows = u.rows;
  c.dim = dim;
  c.inter_slice = store_.inter_slice();
  c.col_begin = u.col_begin;
  c.col_end = u.col_end;
  c.expert = &views[u.expert];
  c.xq_rows = s.xq_rows;
  c.xs_rows = s.xs_rows;
  c.weights = entry_weight_.data() + u.entry_begin;
  c.swiglu_limit = static_cast<float>(store_.config().swiglu_limit);
  c.hq_rows = hq_rows_.data() + u.entry_begin;
  c.hs_rows = hs_rows_.data() + u.entry_begin;
  c.next = next;
  const absl::Status st = kernel_->gate_up(c, s.workspace, s.workspace_bytes);
  if (!st.ok() && s.status.ok()) s.status = st;
}

void ExpertEngine::ZeroColumns(int64_t d, int64_t T, float* out) const {
  const int64_t dim = store_.dim();
  for (int64_t t = 0; t < T; ++t) {
    std::fill(out + t * dim + down_bounds_[d], out + t * dim + down_bounds_[d + 1], 0.0f);
  }
}

void ExpertEngine::RunDown(int64_t d, int64_t g0, int64_t g1, int worker, NextRows next) {
  WorkerScratch& s = scratch_[worker];
  DownCall c;
  c.dim = store_.dim();
  c.inter_slice = store_.inter_slice();
  c.col_begin = down_bounds_[d];
  c.col_end = down_bounds_[d + 1];
  c.num_groups = g1 - g0;
  c.experts = groups_.data() + g0;
  c.group_offsets = group_offsets_.data() + g0;  // absolute entry indices
  c.hq_rows = hq_rows_.data();
  c.hs_rows = hs_rows_.data();
  c.out_rows = out_rows_.data();
  // A worker holding whole experts (one slice) returns the reference's routed sum exactly: each
  // expert's output rounded to bf16, summed in ascending expert id (model::RoutedSum).
  c.round_expert_outputs = store_.slice_count() == 1;
  if (g1 == num_groups_) c.next = next;
  const absl::Status st = kernel_->down(c, s.workspace, s.workspace_bytes);
  if (!st.ok() && s.status.ok()) s.status = st;
}

// Adds the groups in order, each once its gate_up units are done: the longest run of ready
// groups per kernel call.
void ExpertEngine::RunDownWhenReady(int64_t d, int64_t T, float* out, int worker, NextRows next) {
  ZeroColumns(d, T, out);
  const auto ready = [this](int64_t g) {
    return group_done_[g].load(std::memory_order_acquire) == group_units_[g];
  };
  for (int64_t g0 = 0; g0 < num_groups_;) {
    ThreadPool::WaitInTask([&] { return ready(g0); });
    int64_t g1 = g0 + 1;
    while (g1 < num_groups_ && ready(g1)) ++g1;
    RunDown(d, g0, g1, worker, next);
    g0 = g1;
  }
}

// The first kernel error any worker recorded in this call (clearing them all).
absl::Status ExpertEngine::FirstKernelError() {
  absl::Status first;
  for (WorkerScratch& s : scratch_) {
    if (first.ok() && !s.status.ok()) first = s.status;
    s.status = absl::OkStatus();
  }
  return first;
}

absl::Status ExpertEngine::TwoPasses(int64_t T, const ExpertSliceView* views, float* out,
                                     absl::FunctionRef<void()> on_tail) {
  RETURN_IF_ERROR(pool_.ParallelForAhead(
      num_units_,
      [&](int64_t u, int64_t next, int worker) {
        RunGateUp(units_[u], views, worker, HintFor(next, num_units_, true, views));
      },
      [] {}));
  for (const WorkerScratch& s : scratch_) {
    if (!s.status.ok()) return absl::OkStatus();  // no down pass; Compute reports the error
  }
  return pool_.ParallelForAhead(
      DownUnits(),
      [&](int64_t d, int64_t next, int worker) {
        ZeroColumns(d, T, out);
        RunDown(d, 0, num_groups_, worker, HintFor(next, 0, false, views));
      },
      on_tail);
}

absl::Status ExpertEngine::OnePass(int64_t T, const ExpertSliceView* views, float* out,
                                   absl::FunctionRef<void()> on_tail) {
  return pool_.ParallelForAhead(
      num_units_ + DownUnits(),
      [&](int64_t u, int64_t next, int worker) {
        const NextRows hint = HintFor(next, num_units_, u < num_units_, views);
        if (u >= num_units_) {
          RunDownWhenReady(u - num_units_, T, out, worker, hint);
          return;
        }
        RunGateUp(units_[u], views, worker, hint);
        group_done_[units_[u].group].fetch_add(1, std::memory_order_release);  // even on error
      },
      on_tail);
}

absl::Status ExpertEngine::Compute(int layer, int64_t T, const uint16_t* x_bf16, const int32_t* ids,
                                   const float* weights, int top_k, float* out_fp32,
                                   const std::function<void()>* on_tail) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Validate(layer, T, x_bf16, ids, weights, top_k, out_fp32));
  if (T == 0) return absl::OkStatus();
  const ExpertSliceView* views = store_.layer_views(layer);
  Plan(T, ids, weights, top_k, views, out_fp32);

  const int64_t dim = store_.dim(), nb = dim / kActBlock;
  // Quantise each token row once; every unit of this call shares it.
  RETURN_IF_ERROR(pool_.ParallelFor(T, [&](int64_t t, int) {
    kernel_->quantize_row(x_bf16 + t * dim, dim, xq_ + t * dim, xs_ + t * nb);
  }));
  const auto tail = [on_tail] {
    if (on_tail != nullptr && *on_tail) (*on_tail)();
  };
  RETURN_IF_ERROR(options_.passes == 1 ? OnePass(T, views, out_fp32, tail)
                                       : TwoPasses(T, views, out_fp32, tail));
  if (const absl::Status st = FirstKernelError(); !st.ok()) {
    // The request was validated: a kernel error here is an internal bug.
    return absl::InternalError(
        absl::StrCat("expert kernel failed on a validated request: ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace ss::expert
