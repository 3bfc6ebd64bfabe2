#include "gpu_worker/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/rope.h"
#include "common/status.h"
#include "gpu_worker/cuda_backend_internal.h"
#include "gpu_worker/kernels/compressor.h"
#include "gpu_worker/kernels/elementwise.h"
#include "gpu_worker/kernels/fp8_linear.h"
#include "gpu_worker/kernels/head.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/indexer.h"
#include "gpu_worker/kernels/indexer_topk.h"
#include "gpu_worker/kernels/kernel_limits.h"
#include "gpu_worker/kernels/output_projection.h"
#include "gpu_worker/kernels/paged_kv.h"
#include "gpu_worker/kernels/prepare.h"
#include "gpu_worker/kernels/rms_norm.h"
#include "gpu_worker/kernels/rope.h"
#include "gpu_worker/kernels/router.h"
#include "gpu_worker/kernels/swiglu.h"
#include "gpu_worker/memory_plan.h"
#include "gpu_worker/nccl_comm.h"
#include "gpu_worker/step_workspace.h"

namespace ss::gpu {

CudaBackend::CudaBackend(std::shared_ptr<const model::Model> model,
                         const CudaBackendOptions& options)
    : model_(std::move(model)), options_(options), impl_(std::make_unique<Impl>()) {}

CudaBackend::~CudaBackend() {
  if (impl_) cudaSetDevice(impl_->device);
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    std::shared_ptr<const model::Model> model, const CudaBackendOptions& o) {
  const ModelConfig& c = model->config();
  // kv_tokens 0 (fit to the device's memory) is resolved below, once the weights are resident.
  RETURN_IF_ERROR(CheckStageLayout(c, o.stage, o.num_stages, o.first_layer, o.end_layer,
                                   o.kv_tokens == 0 ? 1 : o.kv_tokens));
  RETURN_IF_ERROR(cuda::CheckKernelLimits(c));  // once here rather than at every launch
  const int tp = o.tp_size;
  if (tp < 1 || o.tp_rank < 0 || o.tp_rank >= tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("TP rank ", o.tp_rank, " of ", tp, ": expected 0 <= rank < size"));
  }
  if (tp > 1) {
    if (!NcclComm::Available()) {
      return absl::UnimplementedError(absl::StrCat(
          "TP = ", tp, " needs NCCL, and this build has none (cmake/nccl.cmake; set NCCL_ROOT)"));
    }
    if (o.comm == nullptr || o.comm->size() != tp || o.comm->rank() != o.tp_rank ||
        o.comm->device() != o.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TP rank ", o.tp_rank, " of ", tp, " on device ", o.device,
          " needs its group's NcclComm (rank, size and device equal to the backend's)"));
    }
    if (c.n_heads % tp != 0 || c.o_groups % tp != 0 || (c.o_groups / tp) * c.o_lora_rank % 128) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TP = ", tp, " does not split this model: n_heads (", c.n_heads, ") and o_groups (",
          c.o_groups, ") must divide by it and (o_groups / TP)·o_lora_rank (", c.o_lora_rank,
          ") be a multiple of 128"));
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || o.device < 0 || o.device >= n) {
    return absl::FailedPreconditionError(
        absl::StrCat("the cuda backend needs CUDA device ", o.device, "; ", n, " found"));
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(std::move(model), o));
  Impl& im = *b->impl_;
  im.device = o.device;
  im.tp = tp;
  im.rank = o.tp_rank;
  im.comm = tp > 1 ? o.comm : nullptr;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device));
  RETURN_IF_ERROR(cuda::PrepareKernels());
  int single_to_double = 0;  // unknown (0) reads as fast FP64
  if (cudaDeviceGetAttribute(&single_to_double, cudaDevAttrSingleToDoublePrecisionPerfRatio,
                             o.device) != cudaSuccess) {
    (void)cudaGetLastError();
    single_to_double = 0;
  }
  b->fp64_ = UseFp64Sums(o.fp64_sums, single_to_double);
  // The critical path first, where the SMs cannot take every ready block at once: the indexer's
  // branches (a ratio-4 layer's attention waits for its top-k) take the greatest priority, the
  // step's stream the next, the other branches and the routed experts' stream the least. Graph
  // kernel nodes keep their stream's priority (cudaGraphInstantiateFlagUseNodePriority below).
  int least = 0, greatest = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const int main_priority = greatest < least ? greatest + 1 : greatest;
  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&im.stream, cudaStreamNonBlocking, main_priority));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&im.side, cudaStreamNonBlocking, least));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&im.routed_ready, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&im.routed_back, cudaEventDisableTiming));
  for (int k = 0; k < Impl::kBranches; ++k) {
    const bool critical =
        k == Impl::kBranchIndex || k == Impl::kBranchIndexQ || k == Impl::kBranchIndexW;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&im.branch[k], cudaStreamNonBlocking,
                                                      critical ? greatest : least));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&im.fork[k], cudaEventDisableTiming));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&im.joined[k], cudaEventDisableTiming));
  }
  const model::ModelWeights& w = b->model_->weights();
  for (int l = o.first_layer; l < o.end_layer; ++l) {
    ASSIGN_OR_RETURN(DevBlock d, im.Block(c, w.blocks[l]));
    im.blocks.push_back(d);
  }
  if (o.stage == o.num_stages - 1) {
    ASSIGN_OR_RETURN(im.hc_head, im.Hc(w.hc_head));
    ASSIGN_OR_RETURN(im.final_norm, im.F32(w.norm));
    im.vocab_max = (c.vocab_size + tp - 1) / tp;
    im.vocab.begin = std::min<int64_t>(c.vocab_size, o.tp_rank * im.vocab_max);
    im.vocab.end = std::min<int64_t>(c.vocab_size, im.vocab.begin + im.vocab_max);
    ASSIGN_OR_RETURN(im.head, im.Bf16Rows(w.head, im.vocab));
  }
  ASSIGN_OR_RETURN(im.freqs_plain, im.F32(LayerRopeFrequencies(c, 0)));
  ASSIGN_OR_RETURN(im.freqs_comp, im.F32(LayerRopeFrequencies(c, 4)));
  ASSIGN_OR_RETURN(KvLayout layout,
                   KvLayout::Create(c, o.first_layer, o.end_layer, o.kv_block_tokens,
                                    b->model_->options().kv_fp8_sim_rounds));
  // Beside the pool: the largest step's workspace (the role's tokens per step, a chunk ending at
  // the longest context served) and the margin.
  const int64_t workspace =
      StepWorkspaceBytes(c, tp, o.first_layer, o.end_layer, o.max_step_tokens, o.max_context);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  ASSIGN_OR_RETURN(const KvFit fit, FitKvPool(layout, o.kv_tokens, o.kv_extra_sequences,
                                              static_cast<int64_t>(free_bytes),
                                              workspace + o.kv_reserve_bytes, o.kv_sequences));
  b->options_.kv_tokens = fit.kv_tokens;
  b->kv_fit_ =
      absl::StrCat(fit.Describe(), "; the reserve is a ", o.max_step_tokens,
                   "-token step's workspace (", GiB(workspace), ") + ", GiB(o.kv_reserve_bytes));
  RETURN_IF_ERROR(im.kv.Init(layout, fit.kv_tokens, o.kv_extra_sequences));
  return b;
}

BackendInfo CudaBackend::info() const {
  BackendInfo i;
  cudaDeviceProp p{};
  i.device = cudaGetDeviceProperties(&p, impl_->device) == cudaSuccess ? p.name : "cuda";
  i.weight_bytes = impl_->weight_bytes;
  // The pool's capacity as the coordinator counts it (kv_tokens / kv_block_tokens blocks; the
  // pool holds at least those, cuda_backend_kv.h) and the pool's real bytes.
  i.kv_tokens = options_.kv_tokens;
  i.kv_bytes = impl_->kv.bytes();
  return i;
}

KvUsage CudaBackend::kv_usage() const {
  KvUsage u;
  u.capacity_tokens = options_.kv_tokens;
  u.sequences = static_cast<int64_t>(impl_->kv.seqs().size());
  for (const auto& [id, s] : impl_->kv.seqs()) u.used_tokens += s.next_pos;
  return u;
}

void CudaBackend::Release(uint64_t seq_id) {
  if (impl_->kv.Find(seq_id) == nullptr) return;
  cudaSetDevice(impl_->device);
  cudaStreamSynchronize(impl_->stream);
  impl_->kv.Release(seq_id);
}

void CudaBackend::ReleaseAll() {
  cudaSetDevice(impl_->device);
  cudaStreamSynchronize(impl_->stream);
  impl_->kv.ReleaseAll();
}

absl::Status CudaBackend::Check(std::span<const StageChunk> batch) const {
  RETURN_IF_ERROR(CheckBatch(model_->config(), batch, kv_usage().used_tokens, options_.kv_tokens,
                             [&](uint64_t id) -> int64_t {
                               const KvSeq* s = impl_->kv.Find(id);
                               return s == nullptr ? -1 : s->next_pos;
                             }));
  std::vector<uint64_t> ids;
  std::vector<int64_t> ends;
  std::vector<std::span<const int32_t>> tables;
  for (const StageChunk& ch : batch) {
    ids.push_back(ch.seq_id);
    ends.push_back(ch.start + static_cast<int64_t>(ch.tokens.size()));
    tables.push_back(ch.block_table);
  }
  return impl_->kv.Check(ids, ends, tables);
}

namespace {

using Scratch = StepScratch;

// Streams up to this size go through Impl::up_host (pinned) with the step's upload (Run).
constexpr size_t kPinnedStreamsBytes = size_t{8} << 20;

// Linear8 on the device: per-row e4m3 quantisation, then the FP8 linear (bf16 output, or the
// fp32 partial of a TP rank's column slice).
template <typename OutT>
cudaError_t Lin8(const DevFp8& w, const uint16_t* x, int64_t rows, const Scratch& s, OutT* y,
                 cudaStream_t stream) {
  cudaError_t e = cuda::QuantizeActE4m3(x, rows, w.in, s.qbuf, s.sbuf, stream);
  if (e != cudaSuccess) return e;
  return cuda::Fp8Linear(s.qbuf, s.sbuf, rows, w.w, w.s, w.out, w.in, y, stream);
}
// The FP8 linear on activations already quantised (by RmsNormQuant, SwiGluBf16Quant or Lin8).
template <typename OutT>
cudaError_t Gemv8(const DevFp8& w, const uint8_t* q, const float* s, int64_t rows, OutT* y,
                  cudaStream_t stream) {
  return cuda::Fp8Linear(q, s, rows, w.w, w.s, w.out, w.in, y, stream);
}

// The host function of a layer's routed experts (HostExpertsCall): skipped once an earlier layer
// of the step failed (the step fails with that error; the rest of it only has to finish).
void CUDART_CB RunHostExpertsCall(void* p) {
  auto* call = static_cast<HostExpertsCall*>(p);
  if (call->step_failed->load()) {
    call->status = absl::CancelledError("an earlier layer's routed experts failed");
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  call->status = (*call->run)(call->layer, call->rows);
  call->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!call->status.ok()) call->step_failed->store(true);
}

}  // namespace

absl::Status CudaBackend::HostExperts(int64_t layer, int64_t rows) {
  Impl& im = *impl_;
  const ModelConfig& c = model_->config();
  const int64_t dim = c.dim, K = c.n_activated_experts, E = c.n_routed_experts;
  im.host_x.resize(rows * dim);
  const uint16_t* xb = im.moe_x.as<uint16_t>();
  for (int64_t i = 0; i < rows * dim; ++i) im.host_x[i] = Bf16ToFloat(xb[i]);
  const int32_t* ridx = im.moe_ids.as<int32_t>();
  const float* rw = im.moe_w.as<float>();
  float* acc = im.moe_sum.as<float>();
  const model::RoutedExperts* experts = options_.experts ? options_.experts(layer) : nullptr;
  if (experts != nullptr) {
    return experts->Compute(layer, rows, im.host_x.data(), ridx, rw, static_cast<int>(K), acc);
  }
  model::RouterResult r;
  r.indices.assign(ridx, ridx + rows * K);
  r.weights.assign(rw, rw + rows * K);
  if (im.tp > 1) {
    // This rank's experts only (RoutedSum skips ids matching no expert).
    const int64_t e0 = im.rank * E / im.tp, e1 = (im.rank + 1) * E / im.tp;
    for (int32_t& e : r.indices) {
      if (e < e0 || e >= e1) e = -1;
    }
  }
  model::RoutedSum(model_->weights().blocks[layer].moe, c, im.host_x.data(), r, rows, acc);
  return absl::OkStatus();
}

absl::Status CudaBackend::Run(std::span<const StageChunk> batch, const float* streams_in,
                              StageOutput* out, StageTimings* timings) {
  return RunImpl(batch, streams_in, nullptr, false, out, timings);
}

absl::Status CudaBackend::RunDevice(std::span<const StageChunk> batch, const void* streams_in,
                                    StageOutput* out, StageTimings* timings) {
  return RunImpl(batch, nullptr, streams_in, true, out, timings);
}

absl::Status CudaBackend::RunImpl(std::span<const StageChunk> batch, const float* streams_in,
                                  const void* device_in, bool device_out, StageOutput* out,
                                  StageTimings* timings) {
  RETURN_IF_ERROR(Check(batch));
  Impl& im = *impl_;
  const ModelConfig& c = model_->config();
  const int64_t hc = c.hc_mult, dim = c.dim, width = hc * dim;
  const bool first = options_.stage == 0, last = options_.stage == options_.num_stages - 1;
  if (!first && streams_in == nullptr && device_in == nullptr) {
    return absl::InvalidArgumentError("stage > 0 needs the previous stage's streams");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(im.device));
  cudaStream_t st = im.stream;
  const int n_layers = options_.end_layer - options_.first_layer;
  const size_t nc = batch.size();

  // On any failure below, the batch's sequences are dropped (backend.h).
  auto fail = [&](absl::Status s) {
    cudaStreamSynchronize(st);
    cudaStreamSynchronize(im.side);
    for (cudaStream_t b : im.branch) cudaStreamSynchronize(b);
    (void)cudaGetLastError();  // a non-sticky error must not fail the next step's first launch
    for (const StageChunk& ch : batch) Release(ch.seq_id);
    // The zeroed scratch is left zeroed only by completed calls: zero it again for the next step.
    if (im.zeroed.p != nullptr) (void)cudaMemset(im.zeroed.p, 0, im.zeroed.cap);
    return s;
  };

  // Sequence state: tables (the plan's, or the pool's own blocks), compressor states (start 0
  // resets them).
  for (const StageChunk& ch : batch) {
    const absl::Status e = im.kv.Prepare(
        ch.seq_id, ch.start, ch.start + static_cast<int64_t>(ch.tokens.size()), ch.block_table, st);
    if (!e.ok()) return fail(e);
  }
  const KvLayout& kvl = im.kv.layout();
  std::vector<const KvSeq*> seq(nc);
  for (size_t i = 0; i < nc; ++i) seq[i] = im.kv.Find(batch[i].seq_id);

  // The step's plan, from sizes, positions and tables alone (cuda_backend_plan.cc).
  StepPlan plan = PlanStep(batch, c, im.blocks, kvl, seq, im.kv.base());
  const int64_t T = plan.T, max_rows = plan.max_rows;
  const size_t cb_stride = plan.cb_stride;
  const std::vector<int64_t>&row0 = plan.row0, &n_sel = plan.n_sel, &sel_base = plan.sel_base,
        &n_cols = plan.n_cols, &table_off = plan.table_off, &n_cand = plan.n_cand;

  const float eps = static_cast<float>(c.norm_eps), hc_eps = static_cast<float>(c.hc_eps);
  // H, G: this rank's heads and wo_a groups (all of them at TP = 1).
  const int64_t H = c.n_heads / im.tp, G = c.o_groups / im.tp;
  const int64_t Dh = c.head_dim, qlr = c.q_lora_rank, rd = c.rope_head_dim;
  const int64_t nh = c.index_n_heads, ihd = c.index_head_dim;

  // The attention's decoded candidate rows (paged_kv.h), for at most attn_rows tokens per launch
  // (sized by the rows alone: n_heads 0; the decode's split workspace comes on top).
  const int64_t attn_rows = std::clamp<int64_t>(
      kAttentionRowsBytes / cuda::KvSparseAttentionRowsBytes(1, plan.max_cand, Dh, 0), 1, T);
  for (auto [buf, bytes] :
       {std::pair{&im.cand, T * plan.max_cand * 8},
        {&im.kvrows, cuda::KvSparseAttentionRowsBytes(attn_rows, plan.max_cand, Dh, H)},
        {&im.scores, plan.scores_cap * 4},
        {&im.sel, sel_base[nc] * 4}}) {
    if (absl::Status e = buf->Reserve(static_cast<size_t>(bytes)); !e.ok()) return fail(e);
  }
  if (im.zeroed.p == nullptr) {
    const size_t bytes = static_cast<size_t>(Impl::kZeroedTopK + cuda::IndexerTopKScratchBytes());
    if (absl::Status e = im.zeroed.Reserve(bytes); !e.ok()) return fail(e);
    if (const cudaError_t e = cudaMemset(im.zeroed.p, 0, bytes); e != cudaSuccess) {
      return fail(CudaStatus(e, "cudaMemset(zeroed scratch)"));
    }
  }
  uint32_t* const hc_sync = T <= Impl::kHcSyncTokens ? im.zeroed.as<uint32_t>() : nullptr;
  void* const topk_scratch = im.zeroed.as<char>() + Impl::kZeroedTopK;

  // Scratch and the step's inputs.
  Scratch sc;
  const size_t need = CarveStepScratch(c, im.tp, T, nullptr, &sc);
  if (absl::Status e = im.arena.Reserve(need); !e.ok()) return fail(e);
  CarveStepScratch(c, im.tp, T, im.arena.as<char>(), &sc);
#define STEP(expr)                                    \
  do {                                                \
    const absl::Status s_ = CudaCheck((expr), #expr); \
    if (!s_.ok()) return fail(s_);                    \
  } while (0)
  // The step's one upload (StepPlan), staged in pinned memory with the step's input: at the first
  // stage the tokens' embedding rows (bf16 [T, dim], the checkpoint's bytes; HcEmbedStreams copies
  // them to the hc streams), else the previous stage's fp32 streams. An input of more than
  // kPinnedStreamsBytes (prefill chunks: 512 MiB of streams for 8K Flash tokens) is copied
  // straight from the host's memory instead, which the driver pipelines; staging it would add a
  // host copy. Streams already on the device (RunDevice) are copied to the layers' bf16 input.
  const size_t streams_bytes = static_cast<size_t>(T * width) * 4;
  const size_t in_bytes = first ? static_cast<size_t>(T * dim) * 2 : streams_bytes;
  const bool from_device = !first && device_in != nullptr;
  const bool stage_in = !from_device && in_bytes <= kPinnedStreamsBytes;
  // sf32 holds the input, and a middle stage's output streams (fp32) after the last layer.
  const size_t up_bytes = plan.streams_at + streams_bytes;
  const size_t staged_bytes = plan.streams_at + (stage_in ? in_bytes : 0);
  // up_host also takes a non-last stage's output streams back, under the same size rule (below).
  const size_t back_bytes =
      !last && !device_out && streams_bytes <= kPinnedStreamsBytes ? streams_bytes : 0;
  if (absl::Status e = im.params.Reserve(up_bytes); !e.ok()) return fail(e);
  if (absl::Status e = im.up_host.Reserve(std::max(staged_bytes, back_bytes)); !e.ok()) {
    return fail(e);
  }
  char* dev_up = im.params.as<char>();
  sc.ids = reinterpret_cast<int64_t*>(dev_up + plan.ids_at);
  sc.pos = sc.ids + T;
  sc.sf32 = reinterpret_cast<float*>(dev_up + plan.streams_at);
  {
    char* u = im.up_host.as<char>();
    plan.FillUpload(u, dev_up, reinterpret_cast<uint64_t>(sc.staging), kvl.record_bytes, seq);
    std::vector<uint16_t> rows;  // the embedding rows of an input too long to stage
    const void* from = streams_in;
    if (first) {
      uint16_t* r = reinterpret_cast<uint16_t*>(u + plan.streams_at);
      if (!stage_in) {
        rows.resize(T * dim);
        r = rows.data();
      }
      const uint8_t* table = model_->weights().embed.data;
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(r + t * dim, table + plan.ids[t] * dim * 2, dim * 2);
      from = r;
    } else if (stage_in) {
      std::memcpy(u + plan.streams_at, streams_in, streams_bytes);
    }
    STEP(cudaMemcpyAsync(dev_up, u, staged_bytes, cudaMemcpyHostToDevice, st));
    if (from_device) {
      STEP(cudaMemcpyAsync(sc.h, device_in, static_cast<size_t>(T * width) * 2,
                           cudaMemcpyDeviceToDevice, st));
    } else if (!stage_in) {
      STEP(cudaMemcpyAsync(sc.sf32, from, in_bytes, cudaMemcpyHostToDevice, st));
    }
  }
  const int64_t* dparams = im.params.as<int64_t>();
  const auto* dtokens = reinterpret_cast<const cuda::KvToken*>(dev_up + plan.tokens_at);
  const int32_t* dtables = reinterpret_cast<const int32_t*>(dev_up + plan.tables_at);
  const auto* ddst_main = reinterpret_cast<const uint64_t*>(dev_up + plan.dst_at);
  const uint64_t* ddst_key = ddst_main + plan.dst_main.size();
  const uint8_t* pool = im.kv.base();

  if (timings) {
    for (auto* v :
         {&timings->attention, &timings->moe_gpu, &timings->moe_cpu, &timings->allreduce}) {
      v->assign(n_layers, 0.0);
    }
  }
  const float scale = static_cast<float>(std::pow(static_cast<double>(Dh), -0.5));
  const float wscale = static_cast<float>(std::pow(static_cast<double>(ihd), -0.5) *
                                          std::pow(static_cast<double>(nh), -0.5));
  const bool rounds = model_->options().kv_fp8_sim_rounds;
  const float limit = static_cast<float>(c.swiglu_limit);
  const int64_t K = c.n_activated_experts;
  const float shared_limit = model_->options().shared_expert_clamp ? limit : 0.0f;
  const bool host_experts = !options_.exclude_routed_experts;
  if (host_experts) {
    for (auto [buf, bytes] : {std::pair{&im.moe_x, T * dim * 2},
                              {&im.moe_ids, T * K * 4},
                              {&im.moe_w, T * K * 4},
                              {&im.moe_sum, T * dim * 4}}) {
      if (absl::Status e = buf->Reserve(static_cast<size_t>(bytes)); !e.ok()) return fail(e);
    }
  }

  // Timing marks (StageTimings): events recorded in the stream, read after the step's final wait,
  // so timing adds no host synchronisation (and runs inside a graph as well).
  enum Mark {
    kLayerStart,
    kAttnArBegin,
    kAttnArEnd,
    kAttnEnd,
    kMoeArBegin,
    kMoeArEnd,
    kLayerEnd,
    kMarks
  };
  if (timings) {
    while (im.marks.size() < static_cast<size_t>(n_layers) * kMarks) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreate(&e) != cudaSuccess) {
        return fail(absl::InternalError("cudaEventCreate (timing marks) failed"));
      }
      im.marks.push_back(e);
    }
  }
  if (host_experts) {
    if (!im.host_experts) {
      im.host_experts = [this](int64_t layer, int64_t rows) { return HostExperts(layer, rows); };
    }
    while (im.host_calls.size() < static_cast<size_t>(n_layers)) {
      auto call = std::make_unique<HostExpertsCall>();
      call->run = &im.host_experts;
      call->step_failed = &im.host_failed;
      call->layer = options_.first_layer + static_cast<int64_t>(im.host_calls.size());
      im.host_calls.push_back(std::move(call));
    }
    im.host_failed.store(false);
    for (int l = 0; l < n_layers; ++l) {
      HostExpertsCall& hcall = *im.host_calls[l];
      hcall.rows = T;
      hcall.status = absl::OkStatus();
      hcall.seconds = 0.0;
    }
  }

  // TP > 1: sums sc.part[0, n) over the group (enqueued only: the step waits for its collectives
  // once, under the deadline, after its layers).
  // A timing mark: under capture an event-record node (cudaEventRecordExternal; a plain record
  // would only order the capture, and the flag is refused outside one), otherwise a record.
  bool capturing = false;
  auto mark = [&](int l, int m) {
    return cudaEventRecordWithFlags(im.marks[l * kMarks + m], st,
                                    capturing ? cudaEventRecordExternal : cudaEventRecordDefault);
  };
  auto all_reduce = [&](int l, int64_t n, Mark begin) -> absl::Status {
    if (timings) RETURN_IF_ERROR(CudaCheck(mark(l, begin), "timing mark"));
    RETURN_IF_ERROR(im.comm->AllReduceSum(sc.part, n, st));
    if (timings) RETURN_IF_ERROR(CudaCheck(mark(l, begin + 1), "timing mark"));
    return absl::OkStatus();
  };

  // Branches (Impl::branch): fork_branch(k) makes branch k wait for everything enqueued on the
  // step's stream so far; branch_done(k) marks the end of its work so far, which wait_branch(s, k)
  // makes stream s wait for.
  // mark_fork(k) and take_fork(k) are its two halves, for a branch that starts from an earlier
  // point of the stream than the work enqueued on the stream before the branch's own.
  auto mark_fork = [&](int k) { return cudaEventRecord(im.fork[k], st); };
  auto take_fork = [&](int k) { return cudaStreamWaitEvent(im.branch[k], im.fork[k], 0); };
  auto fork_branch = [&](int k) {
    const cudaError_t e = mark_fork(k);
    return e == cudaSuccess ? take_fork(k) : e;
  };
  auto branch_done = [&](int k) { return cudaEventRecord(im.joined[k], im.branch[k]); };
  auto wait_branch = [&](cudaStream_t s, int k) { return cudaStreamWaitEvent(s, im.joined[k], 0); };

  // HcPre of a sublayer, then its input norm (weight g) and the quantisation: xn and qbuf / sbuf.
  // In decode the Sinkhorn (comb, read only by the sublayer's HcPost) runs on a branch, beside the
  // sublayer, and the norm runs in HcPre's last kernel.
  const bool defer_comb = cuda::HcPreDefersComb(T, hc, dim, cuda::AsBf16(sc.y));
  auto hc_pre = [&](const uint16_t* streams, const DevHc& w, const float* g) -> cudaError_t {
    const cuda::HcPreParams p = {.streams = cuda::AsBf16(streams), .fn = w.fn, .base = w.base,
                                 .scale = w.scale, .T = T, .hc = hc, .dim = dim,
                                 .sinkhorn_iters = c.hc_sinkhorn_iters, .hc_eps = hc_eps,
                                 .norm_eps = eps, .y = cuda::AsBf16(sc.y), .pre = sc.pre,
                                 .post = sc.post, .comb = sc.comb};
    if (!defer_comb) {
      const cudaError_t e = cuda::HcPre(p, st);
      return e == cudaSuccess
                 ? cuda::RmsNormQuant(sc.y, g, T, dim, eps, sc.xn, sc.qbuf, sc.sbuf, st)
                 : e;
    }
    cudaError_t e = cuda::HcPreDeferCombNormQuant(
        p,
        {.g = g, .rms_eps = eps, .xn = cuda::AsBf16(sc.xn), .q = cuda::AsE4m3(sc.qbuf),
         .s = sc.sbuf, .sync = hc_sync},
        st);
    if (e == cudaSuccess) e = fork_branch(Impl::kBranchHc);
    if (e == cudaSuccess) {
      e = cuda::HcCombSinkhorn(sc.comb, T, hc, c.hc_sinkhorn_iters, hc_eps,
                               im.branch[Impl::kBranchHc]);
    }
    if (e == cudaSuccess) e = branch_done(Impl::kBranchHc);
    return e;
  };

  // The layers' GPU work; with graphs (below) captured once per step shape and replayed.
  auto run_layers = [&]() -> absl::Status {
    // The step's streams as bf16 (from the uploaded embedding rows or streams; RunDevice's are
    // there already) and its RoPE tables (from the uploaded positions).
    if (first) {
      STEP(cuda::HcEmbedStreams(reinterpret_cast<const uint16_t*>(sc.sf32), T, hc, dim, sc.h, st));
    } else if (!from_device) {
      STEP(cuda::RoundF32ToBf16(sc.sf32, T * width, sc.h, st));
    }
    STEP(cuda::RopeCosSinPair(im.freqs_plain, im.freqs_comp, rd / 2, sc.pos, T, sc.cos0, sc.sin0,
                              sc.cos1, sc.sin1, st));
    for (int l = 0; l < n_layers; ++l) {
      const DevBlock& b = im.blocks[l];
      const cuda::KvToken* tok = dtokens + l * T;
      const cuda::KvGeom geom = kvl.Geom(l, pool);
      if (timings) STEP(mark(l, kLayerStart));
      const float* cs = b.ratio == 0 ? sc.cos0 : sc.cos1;
      const float* sn = b.ratio == 0 ? sc.sin0 : sc.sin1;
      const float* freqs = b.ratio == 0 ? im.freqs_plain : im.freqs_comp;
      // ---- attention sublayer
      // The normed attention input xn and its quantisation (qbuf) for wq_a and wkv.
      STEP(hc_pre(sc.h, b.hc_attn, b.attn_norm));

      // Off the critical path, on branch streams from here (Impl::branch): the compressors and
      // the indexer's head weights from xn; wkv and the KV latent's norm, RoPE and staging from
      // qbuf; the indexer's wq_b and query prep from qbuf2. Each branch has its own scratch; the
      // main stream joins them before the attention (qbuf is next written after those joins).
      // A ratio-4 layer's critical path runs through wq_a, its norm, the indexer's wq_b, scores
      // and top-k, which also wait for the indexer's compressor (its new key) and head weights.
      // So the branches start here but are enqueued after wq_a + wkv below, the indexer's first,
      // so that the graph launches them in that order: launched behind the compressors' long
      // projections, wq_a found the SMs full and waited for them. The head weights have a branch
      // of their own: on the query's, the indexer's wq_b waited for them.
      if (b.has_compressor) STEP(mark_fork(Impl::kBranchComp));
      if (b.has_indexer) {
        STEP(mark_fork(Impl::kBranchIndex));
        STEP(mark_fork(Impl::kBranchIndexW));
      }
      STEP(cuda::Fp8LinearPair(sc.qbuf, sc.sbuf, T, b.wq_a.in, b.wq_a.w, b.wq_a.s, b.wq_a.out,
                               sc.qa, b.wkv.w, b.wkv.s, b.wkv.out, sc.kva, st));
      cudaStream_t bs_kv = im.branch[Impl::kBranchKv], bs_comp = im.branch[Impl::kBranchComp],
                   bs_index = im.branch[Impl::kBranchIndex], bs_iq = im.branch[Impl::kBranchIndexQ],
                   bs_iw = im.branch[Impl::kBranchIndexW];
      auto compress = [&](const DevCompressor& w, int kind, cuda::CompressorShape shape,
                          uint16_t* entries, float* cv, float* cg,
                          cudaStream_t bs) -> absl::Status {
        const int64_t wd = w.width;
        RETURN_IF_ERROR(CudaCheck(
            cuda::LinearBf16F32Pair(sc.xn, T, dim, w.wkv.p, wd, cv, wd, w.wgate.p, wd, cg, wd, bs),
            "LinearBf16F32Pair(wkv, wgate)"));
        const int64_t* a = dparams + (l * 2 + kind) * cb_stride;
        cuda::CompressorBatch cb;
        cb.n_seqs = static_cast<int64_t>(nc);
        cb.max_new = max_rows / b.ratio + 1;
        cb.start = a;
        cb.row_begin = a + nc;
        cb.entry_begin = a + 2 * nc + 1;
        cb.kv_state = reinterpret_cast<float* const*>(a + 3 * nc + 1);
        cb.score_state = reinterpret_cast<float* const*>(a + 4 * nc + 1);
        return CudaCheck(
            cuda::CompressorStep(cv, cg, wd, w.ape, w.norm, freqs, shape, cb, entries, bs),
            "CompressorStep");
      };
      // The compressors write their new entries to scratch rows (ebase), then the encoders put
      // them into their MXFP4 keys / records in the sequences' blocks.
      if (b.has_indexer) {
        STEP(take_fork(Impl::kBranchIndex));
        cuda::CompressorShape shape{
            cuda::CompressorKind::kIndexer, b.ratio, ihd, rd, eps, rounds, fp64_};
        const absl::Status e =
            compress(b.index_compressor, 1, shape, sc.ckeys, sc.icv, sc.icg, bs_index);
        if (!e.ok()) return fail(e);
        STEP(cuda::KvEncodeKeys(sc.ckeys, ddst_key + l * T, T, ihd, bs_index));
        STEP(branch_done(Impl::kBranchIndex));
        // The indexer's head weights; (below) its query, scores and top-k on one branch.
        STEP(take_fork(Impl::kBranchIndexW));
        STEP(cuda::LinearBf16F32(sc.xn, T, dim, b.index_weights_proj.p, nh, sc.proj, nh, bs_iw));
        STEP(cuda::IndexerWeightScale(sc.proj, T * nh, wscale, sc.iw, bs_iw));
        STEP(branch_done(Impl::kBranchIndexW));
      }
      if (b.has_compressor) {
        STEP(take_fork(Impl::kBranchComp));
        cuda::CompressorShape shape{
            cuda::CompressorKind::kMain, b.ratio, Dh, rd, eps, rounds, fp64_};
        const absl::Status e = compress(b.compressor, 0, shape, sc.centries, sc.cv, sc.cg, bs_comp);
        if (!e.ok()) return fail(e);
        STEP(cuda::KvEncodeRecords(sc.centries, ddst_main + l * T, T, kvl.nope, kvl.rope, bs_comp));
        STEP(branch_done(Impl::kBranchComp));
      }

      // wq_a and the KV latent's wkv (above, in one launch in decode; one each for longer
      // chunks), then on a branch the latent's norm, RoPE and FP8 simulation, and the chunks' raw
      // KV as records in the step's staging (read by the attention through the candidate lists).
      STEP(fork_branch(Impl::kBranchKv));
      STEP(cuda::RmsNorm(sc.kva, b.kv_norm, T, Dh, eps, sc.kv, bs_kv));
      STEP(cuda::ApplyRope(sc.kv, T, 1, Dh, rd, cs, sn, false, bs_kv));
      STEP(cuda::Fp8SimInplace(sc.kv, T, Dh, Dh - rd, 64, rounds, bs_kv));
      STEP(cuda::KvStageRecords(geom, tok, T, sc.kv, bs_kv));
      STEP(branch_done(Impl::kBranchKv));

      // The query: wq_a's output's norm and quantisation (qbuf2, shared with the indexer's wq_b),
      // wq_b, the per-head norm and RoPE.
      STEP(cuda::RmsNormQuant(sc.qa, b.q_norm, T, qlr, eps, sc.qr, sc.qbuf2, sc.sbuf2, st));
      if (b.has_indexer) {
        // The indexer's query from qbuf2, then (with the new keys) each chunk's scores and top-k
        // selections, which stay on the device (sel_base: where KvBuildCandidates reads).
        STEP(fork_branch(Impl::kBranchIndexQ));
        STEP(Gemv8(b.index_wq_b, sc.qbuf2, sc.sbuf2, T, sc.iq, bs_iq));
        STEP(cuda::IndexerPrepQ(sc.iq, T, nh, ihd, rd, cs, sn, fp64_, bs_iq));
        STEP(wait_branch(bs_iq, Impl::kBranchIndex));
        STEP(wait_branch(bs_iq, Impl::kBranchIndexW));
        if (plan.index_one_launch && plan.index_k > 0) {
          STEP(cuda::KvIndexerScoresTokens(sc.iq, sc.iw, geom, tok, sc.pos, T, nh, 4,
                                           plan.index_cols, im.scores.as<float>(), bs_iq));
          STEP(cuda::IndexerTopK(im.scores.as<float>(), T, plan.index_cols, plan.index_k,
                                 im.sel.as<int32_t>(), topk_scratch, bs_iq));
        }
        for (size_t i = 0; i < nc && !plan.index_one_launch; ++i) {
          if (n_sel[i] == 0) continue;
          const int64_t S = row0[i + 1] - row0[i];
          // Scores straight from the chunk's MXFP4 keys in the pool (decoded per staged tile).
          STEP(cuda::KvIndexerScores(sc.iq + row0[i] * nh * ihd, sc.iw + row0[i] * nh, geom,
                                     dtables + table_off[i], table_off[i + 1] - table_off[i],
                                     sc.pos + row0[i], S, nh, 4, n_cols[i], im.scores.as<float>(),
                                     bs_iq));
          STEP(cuda::IndexerTopK(im.scores.as<float>(), S, n_cols[i], n_sel[i],
                                 im.sel.as<int32_t>() + sel_base[i], topk_scratch, bs_iq));
        }
        STEP(branch_done(Impl::kBranchIndexQ));
      }
      STEP(Gemv8(b.wq_b, sc.qbuf2, sc.sbuf2, T, sc.q, st));
      STEP(cuda::HeadRmsNormRope(sc.q, T, H, Dh, eps, rd, cs, sn, st));
      if (b.has_indexer) STEP(wait_branch(st, Impl::kBranchIndexQ));

      // Every token's candidate list (record addresses: the staged raw KV, the rings, the
      // compressed entries), one attention launch for all sequences (ending in the output's
      // inverse RoPE), then the last W positions of each chunk into its ring records. Where one
      // launch covers all T tokens the candidates' rows are decoded with the candidate list.
      STEP(wait_branch(st, Impl::kBranchKv));
      if (b.has_compressor) STEP(wait_branch(st, Impl::kBranchComp));
      uint64_t* cand = im.cand.as<uint64_t>();
      const bool one_launch = attn_rows >= T;
      STEP(cuda::KvBuildCandidates(geom, tok, T, im.sel.as<int32_t>(), n_cand[l], cand, st,
                                   one_launch ? im.kvrows.as<uint16_t>() : nullptr));
      for (int64_t t0 = 0; t0 < T; t0 += attn_rows) {
        const int64_t n = std::min(attn_rows, T - t0);
        STEP(cuda::KvSparseAttention(
            {.q = cuda::AsBf16(sc.q + t0 * H * Dh), .cand = cand + t0 * n_cand[l], .sink = b.sink,
             .T = n, .n_heads = H, .head_dim = Dh, .nope = kvl.nope, .n_cand = n_cand[l],
             .scale = scale, .out = cuda::AsBf16(sc.o + t0 * H * Dh),
             .rows = cuda::AsBf16(im.kvrows.as<uint16_t>()), .rows_decoded = one_launch,
             .rope_cos = cs + t0 * (rd / 2), .rope_sin = sn + t0 * (rd / 2), .rope_dim = rd},
            st));
      }
      // The chunks' last W positions into the rings (read again by the next step's attention),
      // off the critical path: the next layer's kv work follows it on the same branch, and the
      // step joins the branch after its last layer.
      STEP(fork_branch(Impl::kBranchKv));
      STEP(cuda::KvRingRecords(geom, tok, T, sc.kv, bs_kv));
      STEP(branch_done(Impl::kBranchKv));
      STEP(cuda::GroupedOutputProjection(sc.o, T, G, c.o_lora_rank, H * Dh / G, b.wo_a.w, b.wo_a.s,
                                         sc.z, st));
      // TP 1: wo_b runs the HcPost in its epilogue (decode); TP > 1: the HcPost rounds the
      // all-reduced sum itself.
      const cuda::HcPostOperands attn_post{sc.h, sc.post, sc.comb, hc, dim, sc.mid};
      if (defer_comb) STEP(wait_branch(st, Impl::kBranchHc));
      if (im.tp == 1) {
        STEP(cuda::QuantizeActE4m3(sc.z, T, b.wo_b.in, sc.qbuf, sc.sbuf, st));
        STEP(cuda::Fp8LinearHcPost(sc.qbuf, sc.sbuf, T, b.wo_b.w, b.wo_b.s, b.wo_b.out, b.wo_b.in,
                                   sc.attn, attn_post, st));
      } else {
        STEP(Lin8(b.wo_b, sc.z, T, sc, sc.part, st));
        if (absl::Status e = all_reduce(l, T * dim, kAttnArBegin); !e.ok()) return fail(e);
        STEP(cuda::HcPostF32(sc.part, T, attn_post, st));
      }
      if (timings) STEP(mark(l, kAttnEnd));

      // ---- MoE sublayer
      STEP(hc_pre(sc.mid, b.hc_ffn, b.ffn_norm));
      // The routed experts on the side stream: the router, then (host experts) the rows to the
      // host, the host call and the sum's upload, while this stream runs the shared expert.
      STEP(cudaEventRecord(im.routed_ready, st));
      STEP(cudaStreamWaitEvent(im.side, im.routed_ready, 0));
      STEP(cuda::Route({.x = cuda::AsBf16(sc.xn), .gate = cuda::AsBf16(b.gate.p), .bias = b.bias,
                        .tid2eid = b.tid2eid, .token_ids = sc.ids, .T = T,
                        .E = c.n_routed_experts, .dim = dim, .k = K,
                        .route_scale = static_cast<float>(c.route_scale), .logits = sc.rlogits,
                        .indices = sc.ridx, .weights = sc.rw},
                       im.side));
      if (host_experts) {
        STEP(cudaMemcpyAsync(im.moe_x.p, sc.xn, T * dim * 2, cudaMemcpyDeviceToHost, im.side));
        STEP(cudaMemcpyAsync(im.moe_ids.p, sc.ridx, T * K * 4, cudaMemcpyDeviceToHost, im.side));
        STEP(cudaMemcpyAsync(im.moe_w.p, sc.rw, T * K * 4, cudaMemcpyDeviceToHost, im.side));
        STEP(cudaLaunchHostFunc(im.side, RunHostExpertsCall, im.host_calls[l].get()));
        float* dst = im.tp == 1 ? sc.routed : sc.part + T * dim;
        STEP(cudaMemcpyAsync(dst, im.moe_sum.p, T * dim * 4, cudaMemcpyHostToDevice, im.side));
      }
      STEP(cudaEventRecord(im.routed_back, im.side));
      // The shared expert (this rank's slice of it) runs on the GPU while the host computes the
      // routed experts.
      const int64_t si = b.shared_inter;
      if (si > 0) {
        // w1 and w3 in one launch (decode; one each for longer chunks).
        STEP(cuda::Fp8LinearPair(sc.qbuf, sc.sbuf, T, b.shared_w1.in, b.shared_w1.w, b.shared_w1.s,
                                 b.shared_w1.out, sc.sg, b.shared_w3.w, b.shared_w3.s,
                                 b.shared_w3.out, sc.su, st));
        STEP(cuda::SwiGluBf16Quant(sc.sg, sc.su, si, T, si, shared_limit, sc.sa, sc.qbuf, sc.sbuf,
                                   st));
        if (im.tp == 1) {
          STEP(Gemv8(b.shared_w2, sc.qbuf, sc.sbuf, T, sc.shared, st));
        } else {
          STEP(Gemv8(b.shared_w2, sc.qbuf, sc.sbuf, T, sc.part, st));
        }
      }
      STEP(cudaStreamWaitEvent(st, im.routed_back, 0));
      if (defer_comb) STEP(wait_branch(st, Impl::kBranchHc));
      // The reference's combine and the HcPost in one launch.
      // A middle stage's last layer also writes the output streams as fp32.
      const cuda::HcPostOperands moe_post{
          sc.mid, sc.post, sc.comb, hc, dim, sc.h2, !last && l + 1 == n_layers ? sc.sf32 : nullptr};
      if (im.tp == 1) {
        STEP(cuda::MoeCombineHcPost(si > 0 ? sc.shared : nullptr,
                                    host_experts ? sc.routed : nullptr, T, moe_post, st));
      } else {
        // [shared partial | routed share], summed in one collective.
        if (si == 0) STEP(cudaMemsetAsync(sc.part, 0, T * dim * 4, st));
        if (!host_experts) STEP(cudaMemsetAsync(sc.part + T * dim, 0, T * dim * 4, st));
        if (absl::Status e = all_reduce(l, 2 * T * dim, kMoeArBegin); !e.ok()) return fail(e);
        STEP(cuda::MoeCombineF32HcPost(sc.part, sc.part + T * dim, T, moe_post, st));
      }
      std::swap(sc.h, sc.h2);
      if (timings) STEP(mark(l, kLayerEnd));
    }
    // The last layer's ring writes; the output streams as fp32 (a middle stage's output; its
    // last layer's HcPost wrote them).
    if (n_layers > 0) STEP(wait_branch(st, Impl::kBranchKv));
    if (!last && n_layers == 0) STEP(cuda::Bf16ToF32(sc.h, T * width, sc.sf32, st));
    return absl::OkStatus();
  };

  // Decode under CUDA graphs: a step runs its layers as one graph (the host's routed-experts calls
  // as host nodes on the side stream, the TP collectives as NCCL's captured kernels, the timing
  // marks as event nodes), keyed by everything the launches take from the host (sizes, scratch
  // and pinned addresses, what the step includes). A key seen on the previous step is captured,
  // then replayed while it repeats (a new capture updates the instantiated graph in place when
  // only parameters changed); a new key runs launched and becomes the pending key. The step's
  // inputs (streams, ids, positions, compressor arrays, KvTokens, tables, entry addresses) are
  // uploaded above into the same buffers every step, before the replay.
  if (!im.graphs) {
    RETURN_IF_ERROR(run_layers());
  } else {
    std::vector<int64_t> key = {
        T, static_cast<int64_t>(nc), max_rows, attn_rows, host_experts, timings != nullptr};
    for (size_t i = 0; i < nc; ++i) {
      key.insert(key.end(), {row0[i + 1] - row0[i], n_sel[i], n_cols[i], table_off[i + 1]});
    }
    key.insert(key.end(), n_cand.begin(), n_cand.end());
    for (const void* p : {im.arena.p, im.params.p, im.cand.p, im.kvrows.p, im.scores.p, im.sel.p,
                          static_cast<void*>(const_cast<uint8_t*>(pool)), im.moe_x.p, im.moe_ids.p,
                          im.moe_w.p, im.moe_sum.p}) {
      key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)));
    }
    if (im.graph_exec != nullptr && key == im.graph_key) {
      STEP(cudaGraphLaunch(im.graph_exec, st));
      ++im.graph_replays;
      // The host's view of the ping-pong stream buffers, as the loop leaves it.
      if (n_layers % 2 != 0) std::swap(sc.h, sc.h2);
    } else if (key == im.pending_key) {
      im.graph_key.clear();
      STEP(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      capturing = true;
      const absl::Status e = run_layers();
      capturing = false;
      cudaGraph_t graph = nullptr;
      const cudaError_t ce = cudaStreamEndCapture(st, &graph);
      if (!e.ok()) {
        if (graph != nullptr) cudaGraphDestroy(graph);
        return e;
      }
      if (ce != cudaSuccess) return fail(CudaStatus(ce, "cudaStreamEndCapture"));
      cudaGraphExecUpdateResultInfo info;
      if (im.graph_exec != nullptr &&
          cudaGraphExecUpdate(im.graph_exec, graph, &info) != cudaSuccess) {
        (void)cudaGetLastError();  // a different topology: instantiate anew
        cudaGraphExecDestroy(im.graph_exec);
        im.graph_exec = nullptr;
      }
      cudaError_t ie = cudaSuccess;
      if (im.graph_exec == nullptr)
        ie = cudaGraphInstantiate(&im.graph_exec, graph, cudaGraphInstantiateFlagUseNodePriority);
      cudaGraphDestroy(graph);
      if (ie != cudaSuccess) {
        im.graph_exec = nullptr;
        return fail(CudaStatus(ie, "cudaGraphInstantiate"));
      }
      im.graph_key = key;
      ++im.graph_captures;
      STEP(cudaGraphLaunch(im.graph_exec, st));
      ++im.graph_replays;
    } else {
      im.pending_key = std::move(key);
      RETURN_IF_ERROR(run_layers());
    }
  }
  // TP > 1: the step's collectives, waited for once under the deadline (nccl_comm.h "Failure").
  if (im.tp > 1) {
    if (absl::Status e = im.comm->Synchronize(st, options_.collective_timeout); !e.ok()) {
      return fail(e);
    }
  }

  out->rows = T;
  out->width = width;
  out->streams.clear();
  out->logits.clear();
  out->device_streams = nullptr;
  if (last) {
    std::vector<int64_t> rows;
    for (size_t i = 0; i < nc; ++i) {
      if (batch[i].samples) rows.push_back(row0[i + 1] - 1);
    }
    const int64_t n = static_cast<int64_t>(rows.size());
    if (n > 0) {
      for (int64_t r = 0; r < n; ++r) {
        STEP(cudaMemcpyAsync(sc.h2 + r * width, sc.h + rows[r] * width, width * 2,
                             cudaMemcpyDeviceToDevice, st));
      }
      const int64_t V = c.vocab_size;
      STEP(cuda::HcHead({.streams = cuda::AsBf16(sc.h2), .fn = im.hc_head.fn,
                         .base = im.hc_head.base, .scale = im.hc_head.scale, .T = n, .hc = hc,
                         .dim = dim, .hc_eps = hc_eps, .norm_eps = eps, .z = cuda::AsBf16(sc.y)},
                        st));
      STEP(cuda::RmsNorm(sc.y, im.final_norm, n, dim, eps, sc.xn, st));
      if (im.tp == 1) {
        if (absl::Status e = im.logits.Reserve(n * V * 4); !e.ok()) return fail(e);
        STEP(cuda::LmHead(sc.xn, n, dim, im.head.p, V, im.logits.as<float>(), V, st));
        std::vector<float> lg(n * V);
        STEP(cudaMemcpyAsync(lg.data(), im.logits.p, n * V * 4, cudaMemcpyDeviceToHost, st));
        STEP(cudaStreamSynchronize(st));
        for (int64_t r = 0; r < n; ++r)
          out->logits.emplace_back(lg.begin() + r * V, lg.begin() + (r + 1) * V);
      } else {
        // Vocab-parallel: this rank's rows [n, vm] (a shorter last shard leaves its tail unused),
        // gathered rank-major [tp, n, vm], then laid out per row.
        const int64_t vm = im.vocab_max, tp = im.tp;
        if (absl::Status e = im.logits.Reserve((1 + tp) * n * vm * 4); !e.ok()) return fail(e);
        float* shard = im.logits.as<float>();
        float* gathered = shard + n * vm;
        STEP(cuda::LmHead(sc.xn, n, dim, im.head.p, im.vocab.size(), shard, vm, st));
        if (absl::Status e = im.comm->AllGather(shard, n * vm, gathered, st); !e.ok()) {
          return fail(e);
        }
        if (absl::Status e = im.comm->Synchronize(st, options_.collective_timeout); !e.ok()) {
          return fail(e);
        }
        std::vector<float> lg(tp * n * vm);
        STEP(cudaMemcpyAsync(lg.data(), gathered, lg.size() * 4, cudaMemcpyDeviceToHost, st));
        STEP(cudaStreamSynchronize(st));
        for (int64_t r = 0; r < n; ++r) {
          std::vector<float>& row = out->logits.emplace_back(V);
          for (int64_t q = 0; q < tp; ++q) {
            const int64_t v0 = std::min(V, q * vm), v1 = std::min(V, v0 + vm);
            std::copy_n(lg.begin() + (q * n + r) * vm, v1 - v0, row.begin() + v0);
          }
        }
      }
    }
  } else if (device_out) {
    out->device_streams = sc.h;  // the last HcPost's bf16 streams (or the input's, no layers)
  } else {
    // Back through the pinned staging (its upload finished before the step's kernels ran), or
    // straight into the output for a long chunk.
    const size_t streams_bytes = static_cast<size_t>(T * width) * 4;
    if (streams_bytes <= kPinnedStreamsBytes) {
      STEP(cudaMemcpyAsync(im.up_host.p, sc.sf32, streams_bytes, cudaMemcpyDeviceToHost, st));
      STEP(cudaStreamSynchronize(st));
      const float* back = im.up_host.as<float>();
      out->streams.assign(back, back + T * width);
    } else {
      out->streams.resize(T * width);
      STEP(
          cudaMemcpyAsync(out->streams.data(), sc.sf32, streams_bytes, cudaMemcpyDeviceToHost, st));
    }
  }
  STEP(cudaStreamSynchronize(st));
#undef STEP
  if (host_experts) {
    for (int l = 0; l < n_layers; ++l) {
      const HostExpertsCall& hcall = *im.host_calls[l];
      if (!hcall.status.ok() && !absl::IsCancelled(hcall.status)) return fail(hcall.status);
    }
  }
  if (timings) {
    auto ms = [&](int l, Mark a, Mark b) {
      float v = 0.0f;
      if (cudaEventElapsedTime(&v, im.marks[l * kMarks + a], im.marks[l * kMarks + b]) !=
          cudaSuccess) {
        (void)cudaGetLastError();  // no figure; the error must not reach a later launch's check
        v = 0.0f;
      }
      return static_cast<double>(v) * 1e-3;
    };
    for (int l = 0; l < n_layers; ++l) {
      const double ar_attn = im.tp > 1 ? ms(l, kAttnArBegin, kAttnArEnd) : 0.0;
      const double ar_moe = im.tp > 1 ? ms(l, kMoeArBegin, kMoeArEnd) : 0.0;
      const double host = host_experts ? im.host_calls[l]->seconds : 0.0;
      timings->attention[l] = ms(l, kLayerStart, kAttnEnd) - ar_attn;
      timings->moe_cpu[l] = host;
      timings->moe_gpu[l] = std::max(0.0, ms(l, kAttnEnd, kLayerEnd) - host - ar_moe);
      timings->allreduce[l] = ar_attn + ar_moe;
    }
  }
  for (size_t i = 0; i < nc; ++i) {
    im.kv.Find(batch[i].seq_id)->next_pos = batch[i].start + (row0[i + 1] - row0[i]);
  }
  return absl::OkStatus();
}

void CudaBackend::set_decode_graphs(bool on) {
  impl_->graphs = on;
  impl_->pending_key.clear();
}
int64_t CudaBackend::graph_captures() const { return impl_->graph_captures; }
int64_t CudaBackend::graph_replays() const { return impl_->graph_replays; }

absl::Status CudaBackend::FillSequenceForBenchmark(uint64_t seq_id, int64_t next_pos) {
  if (next_pos < 1) return absl::InvalidArgumentError("next_pos must be positive");
  Release(seq_id);
  Impl& im = *impl_;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(im.device));
  // The pool's own blocks for [0, next_pos) (their records as they are: zero from the start, or
  // whatever an earlier sequence left), compressor states zeroed, indexer keys random.
  const uint64_t ids[] = {seq_id};
  const int64_t ends[] = {next_pos};
  const std::span<const int32_t> tables[] = {{}};
  RETURN_IF_ERROR(im.kv.Check(ids, ends, tables));
  RETURN_IF_ERROR(im.kv.Prepare(seq_id, 0, next_pos, {}, im.stream));
  KvSeq* s = im.kv.Find(seq_id);
  for (KvSeq::Layer& k : s->layers) {
    if (k.comp_state) {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(k.comp_state, 0, k.comp_n * 8, im.stream));
    }
    if (k.index_state) {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(k.index_state, 0, k.index_n * 8, im.stream));
    }
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(im.stream));
  // Each key: key_dim / 2 bytes of two e2m1 codes (any byte is valid), then its ue8m0 scale
  // bytes, 127 (2^0). A block's keys at a time, copied into the token block's keys of the layer
  // (the pool is written by the kernels through KvGeom's address; here by a copy).
  const KvLayout& kvl = im.kv.layout();
  uint8_t* const pool = const_cast<uint8_t*>(im.kv.base());
  std::vector<uint8_t> keys(static_cast<size_t>(kvl.block_tokens / 4 * kvl.key_bytes));
  std::mt19937_64 rng(seq_id * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(next_pos));
  const int64_t token_blocks = (next_pos + kvl.block_tokens - 1) / kvl.block_tokens;
  if (static_cast<int64_t>(s->table.size()) < kvl.window_blocks + token_blocks) {
    return absl::InternalError("FillSequenceForBenchmark: the sequence's table is short");
  }
  for (size_t l = 0; l < kvl.layers.size(); ++l) {
    if (!kvl.layers[l].has_indexer) continue;
    for (int64_t b = 0; b < token_blocks; ++b) {
      for (size_t i = 0; i < keys.size(); ++i) {
        keys[i] = static_cast<int64_t>(i % kvl.key_bytes) < kvl.key_dim / 2
                      ? static_cast<uint8_t>(rng())
                      : 127;
      }
      const int64_t block = s->table[kvl.window_blocks + b];
      CUDA_RETURN_IF_ERROR(cudaMemcpy(pool + block * kvl.block_bytes + kvl.layers[l].key_off,
                                      keys.data(), keys.size(), cudaMemcpyHostToDevice));
    }
  }
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  s->next_pos = next_pos;
  return absl::OkStatus();
}

}  // namespace ss::gpu
