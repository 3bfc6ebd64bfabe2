#include "gpu_worker/cuda/step_output.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "common/status.h"
#include "gpu_worker/kernels/head.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/rms_norm.h"
#include "gpu_worker/nccl_comm.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

// The greedy rows' tokens (StageChunk::greedy) into out->tokens, -1 for the other rows and for
// a row the host sampler must judge (a NaN or +inf logit, or every logit -inf: SampleToken
// refuses those). `shard`: this rank's vocabulary rows of the n sampling rows, [n, vocab_max].
// Each rank's ArgmaxRows record -- per row its maximum, id and nonfinite flag at [0, n),
// [n, 2n), [2n, 3n) of a 3n-float block at `records` -- is all-gathered rank-major under TP
// (into records + 3n) and combined by (larger value, then lower id), so every rank decides the
// same. Waits for the step's stream.
absl::Status GreedyTokens(StepState& s, const std::vector<bool>& greedy, const float* shard,
                          float* records, StageOutput* out) {
  CudaBackend::Impl& im = s.im;
  cudaStream_t st = s.st;
  const int64_t n = static_cast<int64_t>(greedy.size()), tp = im.tp, rec = 3 * n;
  auto* ids = reinterpret_cast<int32_t*>(records + n);
  auto* bad = reinterpret_cast<int32_t*>(records + 2 * n);
  if (im.vocab.size() > 0) {
    CUDA_RETURN_IF_ERROR(cuda::ArgmaxRows(shard, n, im.vocab.size(), im.vocab_max, im.vocab.begin,
                                          ids, records, bad, st));
  } else {  // no rows here: id -1 (and a NaN maximum), finite
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(records, 0xff, 2 * n * 4, st));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(bad, 0, n * 4, st));
  }
  const float* all = records;
  if (tp > 1) {
    RETURN_IF_ERROR(im.comm->AllGather(records, rec, records + rec, st));
    RETURN_IF_ERROR(im.comm->Synchronize(st, s.options.collective_timeout));
    all = records + rec;
  }
  RETURN_IF_ERROR(im.greedy_host.Reserve(tp * rec * 4));
  auto* host = im.greedy_host.as<float>();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, all, tp * rec * 4, cudaMemcpyDeviceToHost, st));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
  out->tokens = CombineGreedyRecords(host, tp, greedy);
  return absl::OkStatus();
}

// The sampling rows' logits to the host, out->logits (TP > 1: the ranks' shards all-gathered,
// then laid out per row). `shard`: as GreedyTokens'; `gathered` has room for [tp, n, vocab_max].
absl::Status CopyLogits(StepState& s, int64_t n, const float* shard, float* gathered,
                        StageOutput* out) {
  CudaBackend::Impl& im = s.im;
  cudaStream_t st = s.st;
  const int64_t V = s.c.vocab_size, vm = im.vocab_max, tp = im.tp;
  const float* all = shard;
  if (tp > 1) {
    RETURN_IF_ERROR(im.comm->AllGather(shard, n * vm, gathered, st));
    RETURN_IF_ERROR(im.comm->Synchronize(st, s.options.collective_timeout));
    all = gathered;
  }
  std::vector<float> lg(tp * n * vm);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(lg.data(), all, lg.size() * 4, cudaMemcpyDeviceToHost, st));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
  out->logits.clear();
  for (int64_t r = 0; r < n; ++r) {
    std::vector<float>& row = out->logits.emplace_back(V);
    for (int64_t q = 0; q < tp; ++q) {
      const int64_t v0 = std::min(V, q * vm), v1 = std::min(V, v0 + vm);
      std::copy_n(lg.begin() + (q * n + r) * vm, v1 - v0, row.begin() + v0);
    }
  }
  return absl::OkStatus();
}

// The sampling rows (the last stage): their hc streams gathered, HcHead, the final norm, this
// rank's LM-head rows; then the greedy rows' tokens, and the logits where a row still needs them.
absl::Status ReadLogits(StepState& s, StageOutput* out) {
  CudaBackend::Impl& im = s.im;
  StepScratch& sc = s.sc;
  const std::vector<int64_t>& row0 = s.plan.row0;
  const int64_t hc = s.hc, dim = s.dim, width = s.width;
  cudaStream_t st = s.st;
  std::vector<int64_t> rows;
  std::vector<bool> greedy;
  for (size_t i = 0; i < s.nc; ++i) {
    if (!s.batch[i].samples) continue;
    rows.push_back(row0[i + 1] - 1);
    greedy.push_back(s.batch[i].greedy);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return absl::OkStatus();
  for (int64_t r = 0; r < n; ++r) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sc.h2 + r * width, sc.h + rows[r] * width, width * 2,
                                         cudaMemcpyDeviceToDevice, st));
  }
  CUDA_RETURN_IF_ERROR(cuda::HcHead({.streams = sc.h2,
                                     .fn = im.hc_head.fn,
                                     .base = im.hc_head.base,
                                     .scale = im.hc_head.scale,
                                     .T = n,
                                     .hc = hc,
                                     .dim = dim,
                                     .hc_eps = s.hc_eps,
                                     .norm_eps = s.eps,
                                     .z = sc.y},
                                    st));
  CUDA_RETURN_IF_ERROR(cuda::RmsNorm(sc.y, im.final_norm, n, dim, s.eps, sc.xn, st));
  // [n, vm] this rank's logits, then (TP > 1) [tp, n, vm] gathered, then the argmax records.
  const int64_t vm = im.vocab_max, tp = im.tp, logit_floats = (tp > 1 ? 1 + tp : 1) * n * vm;
  RETURN_IF_ERROR(im.logits.Reserve((logit_floats + (1 + tp) * 3 * n) * 4));
  float* shard = im.logits.as<float>();
  CUDA_RETURN_IF_ERROR(cuda::LmHead(sc.xn, n, dim, im.head.p, im.vocab.size(), shard, vm, st));
  if (std::find(greedy.begin(), greedy.end(), true) != greedy.end()) {
    RETURN_IF_ERROR(GreedyTokens(s, greedy, shard, shard + logit_floats, out));
    if (std::find(out->tokens.begin(), out->tokens.end(), -1) == out->tokens.end()) {
      out->logits.assign(n, {});
      return absl::OkStatus();
    }
  }
  return CopyLogits(s, n, shard, shard + n * vm, out);
}
}  // namespace

std::vector<int32_t> CombineGreedyRecords(const float* records, int64_t tp,
                                          const std::vector<bool>& greedy) {
  const int64_t n = static_cast<int64_t>(greedy.size()), rec = 3 * n;
  std::vector<int32_t> tokens(n, -1);
  for (int64_t r = 0; r < n; ++r) {
    if (!greedy[r]) continue;
    int32_t bi = -1, any_bad = 0;
    float bv = 0.0f;
    for (int64_t q = 0; q < tp; ++q) {
      const float* block = records + q * rec;
      const float v = block[r];
      const auto id = std::bit_cast<int32_t>(block[n + r]);
      any_bad |= std::bit_cast<int32_t>(block[2 * n + r]);
      if (id >= 0 && (bi < 0 || v > bv || (v == bv && id < bi))) {
        bi = id;
        bv = v;
      }
    }
    if (any_bad == 0 && bi >= 0 && bv != -INFINITY) tokens[r] = bi;
  }
  return tokens;
}

absl::Status ReadStepOutput(StepState& s, StageOutput* out) {
  CudaBackend::Impl& im = s.im;
  StepScratch& sc = s.sc;
  const int64_t T = s.T, width = s.width;
  cudaStream_t st = s.st;
  out->rows = T;
  out->width = width;
  out->streams.clear();
  out->logits.clear();
  out->tokens.clear();
  out->device_streams = nullptr;
  if (s.last) return ReadLogits(s, out);
  if (s.device_out) {
    out->device_streams = sc.h;  // the last HcPost's bf16 streams (or the input's, no layers)
    return absl::OkStatus();
  }
  const size_t streams_bytes = static_cast<size_t>(T * width) * 4;
  if (streams_bytes <= kPinnedStreamsBytes) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(im.up_host.p, sc.sf32, streams_bytes, cudaMemcpyDeviceToHost, st));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
    const float* back = im.up_host.as<float>();
    out->streams.assign(back, back + T * width);
  } else {
    out->streams.resize(T * width);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out->streams.data(), sc.sf32, streams_bytes, cudaMemcpyDeviceToHost, st));
  }
  return absl::OkStatus();
}

}  // namespace ss::gpu::cuda_backend_internal
