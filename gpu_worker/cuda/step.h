// One step of the cuda backend (CudaBackend::Run / RunDevice), as the parts that enqueue it:
//   step_input   the sequences' KV set-up, the plan, the scratch and the one upload of the
//                step's inputs; in the layers, the input streams as bf16 and the RoPE tables;
//   RunLayers    per layer: the attention sublayer (attention_layer.h), the MoE sublayer
//                (moe_layer.h), the timing marks (step_timings.h); launched one by one or
//                under the graph cache (graph_cache.h);
//   step_output  the logits (a TP group's vocab-parallel gather), or the streams back to the host,
//                or the device streams.
// StepState is what the parts share: set by the step (step.cc) and the input stage, read by the
// others; sc.h / sc.h2 swap per layer. It lives for one step on the step's thread.
//
// Errors: every part returns the first failure and enqueues nothing more; the step's one
// clean-up (CudaBackend::RunImpl) then waits for its streams and drops the batch's sequences.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "gpu_worker/cuda/cuda_backend_internal.h"
#include "gpu_worker/kernels/paged_kv.h"
#include "gpu_worker/step_workspace.h"

namespace ss::gpu::cuda_backend_internal {

// Streams up to this size go through Impl::up_host (pinned), in and out (step_input, step_output).
inline constexpr size_t kPinnedStreamsBytes = size_t{8} << 20;

struct StepState {
  StepState(CudaBackend::Impl& impl, const model::Model& m, const CudaBackendOptions& o,
            bool fp64_sums, std::span<const StageChunk> chunks, StageTimings* t, bool dev_out)
      : im(impl),
        model(m),
        options(o),
        c(m.config()),
        fp64(fp64_sums),
        batch(chunks),
        timings(t),
        marks(t != nullptr && t->layers),
        first(o.stage == 0),
        last(o.stage == o.num_stages - 1),
        device_out(dev_out),
        routed(!o.exclude_routed_experts),
        n_layers(o.end_layer - o.first_layer),
        nc(chunks.size()),
        st(impl.stream) {}

  // The backend's state and the step's arguments.
  CudaBackend::Impl& im;
  const model::Model& model;
  const CudaBackendOptions& options;
  const ModelConfig& c;
  const bool fp64;  // the reference's double sums in double (fp64_sums.h)
  const std::span<const StageChunk> batch;
  StageTimings* const timings;  // null: the step is not timed
  const bool marks;             // per-layer timing marks (timings->layers)
  const bool first, last;       // the first / last pipeline stage
  const bool device_out;        // RunDevice: the output streams stay on the device
  const bool routed;            // the routed experts run (not exclude_routed_experts)
  const int n_layers;
  const size_t nc;        // chunks
  const cudaStream_t st;  // the step's stream

  // The model's constants, as the launches take them. H, G: this rank's heads and wo_a groups
  // (all of them at TP = 1).
  const int64_t hc = c.hc_mult, dim = c.dim, width = hc * dim;
  const float eps = static_cast<float>(c.norm_eps), hc_eps = static_cast<float>(c.hc_eps);
  const int64_t H = c.n_heads / im.tp, G = c.o_groups / im.tp;
  const int64_t Dh = c.head_dim, qlr = c.q_lora_rank, rd = c.rope_head_dim;
  const int64_t nh = c.index_n_heads, ihd = c.index_head_dim;
  const float scale = static_cast<float>(std::pow(static_cast<double>(Dh), -0.5));
  const float wscale = static_cast<float>(std::pow(static_cast<double>(ihd), -0.5) *
                                          std::pow(static_cast<double>(nh), -0.5));
  const bool rounds = model.options().kv_fp8_sim_rounds;
  const float limit = static_cast<float>(c.swiglu_limit);
  const int64_t K = c.n_activated_experts;
  const float shared_limit = model.options().shared_expert_clamp ? limit : 0.0f;

  // Set by PrepareStepInputs (step_input.h).
  std::vector<const KvSeq*> seq;  // the chunks' sequences
  StepPlan plan;
  int64_t T = 0;
  // The attention's decoded rows are sized for at most attn_rows tokens per launch.
  int64_t attn_rows = 0;
  uint32_t* hc_sync = nullptr;   // HcPreDeferCombNormQuant's counters (zeroed scratch), or null
  void* topk_scratch = nullptr;  // IndexerTopK's (zeroed scratch)
  StepScratch sc;                // the step's scratch, carved from Impl::arena
  bool from_device = false;      // the input streams are on the device (RunDevice)
  // The upload's parts on the device (StepPlan's layout) and the KV pool.
  const int64_t* dparams = nullptr;
  const cuda::KvToken* dtokens = nullptr;
  const int32_t* dtables = nullptr;
  const uint64_t *ddst_main = nullptr, *ddst_key = nullptr;
  const uint8_t* pool = nullptr;
  // In decode HcPre's Sinkhorn runs on a branch (hc_pre.h); set before the layers.
  bool defer_comb = false;
  // Set by the graph cache while the layers run under capture.
  bool capturing = false;
  // The step streams its streamable layers' routed experts (set before the layers; such a step
  // is never captured).
  bool streamed = false;

  // Where layer l's routed experts run in this step.
  RoutedExpertsProvider* Provider(int l) const {
    return streamed && im.streamed->streams(l)
               ? static_cast<RoutedExpertsProvider*>(im.streamed.get())
               : im.routed.get();
  }

  // Timing mark m of layer l on the step's stream (step_timings.h).
  cudaError_t Mark(int l, int m) { return im.marks.Record(l, m, st, capturing); }
};

// The layers' GPU work (step.cc): the input streams' conversion, then per layer the attention and
// MoE sublayers; with graphs captured once per step shape and replayed.
absl::Status RunLayers(StepState& s);

// After the step's final wait: where the routed experts ran, into the timings (when timed) and
// the streamed-prefill policy's rates (the CPU path's per-layer seconds, the streamed span).
absl::Status ObserveRoutedPath(StepState& s);

// TP > 1: sums sc.part[0, n) over the group, between timing marks `begin` and begin + 1 (enqueued
// only: the step waits for its collectives once, under the deadline, after its layers).
absl::Status AllReduceParts(StepState& s, int l, int64_t n, int begin);

}  // namespace ss::gpu::cuda_backend_internal
