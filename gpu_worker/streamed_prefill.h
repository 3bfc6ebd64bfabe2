// When a step's routed experts are streamed to the GPU instead of computed by the CPU expert
// workers (ARCHITECTURE.md "Where the routed experts run"), and what the streamed path costs in
// device memory. Plain C++ (no CUDA), so the memory plan, `--plan`, `splitserve up` and the tests
// use it on any machine.
//
// The rule. For a step of T rows through a stage's n_layers streamable layers:
//   cpu(T)      = T · n_layers · cpu_seconds_per_token_layer
//   streamed(T) = n_layers · max(layer_bytes / h2d_bytes_per_second,
//                                T · gpu_seconds_per_token_layer)
// where layer_bytes are the bytes of one layer's routed experts this rank copies (its slices of
// all E experts). The step streams when streamed(T) < cpu(T), i.e. from the smallest such T on
// (Threshold). Where resident experts (resident_routed_experts.h) would serve a share of the
// step's choices on the GPU, cpu(T) counts only the host's share of them (UseStreamed's
// host_share): with every expert resident a step they serve never streams. The rates are measured,
// never assumed from a GPU or CPU model name: the pinned host-to-device bandwidth at start (on the
// expert store's own registered memory), the CPU expert time per token and layer from the CPU
// path's own prefill calls (an exponential average over calls of at least kMinRowsForCpuRate rows),
// and the GPU's from the streamed path's steps. Until the CPU rate has been measured the prior
// below is used and the log says so. `--gpu-prefill-threshold` overrides the rule: `auto` (the
// rule), `off` (never stream), or N (stream every step of at least N rows).
//
// Threading: StreamedPrefillPolicy is used from the step's thread only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/gpu_prefill_flags.h"
#include "common/model_config.h"

namespace ss::gpu {

// GpuPrefillThreshold, GpuPrefillRing and their parsers (the flags' spellings, which `splitserve
// up` parses too) are in common/gpu_prefill_flags.h; what the ring's auto gives, in
// ring_budget.h.

// Staging ring slots: each holds one group of experts, and the copies run ahead of the compute by
// up to a ring's worth (RingPlan below). At least kGpuPrefillMinRingSlots slots, of about
// kGpuPrefillSlotBytes (common/gpu_prefill_flags.h) each where the ring allows more slots: a
// layer's attention frees no slot, so only a ring of many slots keeps copying through it while its
// groups stay small.
inline constexpr int kGpuPrefillMinRingSlots = 4;
// Calls of fewer rows do not update the CPU rate (decode-sized calls are memory-bound).
inline constexpr int64_t kMinRowsForCpuRate = 64;
// Weight of a new sample in the rates' exponential averages (the first sample replaces the
// prior): rate = w·sample + (1 − w)·rate.
inline constexpr double kRateAverageWeight = 0.25;
// The CPU expert rate assumed before the first measurement: seconds per (token, layer), the
// figure of a 16-core AVX-512 host (bench/RESULTS.md); any measured call replaces it.
inline constexpr double kPriorCpuSecondsPerTokenLayer = 1.0 / 1500.0;

class StreamedPrefillPolicy {
 public:
  struct Rates {
    double h2d_bytes_per_second = 0;         // measured at start; 0: streaming impossible
    double cpu_seconds_per_token_layer = 0;  // 0: use kPriorCpuSecondsPerTokenLayer
    double gpu_seconds_per_token_layer = 0;  // 0: compute assumed hidden by the copies
  };
  // layer_bytes: one layer's routed-expert bytes this rank copies (> 0 where any layer is
  // streamable).
  StreamedPrefillPolicy(GpuPrefillThreshold threshold, int64_t layer_bytes, Rates rates);

  // Whether a step of `rows` rows streams its (streamable) layers' experts. host_share: the share
  // of the step's routed choices the CPU path would compute (resident experts on the GPU take
  // the rest), which scales cpu(T) in the rule; 0 never streams under auto. An explicit
  // threshold (N, off) ignores it.
  bool UseStreamed(int64_t rows, double host_share = 1.0) const;
  // The smallest row count that streams under the current rates, for a step whose choices all
  // go to the CPU path (kOff: INT64_MAX).
  int64_t Threshold() const;
  // A CPU-path call of `rows` rows through one layer took `seconds` (the host call's time).
  void ObserveCpu(int64_t rows, double seconds);
  // A streamed step of `rows` rows through `layers` layers whose layer loop took `seconds`.
  void ObserveStreamed(int64_t rows, int layers, double seconds);
  const Rates& rates() const { return rates_; }
  bool cpu_rate_measured() const { return cpu_measured_; }
  // One line for the start-up log and for every threshold change: the mode, the threshold, the
  // rates and where each came from (measured / prior).
  std::string Describe() const;

 private:
  // The rule's smallest streaming row count at a CPU rate of `cpu` seconds per (token, layer).
  int64_t AutoThreshold(double cpu) const;

  GpuPrefillThreshold threshold_;
  int64_t layer_bytes_ = 0;
  Rates rates_;
  bool cpu_measured_ = false;
};

// Device memory of the streamed path on one GPU worker (the memory plan counts both):
//   the ring: ring_bytes (--gpu-prefill-ring-mib), at least kGpuPrefillMinRingSlots experts' bytes;
//   the workspace of a step of `step_tokens` rows: routing (scratch 64·(E+1) + 8·T·K, three
//   sorted-route arrays of T·K·4 and two offset arrays of (E+1)·4), xq T·dim bf16,
//   h T·K·inter_rank bf16, y T·K·dim fp32, each rounded up to 256 bytes
//   (gpu_worker/kernels/mxfp4_moe.h).
int64_t StreamedMoeWorkspaceBytes(const ModelConfig& model, int64_t step_tokens,
                                  int64_t inter_rank);
// The ring of ring_bytes cut into slots for a layer of `layer_experts` experts of `expert_bytes`
// each: experts_per_slot the largest count that fits slot_bytes (at least 1, at most
// the layer's) and leaves room for kGpuPrefillMinRingSlots slots, then as many slots of that size
// as the ring holds, up to two layers' groups (more would never fill). Both 0 when
// kGpuPrefillMinRingSlots experts do not fit (the streamed path is then off, with that reason
// logged).
struct RingPlan {
  int64_t experts_per_slot = 0;
  int slots = 0;
};
RingPlan PlanRing(int64_t ring_bytes, int64_t expert_bytes, int64_t layer_experts,
                  int64_t slot_bytes = kGpuPrefillSlotBytes);

}  // namespace ss::gpu
