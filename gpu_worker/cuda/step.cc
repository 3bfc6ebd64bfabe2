// CudaBackend::RunImpl: one step, its parts in order (step.h), and its one failure clean-up.
#include "gpu_worker/cuda/step.h"

#include <utility>

#include "common/status.h"
#include "gpu_worker/cuda/attention_layer.h"
#include "gpu_worker/cuda/moe_layer.h"
#include "gpu_worker/cuda/step_input.h"
#include "gpu_worker/cuda/step_output.h"
#include "gpu_worker/kernels/elementwise.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/nccl_comm.h"
#include "spdlog/spdlog.h"

namespace ss::gpu {
namespace cuda_backend_internal {
namespace {

// The step after its checks: inputs, layers (launched or under the graph cache), collectives,
// output, the final wait, the routed experts' outcome, timings and the sequences' new positions.
absl::Status RunStep(StepState& s, const float* streams_in, const void* device_in,
                     StageOutput* out) {
  CudaBackend::Impl& im = s.im;
  RETURN_IF_ERROR(PrepareStepInputs(s, streams_in, device_in));
  if (s.marks) RETURN_IF_ERROR(im.marks.Prepare(s.n_layers, s.timings));
  if (s.routed) RETURN_IF_ERROR(im.routed->PrepareStep(s.n_layers, s.T));
  s.streamed =
      s.routed && im.policy != nullptr && im.policy->UseStreamed(s.T, im.routed->HostShare(s.T));
  if (s.streamed) RETURN_IF_ERROR(im.streamed->PrepareStep(s.n_layers, s.T));
  s.defer_comb = cuda::HcPreDefersComb(s.T, s.hc, s.dim, s.sc.y);

  StepGraph graph = StepGraph::kNone;
  if (!im.graph.enabled() || s.streamed) {
    RETURN_IF_ERROR(RunLayers(s));
  } else {
    const int64_t captures = im.graph.captures();
    ASSIGN_OR_RETURN(const bool layers_ran,
                     im.graph.Run(GraphKeyOf(s), s.marks ? 1 : 0, s.st, &s.capturing,
                                  [&] { return RunLayers(s); }));
    // A replay leaves the host's view of the ping-pong stream buffers as the loop would.
    if (!layers_ran && s.n_layers % 2 != 0) std::swap(s.sc.h, s.sc.h2);
    graph = !layers_ran                      ? StepGraph::kReplayed
            : im.graph.captures() > captures ? StepGraph::kCaptured
                                             : StepGraph::kLaunched;
  }
  if (s.timings) s.timings->graph = graph;
  // TP > 1: the step's collectives, waited for once under the deadline (nccl_comm.h "Failure").
  if (im.tp > 1) RETURN_IF_ERROR(im.comm->Synchronize(s.st, s.options.collective_timeout));

  RETURN_IF_ERROR(ReadStepOutput(s, out));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.st));
  if (s.routed) RETURN_IF_ERROR(im.routed->StepStatus(s.n_layers));
  if (s.marks) {
    const RoutedExpertsProvider* routed = s.routed ? im.routed.get() : nullptr;
    im.marks.Fill(
        s.n_layers, im.tp > 1, [&](int l) { return routed ? routed->Seconds(l) : 0.0; }, s.timings);
  }
  if (s.routed) RETURN_IF_ERROR(ObserveRoutedPath(s));
  for (size_t i = 0; i < s.nc; ++i) {
    const std::vector<int64_t>& row0 = s.plan.row0;
    im.kv.Find(s.batch[i].seq_id)->next_pos = s.batch[i].start + (row0[i + 1] - row0[i]);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ObserveRoutedPath(StepState& s) {
  CudaBackend::Impl& im = s.im;
  if (im.policy == nullptr) return absl::OkStatus();
  if (s.streamed) {
    StageTimings t;
    RETURN_IF_ERROR(im.streamed->FillTimings(&t));
    int streamed_layers = 0;
    for (int l = 0; l < s.n_layers; ++l) streamed_layers += im.streamed->streams(l) ? 1 : 0;
    im.policy->ObserveStreamed(s.T, streamed_layers, t.streamed_span_seconds);
    // A streamed step lasts seconds: one line each for the operator (and bench/flash_e2e.sh).
    const double span = t.streamed_span_seconds;
    spdlog::info(
        "streamed step: {} rows, {} layers, {:.2f} GB in {:.3f} s ({:.1f} GB/s of {:.1f} pinned, "
        "copy engine busy {:.0f}%)",
        s.T, streamed_layers, t.streamed_bytes / 1e9, span,
        span > 0 ? t.streamed_bytes / span / 1e9 : 0.0, im.streamed->h2d_bytes_per_second() / 1e9,
        span > 0 ? 100.0 * t.streamed_copy_seconds / span : 0.0);
    if (s.timings) {
      s.timings->experts_streamed = true;
      s.timings->streamed_bytes = t.streamed_bytes;
      s.timings->streamed_copy_seconds = t.streamed_copy_seconds;
      s.timings->streamed_span_seconds = t.streamed_span_seconds;
    }
  }
  // The CPU path's own calls (also a streamed step's layers that cannot stream) feed its rate;
  // not where resident experts took part of the choices (the calls carried fewer).
  const bool whole = im.routed->HostShare(s.T) >= 1.0;
  for (int l = 0; l < s.n_layers && whole; ++l) {
    if (s.streamed && im.streamed->streams(l)) continue;
    const double seconds = im.routed->Seconds(l);
    if (seconds > 0) im.policy->ObserveCpu(s.T, seconds);
  }
  if (s.timings) s.timings->gpu_prefill_threshold = im.policy->Threshold();
  return absl::OkStatus();
}

absl::Status RunLayers(StepState& s) {
  RETURN_IF_ERROR(EnqueueInputStreams(s));
  for (int l = 0; l < s.n_layers; ++l) {
    if (s.marks) CUDA_RETURN_IF_ERROR(s.Mark(l, kLayerStart));
    RETURN_IF_ERROR(LaunchAttentionSublayer(s, l));
    if (s.marks) CUDA_RETURN_IF_ERROR(s.Mark(l, kAttnEnd));
    RETURN_IF_ERROR(LaunchMoeSublayer(s, l));
    std::swap(s.sc.h, s.sc.h2);
    if (s.marks) CUDA_RETURN_IF_ERROR(s.Mark(l, kLayerEnd));
  }
  // The last layer's ring writes; the output streams as fp32 (a middle stage's output; its last
  // layer's HcPost wrote them).
  if (s.n_layers > 0) CUDA_RETURN_IF_ERROR(s.im.branches.Wait(s.st, kBranchKv));
  if (!s.last && s.n_layers == 0) {
    CUDA_RETURN_IF_ERROR(cuda::Bf16ToF32(s.sc.h, s.T * s.width, s.sc.sf32, s.st));
  }
  return absl::OkStatus();
}

absl::Status AllReduceParts(StepState& s, int l, int64_t n, int begin) {
  if (s.marks) RETURN_IF_ERROR(CudaCheck(s.Mark(l, begin), "timing mark"));
  RETURN_IF_ERROR(s.im.comm->AllReduceSum(s.sc.part, n, s.st));
  if (s.marks) RETURN_IF_ERROR(CudaCheck(s.Mark(l, begin + 1), "timing mark"));
  return absl::OkStatus();
}

}  // namespace cuda_backend_internal

absl::Status CudaBackend::RunImpl(std::span<const StageChunk> batch, const float* streams_in,
                                  const void* device_in, bool device_out, StageOutput* out,
                                  StageTimings* timings) {
  RETURN_IF_ERROR(Check(batch));
  Impl& im = *impl_;
  const bool first = options_.stage == 0;
  if (!first && streams_in == nullptr && device_in == nullptr) {
    return absl::InvalidArgumentError("stage > 0 needs the previous stage's streams");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(im.device));
  StepState s(im, *model_, options_, fp64_, batch, timings, device_out);
  const absl::Status e = RunStep(s, streams_in, device_in, out);
  if (e.ok()) return e;
  // The one clean-up of a failed step: its streams waited for, a non-sticky error cleared (it
  // must not fail the next step's first launch), the batch's sequences dropped (backend.h), and
  // the zeroed scratch zeroed again (only completed calls leave it zeroed).
  cudaStreamSynchronize(im.stream);
  cudaStreamSynchronize(im.side);
  if (im.streamed != nullptr) im.streamed->Synchronize();
  im.branches.SynchronizeAll();
  (void)cudaGetLastError();
  for (const StageChunk& ch : batch) Release(ch.seq_id);
  if (im.zeroed.p != nullptr) (void)cudaMemset(im.zeroed.p, 0, im.zeroed.cap);
  return e;
}

}  // namespace ss::gpu
