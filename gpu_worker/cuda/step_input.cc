#include "gpu_worker/cuda/step_input.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_worker/kernels/elementwise.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/indexer_topk.h"
#include "gpu_worker/kernels/paged_kv.h"
#include "gpu_worker/kernels/rope.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

using Impl = CudaBackend::Impl;

// The sequences, the plan, the step's device buffers and its scratch.
absl::Status PlanStepBuffers(StepState& s) {
  Impl& im = s.im;
  const std::span<const StageChunk> batch = s.batch;
  const size_t nc = s.nc;
  cudaStream_t st = s.st;
  // Sequence state: tables (the plan's, or the pool's own blocks), compressor states (start 0
  // resets them; a resume snapshot is copied in).
  for (const StageChunk& ch : batch) {
    std::string error;
    const std::vector<int32_t> table =
        ch.block_table.empty()
            ? std::vector<int32_t>{}
            : im.kv.layout().StageTable(ch.block_table, ch.table_fixed_blocks, &error);
    if (!error.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", ch.seq_id, ": ", error));
    }
    RETURN_IF_ERROR(im.kv.Prepare(ch.seq_id, ch.start,
                                  ch.start + static_cast<int64_t>(ch.tokens.size()), table,
                                  ch.restore_snapshot, st));
  }
  const KvLayout& kvl = im.kv.layout();
  s.seq.resize(nc);
  for (size_t i = 0; i < nc; ++i) s.seq[i] = im.kv.Find(batch[i].seq_id);

  // The step's plan, from sizes, positions and tables alone (cuda_backend_plan.cc).
  s.plan = PlanStep(batch, s.c, im.blocks, kvl, s.seq, im.kv.base(), im.indexer_scores_bytes);
  const StepPlan& plan = s.plan;
  const int64_t T = s.T = plan.T;
  const int64_t Dh = s.Dh, H = s.H;

  // The attention's decoded candidate rows (paged_kv.h), for at most attn_rows tokens per launch
  // (sized by the rows alone: n_heads 0; the decode's split workspace comes on top).
  const int64_t attn_rows = s.attn_rows = std::clamp<int64_t>(
      kAttentionRowsBytes / cuda::KvSparseAttentionRowsBytes(1, plan.max_cand, Dh, 0), 1, T);
  for (auto [buf, bytes] :
       {std::pair{&im.cand, T * plan.max_cand * 8},
        {&im.kvrows, cuda::KvSparseAttentionRowsBytes(attn_rows, plan.max_cand, Dh, H)},
        {&im.scores, plan.scores_cap * 4},
        {&im.sel, plan.sel_base[nc] * 4}}) {
    RETURN_IF_ERROR(buf->Reserve(static_cast<size_t>(bytes)));
  }
  if (im.zeroed.p == nullptr) {
    const size_t bytes = static_cast<size_t>(Impl::kZeroedTopK + cuda::IndexerTopKScratchBytes());
    RETURN_IF_ERROR(im.zeroed.Reserve(bytes));
    if (const cudaError_t e = cudaMemset(im.zeroed.p, 0, bytes); e != cudaSuccess) {
      return CudaStatus(e, "cudaMemset(zeroed scratch)");
    }
  }
  s.hc_sync = T <= Impl::kHcSyncTokens ? im.zeroed.as<uint32_t>() : nullptr;
  s.topk_scratch = im.zeroed.as<char>() + Impl::kZeroedTopK;

  // Scratch and the step's inputs.
  const size_t need = CarveStepScratch(s.c, im.tp, T, nullptr, &s.sc);
  RETURN_IF_ERROR(im.arena.Reserve(need));
  CarveStepScratch(s.c, im.tp, T, im.arena.as<char>(), &s.sc);
  return absl::OkStatus();
}

}  // namespace

absl::Status PrepareStepInputs(StepState& s, const float* streams_in, const void* device_in) {
  RETURN_IF_ERROR(PlanStepBuffers(s));
  Impl& im = s.im;
  StepPlan& plan = s.plan;
  StepScratch& sc = s.sc;
  const KvLayout& kvl = im.kv.layout();
  const int64_t T = s.T, dim = s.dim, width = s.width;
  const bool first = s.first, last = s.last, device_out = s.device_out;
  cudaStream_t st = s.st;
  // The step's one upload (StepPlan), staged in pinned memory with the step's input (see the
  // header).
  const size_t streams_bytes = static_cast<size_t>(T * width) * 4;
  const size_t in_bytes = first ? static_cast<size_t>(T * dim) * 2 : streams_bytes;
  const bool from_device = s.from_device = !first && device_in != nullptr;
  const bool stage_in = !from_device && in_bytes <= kPinnedStreamsBytes;
  // sf32 holds the input, and a middle stage's output streams (fp32) after the last layer.
  const size_t up_bytes = plan.streams_at + streams_bytes;
  const size_t staged_bytes = plan.streams_at + (stage_in ? in_bytes : 0);
  // up_host also takes a non-last stage's output streams back, under the same size rule
  // (step_output.cc).
  const size_t back_bytes =
      !last && !device_out && streams_bytes <= kPinnedStreamsBytes ? streams_bytes : 0;
  RETURN_IF_ERROR(im.params.Reserve(up_bytes));
  RETURN_IF_ERROR(im.up_host.Reserve(std::max(staged_bytes, back_bytes)));
  char* dev_up = im.params.as<char>();
  sc.ids = reinterpret_cast<int64_t*>(dev_up + plan.ids_at);
  sc.pos = sc.ids + T;
  sc.sf32 = reinterpret_cast<float*>(dev_up + plan.streams_at);
  {
    char* u = im.up_host.as<char>();
    plan.FillUpload(u, dev_up, reinterpret_cast<uint64_t>(sc.staging), kvl.record_bytes, s.seq);
    std::vector<uint16_t> rows;  // the embedding rows of an input too long to stage
    const void* from = streams_in;
    if (first) {
      uint16_t* r = reinterpret_cast<uint16_t*>(u + plan.streams_at);
      if (!stage_in) {
        rows.resize(T * dim);
        r = rows.data();
      }
      const uint8_t* table = s.model.weights().embed.data;
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(r + t * dim, table + plan.ids[t] * dim * 2, dim * 2);
      from = r;
    } else if (stage_in) {
      std::memcpy(u + plan.streams_at, streams_in, streams_bytes);
    }
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_up, u, staged_bytes, cudaMemcpyHostToDevice, st));
    if (from_device) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sc.h, device_in, static_cast<size_t>(T * width) * 2,
                                           cudaMemcpyDeviceToDevice, st));
    } else if (!stage_in) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sc.sf32, from, in_bytes, cudaMemcpyHostToDevice, st));
    }
  }
  s.dparams = im.params.as<int64_t>();
  s.dtokens = reinterpret_cast<const cuda::KvToken*>(dev_up + plan.tokens_at);
  s.dtables = reinterpret_cast<const int32_t*>(dev_up + plan.tables_at);
  s.ddst_main = reinterpret_cast<const uint64_t*>(dev_up + plan.dst_at);
  s.ddst_key = s.ddst_main + plan.dst_main.size();
  s.pool = im.kv.base();
  return absl::OkStatus();
}

absl::Status EnqueueInputStreams(StepState& s) {
  const CudaBackend::Impl& im = s.im;
  StepScratch& sc = s.sc;
  const int64_t T = s.T, hc = s.hc, dim = s.dim, width = s.width, rd = s.rd;
  cudaStream_t st = s.st;
  // The step's streams as bf16 (from the uploaded embedding rows or streams; RunDevice's are
  // there already) and its RoPE tables (from the uploaded positions).
  if (s.first) {
    CUDA_RETURN_IF_ERROR(
        cuda::HcEmbedStreams(reinterpret_cast<const cuda::bf16_t*>(sc.sf32), T, hc, dim, sc.h, st));
  } else if (!s.from_device) {
    CUDA_RETURN_IF_ERROR(cuda::RoundF32ToBf16(sc.sf32, T * width, sc.h, st));
  }
  CUDA_RETURN_IF_ERROR(cuda::RopeCosSinPair({.pairs = rd / 2,
                                             .positions = sc.pos,
                                             .n = T,
                                             .t0 = {im.freqs_plain, sc.cos0, sc.sin0},
                                             .t1 = {im.freqs_comp, sc.cos1, sc.sin1}},
                                            st));
  return absl::OkStatus();
}

}  // namespace ss::gpu::cuda_backend_internal
