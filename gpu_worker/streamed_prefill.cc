#include "gpu_worker/streamed_prefill.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/int_math.h"

namespace ss::gpu {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// The exponential average of a rate: the first sample replaces the prior.
double Average(double current, bool measured, double sample) {
  return measured ? kRateAverageWeight * sample + (1.0 - kRateAverageWeight) * current : sample;
}

int64_t Aligned(int64_t bytes) { return RoundUp(bytes, int64_t{256}); }

}  // namespace

StreamedPrefillPolicy::StreamedPrefillPolicy(GpuPrefillThreshold threshold, int64_t layer_bytes,
                                             Rates rates)
    : threshold_(threshold), layer_bytes_(layer_bytes), rates_(rates) {
  cpu_measured_ = rates_.cpu_seconds_per_token_layer > 0;
  if (!cpu_measured_) rates_.cpu_seconds_per_token_layer = kPriorCpuSecondsPerTokenLayer;
}

int64_t StreamedPrefillPolicy::Threshold() const {
  switch (threshold_.mode) {
    case GpuPrefillThreshold::Mode::kOff:
      return kNever;
    case GpuPrefillThreshold::Mode::kRows:
      return threshold_.rows;
    case GpuPrefillThreshold::Mode::kAuto:
      break;
  }
  return AutoThreshold(rates_.cpu_seconds_per_token_layer);
}

int64_t StreamedPrefillPolicy::AutoThreshold(double cpu) const {
  if (rates_.h2d_bytes_per_second <= 0 || layer_bytes_ <= 0 || !(cpu > 0)) return kNever;
  // streamed(T) < cpu(T)  <=>  layer_bytes / h2d < T·cpu  and  gpu < cpu.
  if (rates_.gpu_seconds_per_token_layer >= cpu) return kNever;
  const double copy_rows =
      static_cast<double>(layer_bytes_) / rates_.h2d_bytes_per_second / cpu;  // T·cpu = copy
  if (!(copy_rows < 9.0e18)) return kNever;
  return static_cast<int64_t>(std::floor(copy_rows)) + 1;
}

bool StreamedPrefillPolicy::UseStreamed(int64_t rows, double host_share) const {
  if (rows < 1) return false;
  if (threshold_.mode != GpuPrefillThreshold::Mode::kAuto) return rows >= Threshold();
  const double share = std::clamp(host_share, 0.0, 1.0);
  return rows >= AutoThreshold(rates_.cpu_seconds_per_token_layer * share);
}

void StreamedPrefillPolicy::ObserveCpu(int64_t rows, double seconds) {
  if (rows < kMinRowsForCpuRate || !(seconds > 0)) return;
  rates_.cpu_seconds_per_token_layer = Average(rates_.cpu_seconds_per_token_layer, cpu_measured_,
                                               seconds / static_cast<double>(rows));
  cpu_measured_ = true;
}

void StreamedPrefillPolicy::ObserveStreamed(int64_t rows, int layers, double seconds) {
  if (rows < 1 || layers < 1 || !(seconds > 0)) return;
  const double sample = seconds / (static_cast<double>(rows) * layers);
  rates_.gpu_seconds_per_token_layer =
      Average(rates_.gpu_seconds_per_token_layer, rates_.gpu_seconds_per_token_layer > 0, sample);
}

std::string StreamedPrefillPolicy::Describe() const {
  if (threshold_.mode == GpuPrefillThreshold::Mode::kOff) {
    return "gpu prefill threshold off: every step's routed experts run on the CPU expert workers";
  }
  const int64_t t = Threshold();
  const std::string from =
      t == kNever ? std::string("never streams") : absl::StrCat("streams steps of >= ", t, " rows");
  const std::string rates = absl::StrFormat(
      "layer %.3f GB at H2D %.1f GB/s (measured), CPU %.3f ms per token-layer (%s), GPU %s",
      layer_bytes_ / 1e9, rates_.h2d_bytes_per_second / 1e9,
      rates_.cpu_seconds_per_token_layer * 1e3, cpu_measured_ ? "measured" : "prior",
      rates_.gpu_seconds_per_token_layer > 0
          ? absl::StrFormat("%.4f ms per token-layer (measured)",
                            rates_.gpu_seconds_per_token_layer * 1e3)
          : std::string("compute assumed hidden by the copies"));
  if (threshold_.mode == GpuPrefillThreshold::Mode::kRows) {
    return absl::StrCat("gpu prefill threshold ", threshold_.rows,
                        " (--gpu-prefill-threshold): ", from, "; ", rates);
  }
  std::string why;
  if (t == kNever) {
    if (rates_.h2d_bytes_per_second <= 0) {
      why = " (no H2D bandwidth)";
    } else if (layer_bytes_ <= 0) {
      why = " (no streamable layer)";
    } else {
      why = " (the GPU is not faster than the CPU per token)";
    }
  }
  return absl::StrCat("gpu prefill threshold auto: ", from, why, "; ", rates);
}

int64_t StreamedMoeWorkspaceBytes(const ModelConfig& model, int64_t step_tokens,
                                  int64_t inter_rank) {
  const int64_t T = step_tokens, K = model.n_activated_experts, E = model.n_routed_experts;
  const int64_t routes = T * K;
  int64_t bytes = Aligned(64 * (E + 1) + 8 * routes);  // MoeRoutingScratchBytes
  bytes += 3 * Aligned(4 * routes);                    // route_token, route_slot, route_weight
  bytes += 2 * Aligned(4 * (E + 1));                   // offsets, tile_offsets
  bytes += Aligned(T * model.dim * 2);                 // xq bf16
  bytes += Aligned(routes * inter_rank * 2);           // h bf16
  bytes += Aligned(routes * model.dim * 4);            // y fp32
  return bytes;
}

RingPlan PlanRing(int64_t ring_bytes, int64_t expert_bytes, int64_t layer_experts,
                  int64_t slot_bytes) {
  if (ring_bytes <= 0 || expert_bytes <= 0 || layer_experts <= 0) return {};
  const int64_t most = ring_bytes / kGpuPrefillMinRingSlots / expert_bytes;
  if (most < 1) return {};
  const int64_t per_slot =
      std::min({most, layer_experts, std::max<int64_t>(1, slot_bytes / expert_bytes)});
  const int64_t groups = (layer_experts + per_slot - 1) / per_slot;
  const int64_t slots = std::min(ring_bytes / (per_slot * expert_bytes),
                                 std::max<int64_t>(kGpuPrefillMinRingSlots, 2 * groups));
  return {.experts_per_slot = per_slot, .slots = static_cast<int>(slots)};
}

}  // namespace ss::gpu
