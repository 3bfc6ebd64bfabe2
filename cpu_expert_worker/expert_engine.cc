#include "cpu_expert_worker/expert_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ss::expert {
namespace {

constexpr int64_t kRowBatch = 64;     // rows per unit: one weight pass of the kernel
constexpr int64_t kReduceCols = 256;  // output columns per reduction task
constexpr int64_t kDefaultPartialRows = 1024;
constexpr size_t kAlign = 64;

size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

ExpertEngine::ExpertEngine(const ExpertStore& store, ThreadPool& pool,
                           const ExpertEngineOptions& options, const ExpertKernel* kernel)
    : store_(store), pool_(pool), options_(options), kernel_(kernel) {}

absl::StatusOr<std::unique_ptr<ExpertEngine>> ExpertEngine::Create(
    const ExpertStore& store, ThreadPool& pool, const ExpertEngineOptions& options) {
  ASSIGN_OR_RETURN(const ExpertKernel* kernel, KernelFor(options.isa));
  ExpertEngineOptions o = options;
  if (o.max_top_k == 0) o.max_top_k = store.config().n_activated_experts;
  if (o.partial_rows == 0) o.partial_rows = kDefaultPartialRows;
  if (o.max_tokens < 1 || o.max_top_k < 1 || o.split_target < 1 || o.max_splits < 0 ||
      o.partial_rows < 0 || o.min_split_cols < kActBlock || o.min_split_cols % kActBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert engine: max_tokens ", o.max_tokens, ", max_top_k ", o.max_top_k, ", split_target ",
        o.split_target, ", min_split_cols ", o.min_split_cols, ", max_splits ", o.max_splits,
        ", partial_rows ", o.partial_rows,
        ": sizes must be >= 1 (max_splits, partial_rows >= 0; min_split_cols a multiple of 128)"));
  }
  const int64_t max_entries = o.max_tokens * o.max_top_k;
  if (max_entries > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert engine: max_tokens x max_top_k = ", max_entries, " is too large"));
  }
  std::unique_ptr<ExpertEngine> e(new ExpertEngine(store, pool, o, kernel));
  const int64_t dim = store.dim(), E = store.num_experts();
  const int node = o.topology != nullptr ? o.numa_node : -1;

  e->partial_capacity_ = std::max(o.partial_rows, max_entries);
  ASSIGN_OR_RETURN(e->partial_, AllocateNodeMemory(
                                    o.topology, e->partial_capacity_ * dim * sizeof(float), node));
  const size_t xq_bytes = AlignUp(o.max_tokens * dim * sizeof(float));
  ASSIGN_OR_RETURN(e->act_, AllocateNodeMemory(o.topology,
                                               xq_bytes + o.max_tokens * (dim / kActBlock) *
                                                              sizeof(float),
                                               node));
  e->xq_ = reinterpret_cast<float*>(e->act_.data());
  e->xs_ = reinterpret_cast<float*>(e->act_.data() + xq_bytes);
  if (reinterpret_cast<uintptr_t>(e->xq_) % kAlign != 0) {
    return absl::InternalError("expert engine: activation buffer is not 64-byte aligned");
  }
  e->expert_count_.resize(E);
  e->expert_offset_.resize(E + 1);
  e->expert_cursor_.resize(E);
  e->entry_token_.resize(max_entries);
  e->entry_weight_.resize(max_entries);
  e->units_.resize(o.split_target + max_entries);
  e->token_offset_.resize(o.max_tokens + 1);
  e->token_cursor_.resize(o.max_tokens);
  e->contrib_.resize(e->partial_capacity_);

  // Per-worker scratch, allocated and first touched by its own worker.
  ExpertCall probe;
  probe.num_tokens = std::min(kRowBatch, max_entries);
  probe.dim = dim;
  probe.top_k = 1;
  probe.inter_slice = store.inter_slice();
  probe.num_experts = 1;
  const size_t ws_bytes = ExpertWorkspaceBytes(probe);
  const size_t x_bytes = AlignUp(2 * kRowBatch * sizeof(const float*));
  const size_t ids_bytes = AlignUp(kRowBatch * sizeof(int32_t));
  const size_t w_bytes = AlignUp(kRowBatch * sizeof(float));
  e->scratch_.resize(pool.size());
  std::vector<absl::Status> alloc(pool.size());
  RETURN_IF_ERROR(pool.RunOnEachWorker([&](int w) {
    WorkerScratch& s = e->scratch_[w];
    auto mem =
        AllocateNodeMemory(o.topology, AlignUp(ws_bytes) + x_bytes + ids_bytes + w_bytes, node);
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
    s.xs_rows = s.xq_rows + kRowBatch;
    s.ids = reinterpret_cast<int32_t*>(p + AlignUp(ws_bytes) + x_bytes);
    s.weights = reinterpret_cast<float*>(p + AlignUp(ws_bytes) + x_bytes + ids_bytes);
  }));
  for (const absl::Status& st : alloc) RETURN_IF_ERROR(st);
  // First touch of the partial rows, spread over the node's threads.
  constexpr int64_t kChunk = int64_t{1} << 20;
  uint8_t* partial = e->partial_.data();
  const int64_t partial_bytes = static_cast<int64_t>(e->partial_.size());
  RETURN_IF_ERROR(pool.ParallelFor(CeilDiv(partial_bytes, kChunk), [&](int64_t i, int) {
    std::memset(partial + i * kChunk, 0, std::min(kChunk, partial_bytes - i * kChunk));
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

void ExpertEngine::Plan(int64_t T, const int32_t* ids, const float* weights, int top_k) {
  const int64_t E = store_.num_experts(), entries = T * top_k;
  const int64_t C = store_.inter_slice() / kActBlock;  // 128-column chunks
  const int64_t max_s = std::max<int64_t>(1, store_.inter_slice() / options_.min_split_cols);
  std::fill(expert_count_.begin(), expert_count_.end(), 0);
  for (int64_t i = 0; i < entries; ++i) ++expert_count_[ids[i]];
  int64_t P = 0;
  expert_offset_[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    expert_offset_[e + 1] = expert_offset_[e] + expert_count_[e];
    P += CeilDiv(expert_count_[e], kRowBatch);
  }
  std::copy(expert_offset_.begin(), expert_offset_.end() - 1, expert_cursor_.begin());
  for (int64_t i = 0; i < entries; ++i) {  // token-major within an expert
    const int32_t pos = expert_cursor_[ids[i]]++;
    entry_token_[pos] = static_cast<int32_t>(i / top_k);
    entry_weight_[pos] = weights[i];
  }

  int64_t s = std::min({max_s, CeilDiv(options_.split_target, P), partial_capacity_ / entries});
  if (options_.max_splits > 0) s = std::min(s, options_.max_splits);
  s = std::max<int64_t>(s, 1);

  int64_t n = 0, row = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t b = 0; b < expert_count_[e]; b += kRowBatch) {
      const int32_t rows = static_cast<int32_t>(std::min(kRowBatch, expert_count_[e] - b));
      for (int64_t j = 0; j < s; ++j) {
        units_[n++] = Unit{static_cast<int32_t>(e),
                           static_cast<int32_t>(expert_offset_[e] + b),
                           rows,
                           static_cast<int32_t>(j * C / s * kActBlock),
                           static_cast<int32_t>((j + 1) * C / s * kActBlock),
                           row};
        row += rows;
      }
    }
  }
  num_units_ = n;
  // Each token has exactly top_k entries, each split s ways: fixed-size contribution lists.
  for (int64_t t = 0; t <= T; ++t) token_offset_[t] = static_cast<int32_t>(t * top_k * s);
  std::copy(token_offset_.begin(), token_offset_.begin() + T, token_cursor_.begin());
  for (int64_t u = 0; u < n; ++u) {
    const Unit& unit = units_[u];
    for (int32_t i = 0; i < unit.rows; ++i)
      contrib_[token_cursor_[entry_token_[unit.entry_begin + i]]++] = unit.partial_row + i;
  }
  last_units_ = n;
  last_splits_ = s;
}

void ExpertEngine::RunUnit(const Unit& u, const ExpertSliceView* views, int worker) {
  WorkerScratch& s = scratch_[worker];
  const int64_t dim = store_.dim(), nb = dim / kActBlock;
  for (int32_t i = 0; i < u.rows; ++i) {
    const int64_t t = entry_token_[u.entry_begin + i];
    s.xq_rows[i] = xq_ + t * dim;
    s.xs_rows[i] = xs_ + t * nb;
    s.weights[i] = entry_weight_[u.entry_begin + i];
  }
  const ExpertSliceView& v = views[u.expert];
  const int64_t a = u.col_begin;
  ExpertSliceView sub = v;
  sub.w1 = v.w1 + a * dim / 2;
  sub.w1_scale = v.w1_scale + a * dim / kMxGroup;
  sub.w3 = v.w3 + a * dim / 2;
  sub.w3_scale = v.w3_scale + a * dim / kMxGroup;
  sub.w2 = v.w2 + a / 2;
  sub.w2_scale = v.w2_scale + a / kMxGroup;
  ExpertCall call;
  call.num_tokens = u.rows;
  call.dim = dim;
  call.top_k = 1;
  call.inter_slice = u.col_end - u.col_begin;
  call.x = nullptr;  // pre-quantised: the call's shared rows
  call.xq_rows = s.xq_rows;
  call.xs_rows = s.xs_rows;
  call.expert_ids = s.ids;
  call.expert_weights = s.weights;
  call.experts = &sub;
  call.num_experts = 1;
  call.swiglu_limit = static_cast<float>(store_.config().swiglu_limit);
  call.out = reinterpret_cast<float*>(partial_.data()) + u.partial_row * dim;
  const absl::Status st = kernel_->run(call, s.workspace, s.workspace_bytes);
  if (!st.ok() && s.status.ok()) s.status = st;
}

absl::Status ExpertEngine::Compute(int layer, int64_t T, const uint16_t* x_bf16, const int32_t* ids,
                                   const float* weights, int top_k, float* out_fp32) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Validate(layer, T, x_bf16, ids, weights, top_k, out_fp32));
  if (T == 0) return absl::OkStatus();
  const ExpertSliceView* views = store_.layer_views(layer);
  Plan(T, ids, weights, top_k);

  const int64_t dim = store_.dim(), nb = dim / kActBlock;
  // Quantise each token row once; every unit of this call shares it.
  RETURN_IF_ERROR(pool_.ParallelFor(T, [&](int64_t t, int) {
    kernel_->quantize_row(x_bf16 + t * dim, dim, xq_ + t * dim, xs_ + t * nb);
  }));
  RETURN_IF_ERROR(pool_.ParallelFor(
      num_units_, [&](int64_t u, int worker) { RunUnit(units_[u], views, worker); }));
  absl::Status failed;
  for (WorkerScratch& s : scratch_) {
    if (failed.ok() && !s.status.ok()) failed = s.status;
    s.status = absl::OkStatus();
  }
  if (!failed.ok()) {  // the request was validated: a kernel error here is an internal bug
    return absl::InternalError(
        absl::StrCat("expert kernel failed on a validated request: ", failed.message()));
  }

  const int64_t blocks = CeilDiv(dim, kReduceCols);
  const float* partial = reinterpret_cast<const float*>(partial_.data());
  return pool_.ParallelFor(T * blocks, [&](int64_t task, int) {
    const int64_t t = task / blocks, d0 = task % blocks * kReduceCols;
    const int64_t d1 = std::min(dim, d0 + kReduceCols);
    float* o = out_fp32 + t * dim;
    std::fill(o + d0, o + d1, 0.0f);
    for (int32_t c = token_offset_[t]; c < token_offset_[t + 1]; ++c) {
      const float* p = partial + contrib_[c] * dim;
      for (int64_t d = d0; d < d1; ++d) o[d] += p[d];
    }
  });
}

}  // namespace ss::expert
