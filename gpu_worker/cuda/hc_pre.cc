#include "gpu_worker/cuda/hc_pre.h"

#include "gpu_worker/kernels/block_kernels.h"
#include "gpu_worker/kernels/kernels.h"

namespace ss::gpu::cuda_backend_internal {

cudaError_t SublayerInput(StepState& s, const uint16_t* streams, const DevHc& w, const float* g) {
  const ModelConfig& c = s.c;
  StepScratch& sc = s.sc;
  const int64_t T = s.T, hc = s.hc, dim = s.dim;
  const float eps = s.eps, hc_eps = s.hc_eps;
  uint32_t* const hc_sync = s.hc_sync;
  cudaStream_t st = s.st;
  StepBranches& br = s.im.branches;
  if (!s.defer_comb) {
    const cudaError_t e =
        cuda::HcPre(streams, w.fn, w.base, w.scale, T, hc, dim, c.hc_sinkhorn_iters, hc_eps, eps,
                    sc.y, sc.pre, sc.post, sc.comb, st);
    return e == cudaSuccess ? cuda::RmsNormQuant(sc.y, g, T, dim, eps, sc.xn, sc.qbuf, sc.sbuf, st)
                            : e;
  }
  cudaError_t e = cuda::HcPreDeferCombNormQuant(
      streams, w.fn, w.base, w.scale, T, hc, dim, c.hc_sinkhorn_iters, hc_eps, eps, sc.y, sc.pre,
      sc.post, sc.comb, g, eps, sc.xn, sc.qbuf, sc.sbuf, hc_sync, st);
  if (e == cudaSuccess) e = br.Fork(kBranchHc, st);
  if (e == cudaSuccess) {
    e = cuda::HcCombSinkhorn(sc.comb, T, hc, c.hc_sinkhorn_iters, hc_eps, br.stream(kBranchHc));
  }
  if (e == cudaSuccess) e = br.Done(kBranchHc);
  return e;
}

}  // namespace ss::gpu::cuda_backend_internal
