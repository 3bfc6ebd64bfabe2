// The MoE sublayer of stage layer l (LaunchMoeSublayer): HcPre + RmsNorm of sc.mid → on the
// routed experts' side stream the router (GPU) and this rank's routed experts (the backend's
// RoutedExpertsProvider, routed_experts_provider.h; none with exclude_routed_experts), while the
// step's stream runs the shared expert (this rank's slice of its intermediate dimension) → the
// combine, bf16(routed + bf16(shared)), and HcPost into sc.h2 (a middle stage's last layer also
// writes the output streams as fp32, sc.sf32).
//
// TP > 1: the shared expert's fp32 partial and the routed share are laid out [shared | routed] in
// sc.part and summed by ONE all-reduce ([2, T, dim] fp32), so that the combine rounds as the
// reference does (adding them before the collective would drop the shared expert's own bf16
// rounding). Enqueues only (TP > 1: the all-reduce too); returns the first failure.
#pragma once

#include "absl/status/status.h"
#include "gpu_worker/cuda/step.h"

namespace ss::gpu::cuda_backend_internal {

absl::Status LaunchMoeSublayer(StepState& s, int l);

}  // namespace ss::gpu::cuda_backend_internal
