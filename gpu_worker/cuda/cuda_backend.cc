#include "gpu_worker/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rope.h"
#include "common/status.h"
#include "common/tensor_parallel.h"
#include "gpu_worker/cuda/cuda_backend_internal.h"
#include "gpu_worker/cuda/host_routed_experts.h"
#include "gpu_worker/cuda/resident_routed_experts.h"
#include "gpu_worker/kernels/kernel_limits.h"
#include "gpu_worker/kernels/prepare.h"
#include "gpu_worker/memory_plan.h"
#include "gpu_worker/nccl_comm.h"
#include "gpu_worker/resident_budget.h"
#include "gpu_worker/ring_budget.h"
#include "gpu_worker/step_workspace.h"
#include "gpu_worker/streamed_prefill.h"
#include "spdlog/spdlog.h"

namespace ss::gpu {

CudaBackend::CudaBackend(std::shared_ptr<const model::Model> model,
                         const CudaBackendOptions& options)
    : model_(std::move(model)), options_(options), impl_(std::make_unique<Impl>()) {}

CudaBackend::~CudaBackend() {
  if (impl_) cudaSetDevice(impl_->device);
}

namespace {

// Where the GPU takes the routed experts from (expert_sources.h): the stage's layers, this rank,
// and the expert stores of o.expert_stores, opened on first use (im.stores).
absl::StatusOr<ExpertSourcesOptions> SourcesOf(const model::Model& model,
                                               const CudaBackendOptions& o, CudaBackend::Impl& im) {
  ExpertSourcesOptions s{o.first_layer, o.end_layer, im.tp, im.rank, nullptr, {}};
  if (o.expert_stores.empty()) return s;
  if (im.stores == nullptr) {
    ASSIGN_OR_RETURN(im.stores, ExpertStoreSet::Open(o.expert_stores, model.config()));
  }
  s.stores = im.stores.get();
  for (const auto& [layer, unused] : o.expert_stores) s.remote_layers.push_back(layer);
  return s;
}

// The terms resident_budget.h and ring_budget.h share, from the device's free memory now: the
// reserve beside the pool (the largest step's workspace and kv_reserve_bytes), the compressor
// states, and the KV pool of K tokens (ResidentKvTokens).
struct DeviceBudget {
  int64_t free_bytes = 0, reserve_bytes = 0, state_bytes = 0, kv_tokens = 0, kv_bytes = 0;
  // A layer without expert stores computes whole experts from the host weights (one part of
  // moe_inter_dim rows), else this rank's share of the slices.
  int64_t inter_rank = 0;
};

absl::StatusOr<DeviceBudget> DeviceBudgetNow(const model::Model& model,
                                             const CudaBackendOptions& o) {
  const ModelConfig& c = model.config();
  ASSIGN_OR_RETURN(const KvLayout layout,
                   KvLayout::Create(c, o.first_layer, o.end_layer, o.kv_block_tokens,
                                    model.options().kv_fp8_sim_rounds));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  DeviceBudget d;
  d.free_bytes = static_cast<int64_t>(free_bytes);
  d.reserve_bytes = StepWorkspaceBytes(c, o.tp_size, o.first_layer, o.end_layer, o.max_step_tokens,
                                       o.max_context) +
                    o.kv_reserve_bytes;
  d.state_bytes = o.kv_sequences * layout.state_floats * 4;
  d.kv_tokens = ResidentKvTokens(c, o.kv_tokens, o.max_context, o.resident_min_kv_tokens);
  d.kv_bytes = layout.PoolBlocks(d.kv_tokens, o.kv_extra_sequences) * layout.block_bytes;
  const bool whole = static_cast<int64_t>(o.expert_stores.size()) < o.end_layer - o.first_layer;
  d.inter_rank = whole ? c.moe_inter_dim : StreamedInterRank(c, o.tp_size);
  return d;
}

// The staging ring's bytes: o.gpu_prefill_ring_bytes, or with o.gpu_prefill_ring_auto the
// budget of ring_budget.h from the device's free memory now (the trunk's weights are on it).
absl::StatusOr<int64_t> RingBytes(const model::Model& model, const CudaBackendOptions& o) {
  if (!o.gpu_prefill_ring_auto) return o.gpu_prefill_ring_bytes;
  ASSIGN_OR_RETURN(const DeviceBudget d, DeviceBudgetNow(model, o));
  bool resident = o.place_resident != nullptr;
  for (const std::vector<int32_t>& l : o.resident_experts) resident = resident || !l.empty();
  RingBudgetInputs in;
  in.free_bytes = d.free_bytes;
  in.reserve_bytes = d.reserve_bytes;
  in.state_bytes = d.state_bytes;
  in.kv_tokens = d.kv_tokens;
  in.kv_bytes = d.kv_bytes;
  in.streamed_workspace_bytes =
      StreamedMoeWorkspaceBytes(model.config(), o.max_step_tokens, d.inter_rank);
  in.resident_experts = resident;
  in.fills_device = o.kv_tokens == 0;
  const RingBudget b = ComputeRingBudget(in);
  spdlog::info("streamed prefill: ring auto on CUDA device {}: {}", o.device, b.Describe());
  return b.ring_bytes;
}

// The streamed path of the routed experts (streamed_routed_experts.h), unless the ring is 0, the
// threshold is off or the routed experts are excluded. Its device memory is allocated here, before
// the KV pool is fitted into what is left. With --gpu_prefill_threshold auto a path that cannot
// be set up is logged and left off; with an explicit N it fails the start.
absl::Status SetUpStreamedPath(const model::Model& model, const CudaBackendOptions& o,
                               CudaBackend::Impl& im) {
  const GpuPrefillThreshold& th = o.gpu_prefill_threshold;
  if ((!o.gpu_prefill_ring_auto && o.gpu_prefill_ring_bytes <= 0) ||
      th.mode == GpuPrefillThreshold::Mode::kOff || o.exclude_routed_experts) {
    spdlog::info("streamed prefill: off (threshold {}, ring {})", th.ToString(),
                 o.gpu_prefill_ring_auto ? std::string("auto") : MiB(o.gpu_prefill_ring_bytes));
    return absl::OkStatus();
  }
  StreamedExpertsOptions so;
  ASSIGN_OR_RETURN(so.ring_bytes, RingBytes(model, o));
  so.slot_bytes = o.gpu_prefill_slot_bytes;
  so.max_rows = o.max_step_tokens;
  absl::StatusOr<ExpertSourcesOptions> sources = SourcesOf(model, o, im);
  absl::Status st = sources.status();
  if (st.ok()) {
    so.sources = *std::move(sources);
    absl::StatusOr<std::unique_ptr<StreamedRoutedExperts>> streamed =
        StreamedRoutedExperts::Create(model, so);
    if (streamed.ok()) {
      im.streamed = std::move(*streamed);
    } else {
      st = streamed.status();
    }
  }
  if (!st.ok()) {
    im.streamed.reset();
    im.stores.reset();
    if (th.mode != GpuPrefillThreshold::Mode::kAuto) return st;
    spdlog::warn("streamed prefill: off: {}", std::string(st.message()));
    return absl::OkStatus();
  }
  im.policy = std::make_unique<StreamedPrefillPolicy>(
      th, im.streamed->layer_bytes(),
      StreamedPrefillPolicy::Rates{.h2d_bytes_per_second = im.streamed->h2d_bytes_per_second()});
  spdlog::info("streamed prefill: {}; {}", im.streamed->Describe(), im.policy->Describe());
  return absl::OkStatus();
}

// The resident experts (o.resident_experts), wrapping the host path; their weights are copied
// before the KV pool is fitted.
absl::Status SetUpResidentExperts(const model::Model& model, const CudaBackendOptions& o,
                                  CudaBackend::Impl& im) {
  bool any = false;
  for (const std::vector<int32_t>& l : o.resident_experts) any = any || !l.empty();
  if (!any || o.exclude_routed_experts) return absl::OkStatus();
  ResidentExpertsOptions ro;
  ASSIGN_OR_RETURN(ro.sources, SourcesOf(model, o, im));
  ro.resident = o.resident_experts;
  ro.max_rows = o.resident_max_rows;
  ro.heat = o.expert_heat;
  ro.rebalance = o.resident_rebalance;
  ASSIGN_OR_RETURN(std::unique_ptr<ResidentRoutedExperts> r,
                   ResidentRoutedExperts::Create(model, ro, std::move(im.routed)));
  spdlog::info("resident experts: {} on CUDA device {} ({}), for steps of up to {} rows",
               r->experts(), o.device, GiB(r->bytes()), o.resident_max_rows);
  im.routed = std::move(r);
  return absl::OkStatus();
}

// --gpu_experts auto (o.place_resident): the budget of resident_budget.h from the device's free
// memory now (the trunk's weights and the streamed path are on it) and the KV pool's cost model,
// then the sets place_resident gives for it, into o.resident_experts.
absl::Status PlaceResidentAuto(const model::Model& model, CudaBackendOptions& o) {
  if (!o.place_resident) return absl::OkStatus();
  o.resident_experts.clear();
  if (o.exclude_routed_experts) return absl::OkStatus();
  const ModelConfig& c = model.config();
  ASSIGN_OR_RETURN(const DeviceBudget d, DeviceBudgetNow(model, o));
  ResidentBudgetInputs in;
  in.free_bytes = d.free_bytes;
  in.reserve_bytes = d.reserve_bytes;
  in.state_bytes = d.state_bytes;
  in.kv_tokens = d.kv_tokens;
  in.kv_bytes = d.kv_bytes;
  in.expert_bytes = ResidentExpertBytesPerRank(c, o.tp_size);
  in.workspace_bytes = ResidentWorkspaceBytes(c, o.resident_max_rows, d.inter_rank) +
                       kRebalanceSwaps * in.expert_bytes;  // the rebalance's staging buffer
  in.max_experts = int64_t{o.end_layer - o.first_layer} * c.n_routed_experts;
  const ResidentBudget budget = ComputeResidentBudget(in);
  spdlog::info("resident experts auto on CUDA device {}: {}", o.device, budget.Describe());
  if (budget.experts == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(o.resident_experts, o.place_resident(budget.experts));
  return absl::OkStatus();
}

}  // namespace

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
    RETURN_IF_ERROR(CheckTensorParallelSplit(c, tp));
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
  if (o.indexer_scores_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("indexer_scores_bytes ", o.indexer_scores_bytes, " must be at least 1"));
  }
  im.indexer_scores_bytes = o.indexer_scores_bytes;
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
  RETURN_IF_ERROR(im.branches.Create(least, greatest));
  im.routed = std::make_unique<HostRoutedExperts>(*b->model_, b->options_.experts, o.first_layer,
                                                  tp, o.tp_rank);
  const model::ModelWeights& w = b->model_->weights();
  const StageLayout stage{o.first_layer, o.end_layer, tp, o.stage == 0, o.stage == o.num_stages - 1,
                          false};
  im.load_progress = std::make_unique<LoadProgress>(
      absl::StrCat("loading weights to CUDA device ", o.device), StageWeightBytes(c, stage));
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
  RETURN_IF_ERROR(SetUpStreamedPath(*b->model_, o, im));
  RETURN_IF_ERROR(PlaceResidentAuto(*b->model_, b->options_));
  RETURN_IF_ERROR(SetUpResidentExperts(*b->model_, b->options_, im));
  ASSIGN_OR_RETURN(im.freqs_plain, im.F32(LayerRopeFrequencies(c, 0)));
  ASSIGN_OR_RETURN(im.freqs_comp, im.F32(LayerRopeFrequencies(c, 4)));
  im.load_progress->Done();
  im.load_progress.reset();
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
  // A resumed sequence's token blocks below its resume position are the prefix cache's.
  for (const auto& [id, s] : impl_->kv.seqs()) u.used_tokens += s.next_pos - s.resumed;
  return u;
}

absl::Status CudaBackend::SaveSnapshot(uint64_t seq_id, int64_t position, uint64_t snapshot_id,
                                       std::span<const int32_t> blocks) {
  (void)snapshot_id;  // the blocks are the snapshot's name here
  Impl& im = *impl_;
  const KvSeq* s = im.kv.Find(seq_id);
  const int64_t B = im.kv.layout().block_tokens;
  const std::string what = absl::StrCat("snapshot of sequence ", seq_id, " at ", position);
  if (s == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": this worker holds no such sequence"));
  }
  if (position != s->next_pos || position <= 0 || position % B != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the position must be the sequence's next one (", s->next_pos,
                     ") and a positive multiple of the KV block size ", B));
  }
  if (!s->external) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": the sequence's blocks are the pool's own (no step-plan block tables), whose "
        "allocator may hand out the snapshot's blocks"));
  }
  RETURN_IF_ERROR(im.kv.CheckSnapshot(blocks, what));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(im.device));
  return im.kv.SaveSnapshot(*s, blocks, im.stream);
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
  const int64_t B = impl_->kv.layout().block_tokens;
  for (const StageChunk& ch : batch) {
    if (ch.restore_snapshot.empty()) continue;
    const std::string what = absl::StrCat("sequence ", ch.seq_id, " resuming at ", ch.start);
    if (ch.start % B != 0 || ch.block_table.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a resume position must be a multiple of the KV block size ", B,
                       " and the chunk must bring the step plan's block table"));
    }
    RETURN_IF_ERROR(impl_->kv.CheckSnapshot(ch.restore_snapshot, what));
  }
  std::vector<uint64_t> ids;
  std::vector<int64_t> ends;
  std::vector<std::vector<int32_t>> stage_tables;
  std::vector<std::span<const int32_t>> tables;
  stage_tables.reserve(batch.size());
  for (const StageChunk& ch : batch) {
    ids.push_back(ch.seq_id);
    ends.push_back(ch.start + static_cast<int64_t>(ch.tokens.size()));
    std::string error;
    stage_tables.push_back(
        ch.block_table.empty()
            ? std::vector<int32_t>{}
            : impl_->kv.layout().StageTable(ch.block_table, ch.table_fixed_blocks, &error));
    if (!error.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", ch.seq_id, ": ", error));
    }
    tables.push_back(stage_tables.back());
  }
  return impl_->kv.Check(ids, ends, tables);
}

absl::Status CudaBackend::Run(std::span<const StageChunk> batch, const float* streams_in,
                              StageOutput* out, StageTimings* timings) {
  return RunImpl(batch, streams_in, nullptr, false, out, timings);
}

absl::Status CudaBackend::RunDevice(std::span<const StageChunk> batch, const void* streams_in,
                                    StageOutput* out, StageTimings* timings) {
  return RunImpl(batch, nullptr, streams_in, true, out, timings);
}

void CudaBackend::set_decode_graphs(bool on) { impl_->graph.set_enabled(on); }
int64_t CudaBackend::graph_captures() const { return impl_->graph.captures(); }
int64_t CudaBackend::graph_replays() const { return impl_->graph.replays(); }

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
  RETURN_IF_ERROR(im.kv.Prepare(seq_id, 0, next_pos, {}, {}, im.stream));
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
