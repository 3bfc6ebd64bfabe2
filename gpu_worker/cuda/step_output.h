// A step's output (ReadStepOutput), after its layers and collectives are enqueued:
//   * the last stage: the logits of every chunk that samples (its last row): the rows' hc streams
//     gathered, HcHead, the final norm and the LM head, read back to out->logits. TP > 1: each
//     rank computes its vocabulary rows [rank·⌈V/TP⌉, ...) (the same computation per row as
//     TP = 1's), gathered with one all-gather (waited for under collective_timeout), so every
//     rank returns every logit;
//   * RunDevice (device_out): out->device_streams, the last HcPost's bf16 streams (or the input's
//     where the stage has no layers), on the device;
//   * otherwise: the fp32 output streams to out->streams, back through the pinned staging (its
//     upload finished before the step's kernels ran), or straight into the output for a long
//     chunk (more than kPinnedStreamsBytes).
// The caller waits for the step's stream afterwards. Returns the first failure.
#pragma once

#include "absl/status/status.h"
#include "gpu_worker/cuda/step.h"

namespace ss::gpu::cuda_backend_internal {

absl::Status ReadStepOutput(StepState& s, StageOutput* out);

}  // namespace ss::gpu::cuda_backend_internal
