#include "gpu_worker/cuda/step_output.h"

#include <algorithm>
#include <vector>

#include "common/status.h"
#include "gpu_worker/kernels/head.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/rms_norm.h"
#include "gpu_worker/nccl_comm.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

// The logits of the rows that sample (the last stage).
absl::Status ReadLogits(StepState& s, StageOutput* out) {
  CudaBackend::Impl& im = s.im;
  const ModelConfig& c = s.c;
  StepScratch& sc = s.sc;
  const std::vector<int64_t>& row0 = s.plan.row0;
  const int64_t hc = s.hc, dim = s.dim, width = s.width;
  const float eps = s.eps, hc_eps = s.hc_eps;
  cudaStream_t st = s.st;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < s.nc; ++i) {
    if (s.batch[i].samples) rows.push_back(row0[i + 1] - 1);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return absl::OkStatus();
  for (int64_t r = 0; r < n; ++r) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sc.h2 + r * width, sc.h + rows[r] * width, width * 2,
                                         cudaMemcpyDeviceToDevice, st));
  }
  const int64_t V = c.vocab_size;
  CUDA_RETURN_IF_ERROR(cuda::HcHead({.streams = sc.h2,
                                     .fn = im.hc_head.fn,
                                     .base = im.hc_head.base,
                                     .scale = im.hc_head.scale,
                                     .T = n,
                                     .hc = hc,
                                     .dim = dim,
                                     .hc_eps = hc_eps,
                                     .norm_eps = eps,
                                     .z = sc.y},
                                    st));
  CUDA_RETURN_IF_ERROR(cuda::RmsNorm(sc.y, im.final_norm, n, dim, eps, sc.xn, st));
  if (im.tp == 1) {
    RETURN_IF_ERROR(im.logits.Reserve(n * V * 4));
    CUDA_RETURN_IF_ERROR(cuda::LmHead(sc.xn, n, dim, im.head.p, V, im.logits.as<float>(), V, st));
    std::vector<float> lg(n * V);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(lg.data(), im.logits.p, n * V * 4, cudaMemcpyDeviceToHost, st));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
    for (int64_t r = 0; r < n; ++r)
      out->logits.emplace_back(lg.begin() + r * V, lg.begin() + (r + 1) * V);
    return absl::OkStatus();
  }
  // Vocab-parallel: this rank's rows [n, vm] (a shorter last shard leaves its tail unused),
  // gathered rank-major [tp, n, vm], then laid out per row.
  const int64_t vm = im.vocab_max, tp = im.tp;
  RETURN_IF_ERROR(im.logits.Reserve((1 + tp) * n * vm * 4));
  float* shard = im.logits.as<float>();
  float* gathered = shard + n * vm;
  CUDA_RETURN_IF_ERROR(cuda::LmHead(sc.xn, n, dim, im.head.p, im.vocab.size(), shard, vm, st));
  RETURN_IF_ERROR(im.comm->AllGather(shard, n * vm, gathered, st));
  RETURN_IF_ERROR(im.comm->Synchronize(st, s.options.collective_timeout));
  std::vector<float> lg(tp * n * vm);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(lg.data(), gathered, lg.size() * 4, cudaMemcpyDeviceToHost, st));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
  for (int64_t r = 0; r < n; ++r) {
    std::vector<float>& row = out->logits.emplace_back(V);
    for (int64_t q = 0; q < tp; ++q) {
      const int64_t v0 = std::min(V, q * vm), v1 = std::min(V, v0 + vm);
      std::copy_n(lg.begin() + (q * n + r) * vm, v1 - v0, row.begin() + v0);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadStepOutput(StepState& s, StageOutput* out) {
  CudaBackend::Impl& im = s.im;
  StepScratch& sc = s.sc;
  const int64_t T = s.T, width = s.width;
  cudaStream_t st = s.st;
  out->rows = T;
  out->width = width;
  out->streams.clear();
  out->logits.clear();
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
