#include "gpu_worker/cuda/moe_layer.h"

#include "common/status.h"
#include "gpu_worker/cuda/hc_pre.h"
#include "gpu_worker/cuda/linear.h"
#include "gpu_worker/kernels/fp8_linear.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/router.h"
#include "gpu_worker/kernels/swiglu.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

// The router and the routed experts on the side stream, joined back by Impl::routed_back.
absl::Status RouterAndRoutedExperts(StepState& s, int l, const DevBlock& b) {
  CudaBackend::Impl& im = s.im;
  const ModelConfig& c = s.c;
  StepScratch& sc = s.sc;
  const int64_t T = s.T, dim = s.dim, K = s.K;
  cudaStream_t st = s.st;
  // The routed experts on the side stream: the router, then (where they run) the provider's work,
  // ending in the sum's upload, while this stream runs the shared expert.
  CUDA_RETURN_IF_ERROR(cudaEventRecord(im.routed_ready, st));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(im.side, im.routed_ready, 0));
  CUDA_RETURN_IF_ERROR(cuda::Route({.x = sc.xn,
                                    .gate = b.gate.p,
                                    .bias = b.bias,
                                    .tid2eid = b.tid2eid,
                                    .token_ids = sc.ids,
                                    .T = T,
                                    .E = c.n_routed_experts,
                                    .dim = dim,
                                    .k = K,
                                    .route_scale = static_cast<float>(c.route_scale),
                                    .logits = sc.rlogits,
                                    .indices = sc.ridx,
                                    .weights = sc.rw},
                                   im.side));
  if (s.routed) {
    float* dst = im.tp == 1 ? sc.routed : sc.part + T * dim;
    RETURN_IF_ERROR(s.Provider(l)->Enqueue(l, sc.xn, sc.ridx, sc.rw, T, dst, im.side));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(im.routed_back, im.side));
  return absl::OkStatus();
}

// The shared expert (this rank's slice of it) on the step's stream: sc.shared (TP = 1) or the fp32
// partial in sc.part (TP > 1). Nothing where the rank holds none of it.
absl::Status SharedExpert(StepState& s, const DevBlock& b) {
  StepScratch& sc = s.sc;
  const int64_t T = s.T;
  const float shared_limit = s.shared_limit;
  cudaStream_t st = s.st;
  const int64_t si = b.shared_inter;
  if (si > 0) {
    // w1 and w3 in one launch (decode; one each for longer chunks).
    CUDA_RETURN_IF_ERROR(
        cuda::Fp8LinearPair({.q = sc.qbuf,
                             .s_act = sc.sbuf,
                             .rows = T,
                             .in = b.shared_w1.in,
                             .m0 = {b.shared_w1.w, b.shared_w1.s, b.shared_w1.out, sc.sg},
                             .m1 = {b.shared_w3.w, b.shared_w3.s, b.shared_w3.out, sc.su}},
                            st));
    CUDA_RETURN_IF_ERROR(
        cuda::SwiGluBf16Quant(sc.sg, sc.su, si, T, si, shared_limit, sc.sa, sc.qbuf, sc.sbuf, st));
    if (s.im.tp == 1) {
      CUDA_RETURN_IF_ERROR(Gemv8(b.shared_w2, sc.qbuf, sc.sbuf, T, sc.shared, st));
    } else {
      CUDA_RETURN_IF_ERROR(Gemv8(b.shared_w2, sc.qbuf, sc.sbuf, T, sc.part, st));
    }
  }
  return absl::OkStatus();
}

// The combine and the HcPost in one launch, once the routed sum is back (and, in decode, the
// Sinkhorn's branch joined).
absl::Status Combine(StepState& s, int l, const DevBlock& b) {
  CudaBackend::Impl& im = s.im;
  StepScratch& sc = s.sc;
  const int64_t T = s.T, hc = s.hc, dim = s.dim;
  const int64_t si = b.shared_inter;
  const bool last = s.last, host_experts = s.routed;
  const int n_layers = s.n_layers;
  cudaStream_t st = s.st;
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(st, im.routed_back, 0));
  if (s.defer_comb) CUDA_RETURN_IF_ERROR(im.branches.Wait(st, kBranchHc));
  // A middle stage's last layer also writes the output streams as fp32.
  const cuda::HcPostOperands moe_post{cuda::Raw(sc.mid),
                                      sc.post,
                                      sc.comb,
                                      hc,
                                      dim,
                                      cuda::Raw(sc.h2),
                                      !last && l + 1 == n_layers ? sc.sf32 : nullptr};
  if (im.tp == 1) {
    CUDA_RETURN_IF_ERROR(cuda::MoeCombineHcPost(
        si > 0 ? sc.shared : nullptr, host_experts ? sc.routed : nullptr, T, moe_post, st));
  } else {
    // [shared partial | routed share], summed in one collective.
    if (si == 0) CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sc.part, 0, T * dim * 4, st));
    if (!host_experts) CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sc.part + T * dim, 0, T * dim * 4, st));
    RETURN_IF_ERROR(AllReduceParts(s, l, 2 * T * dim, kMoeArBegin));
    CUDA_RETURN_IF_ERROR(cuda::MoeCombineF32HcPost(sc.part, sc.part + T * dim, T, moe_post, st));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchMoeSublayer(StepState& s, int l) {
  const DevBlock& b = s.im.blocks[l];
  CUDA_RETURN_IF_ERROR(SublayerInput(s, s.sc.mid, b.hc_ffn, b.ffn_norm));
  RETURN_IF_ERROR(RouterAndRoutedExperts(s, l, b));
  RETURN_IF_ERROR(SharedExpert(s, b));
  return Combine(s, l, b);
}

}  // namespace ss::gpu::cuda_backend_internal
