// Internal: the ISA-independent part of every expert kernel (expert_kernels.cc). It validates
// the call, quantises the activations into the layout of the chosen Linear4Rows, groups the
// (token, choice) pairs by expert, and runs w1, w3, the clamped SwiGLU and w2 per expert in
// ascending id order. dispatch.cc binds it to each ISA's Linear4Rows.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "cpu_expert_worker/kernels/expert_kernels.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {

// `groups_per_vector`: the activation layout `linear4` expects (see PermutedIndex).
absl::Status RunExperts(Linear4Fn linear4, int groups_per_vector, const ExpertCall& call,
                        void* workspace, size_t workspace_bytes);

}  // namespace ss::expert::internal
