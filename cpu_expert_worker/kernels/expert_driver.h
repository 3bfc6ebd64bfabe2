// Internal: the ISA-independent part of every expert kernel (expert_kernels.cc). It validates
// the call, quantises the activations into the layout of the chosen Linear4Rows, groups the
// (token, choice) pairs by expert, and runs w1, w3, the clamped SwiGLU and w2 per expert in
// ascending id order, through the same two halves (gate_up, down) a multi-threaded caller uses.
// dispatch.cc binds it to each ISA's Linear4Rows.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "cpu_expert_worker/kernels/expert_kernels.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {

// One ISA's pieces: its Linear4Rows and the quantiser writing the activation layout it reads.
struct IsaOps {
  Linear4Fn linear4;
  QuantizeActFn quantize;
  int64_t tile_rows;                     // the kernel's weight tile (ExpertKernel::tile_rows)
  Linear4PairFn linear4_pair = nullptr;  // null: two linear4 calls
};

absl::Status RunExperts(const IsaOps& ops, const ExpertCall& call, void* workspace,
                        size_t workspace_bytes);
absl::Status GateUp(const IsaOps& ops, const GateUpCall& call, void* workspace,
                    size_t workspace_bytes);
absl::Status Down(const IsaOps& ops, const DownCall& call, void* workspace, size_t workspace_bytes);

// The scalar QuantizeActFn (ss::QuantizeActE4m3 and a table lookup; natural order).
void QuantizeActScalar(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                       const float* e4m3);

// ss::E4m3ToFloat for all 256 codes.
const float* E4m3Table();

// ExpertKernel::quantize_row for `ops`: bf16 x[0..n) -> q (ops' layout) + scales.
void QuantizeBf16Row(const IsaOps& ops, const uint16_t* x, int64_t n, float* q, float* scales);

}  // namespace ss::expert::internal
