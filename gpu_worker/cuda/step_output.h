// A step's output (ReadStepOutput), after its layers and collectives are enqueued:
//   * the last stage: the logits of every chunk that samples (its last row): the rows' hc streams
//     gathered, HcHead, the final norm and the LM head. TP > 1: each rank computes its vocabulary
//     rows [rank·⌈V/TP⌉, ...) (the same computation per row as TP = 1's). Where chunks are
//     `greedy`, their argmax on the device first (per rank, the records all-gathered):
//     out->tokens. Only when a row still needs its logits (not greedy, or non-finite) are they
//     read back to out->logits (TP > 1: gathered with one all-gather, so every rank returns every
//     logit); else out->logits holds empty rows. Collectives are waited for under
//     collective_timeout;
//   * RunDevice (device_out): out->device_streams, the last HcPost's bf16 streams (or the input's
//     where the stage has no layers), on the device;
//   * otherwise: the fp32 output streams to out->streams, back through the pinned staging (its
//     upload finished before the step's kernels ran), or straight into the output for a long
//     chunk (more than kPinnedStreamsBytes).
// The caller waits for the step's stream afterwards. Returns the first failure.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gpu_worker/cuda/step.h"

namespace ss::gpu::cuda_backend_internal {

absl::Status ReadStepOutput(StepState& s, StageOutput* out);

// The greedy rows' tokens from the ranks' argmax records (ReadStepOutput), `tp` blocks of 3n
// floats, rank-major: per row r its maximum at [r], its id (int32 bits, -1: none) at [n + r] and
// its nonfinite flag (int32 bits) at [2n + r], n = greedy.size(). A greedy row gets the id of the
// largest maximum over the ranks (equal maxima: the lower id), or -1 where a rank flagged the row
// or no rank has an id or the maximum is -inf (the host sampler judges those); other rows -1.
std::vector<int32_t> CombineGreedyRecords(const float* records, int64_t tp,
                                          const std::vector<bool>& greedy);

}  // namespace ss::gpu::cuda_backend_internal
