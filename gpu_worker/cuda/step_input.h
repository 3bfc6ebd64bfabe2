// A step's inputs (step.h): before the layers, on the host, PrepareStepInputs sets up the chunks'
// sequences in the KV pool (tables, compressor states; a chunk starting at 0 resets them), plans
// the step (StepPlan), sizes its device buffers and carves its scratch, and enqueues its one
// upload: the plan's arrays and the input, staged together in pinned memory (Impl::up_host) so the
// copy is one asynchronous DMA. The input is, at the first stage, the tokens' embedding rows (bf16
// [T, dim], gathered on the host from the checkpoint's table), else the previous stage's fp32
// streams; one of more than kPinnedStreamsBytes (prefill chunks) is copied straight from the
// host's memory instead, which the driver pipelines; streams already on the device (RunDevice,
// `device_in`) are copied to the layers' bf16 input.
//
// EnqueueInputStreams, the layers' first launches (captured with them): the input as the bf16
// streams sc.h, and the RoPE tables of the step's positions.
//
// Both return the first failure; the step's clean-up follows (step.h).
#pragma once

#include "absl/status/status.h"
#include "gpu_worker/cuda/step.h"

namespace ss::gpu::cuda_backend_internal {

absl::Status PrepareStepInputs(StepState& s, const float* streams_in, const void* device_in);
absl::Status EnqueueInputStreams(StepState& s);

}  // namespace ss::gpu::cuda_backend_internal
