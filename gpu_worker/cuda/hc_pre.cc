#include "gpu_worker/cuda/hc_pre.h"

#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/rms_norm.h"

namespace ss::gpu::cuda_backend_internal {

cudaError_t SublayerInput(StepState& s, const cuda::bf16_t* streams, const DevHc& w,
                          const float* g) {
  const ModelConfig& c = s.c;
  StepScratch& sc = s.sc;
  const int64_t T = s.T, hc = s.hc, dim = s.dim;
  const float eps = s.eps, hc_eps = s.hc_eps;
  uint32_t* const hc_sync = s.hc_sync;
  cudaStream_t st = s.st;
  StepBranches& br = s.im.branches;
  const cuda::HcPreParams p = {.streams = streams,
                               .fn = w.fn,
                               .base = w.base,
                               .scale = w.scale,
                               .T = T,
                               .hc = hc,
                               .dim = dim,
                               .sinkhorn_iters = c.hc_sinkhorn_iters,
                               .hc_eps = hc_eps,
                               .norm_eps = eps,
                               .y = sc.y,
                               .pre = sc.pre,
                               .post = sc.post,
                               .comb = sc.comb};
  if (!s.defer_comb) {
    const cudaError_t e = cuda::HcPre(p, st);
    return e == cudaSuccess ? cuda::RmsNormQuant(sc.y, g, T, dim, eps, sc.xn, sc.qbuf, sc.sbuf, st)
                            : e;
  }
  cudaError_t e = cuda::HcPreDeferCombNormQuant(
      p, {.g = g, .rms_eps = eps, .xn = sc.xn, .q = sc.qbuf, .s = sc.sbuf, .sync = hc_sync}, st);
  if (e == cudaSuccess) e = br.Fork(kBranchHc, st);
  if (e == cudaSuccess) {
    e = cuda::HcCombSinkhorn(sc.comb, T, hc, c.hc_sinkhorn_iters, hc_eps, br.stream(kBranchHc));
  }
  if (e == cudaSuccess) e = br.Done(kBranchHc);
  return e;
}

}  // namespace ss::gpu::cuda_backend_internal
