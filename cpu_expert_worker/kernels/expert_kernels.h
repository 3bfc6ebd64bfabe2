// Routed-expert kernels of the CPU expert worker (spec §3.11, §5.2; ARCHITECTURE.md "The MoE
// call"): for T token rows, their top-k expert ids and routing weights, compute the fp32 partial
// MoE sum over the expert SLICES this worker holds.
//
// Slices. Worker i of n holds rows [i·I/n, (i+1)·I/n) of every expert's w1/w3 and the matching
// columns of w2 (I = moe_intermediate_size). An ExpertSliceView points at those bytes either
// straight inside the checkpoint's mmap (w2 rows then have the checkpoint's stride I/2) or inside
// a compact node-local copy (stride I_slice/2); the kernels read nothing else.
//
// Semantics (the reference, `ss::model::RoutedExpert` and `MoeForward`), per expert e in
// ascending id order, for every (token t, k-th choice) with ids[t, k] == e, in t-major order:
//   q, s  = e4m3 activation quantisation of x[t] (1x128 blocks, power-of-two scales)
//   g, u  = bf16(Linear4(q, s; w1_slice)), bf16(Linear4(q, s; w3_slice))      [I_slice]
//           (each output element is complete within the slice, so its rounding is the reference's)
//   g     = min(g, limit); u = clamp(u, -limit, limit)                         (limit 0: no clamp)
//   a     = bf16(weights[t, k] · silu(g) · u)                                  (fp32 math)
//   q', s'= e4m3 quantisation of a in 1x128 blocks (aligned: I_slice % 128 == 0)
//   y     = Linear4(q', s'; w2_slice)   fp32, NOT rounded: it is a partial over I_slice
//   out[t] += round_expert_outputs ? bf16(y) : y                               (fp32)
// where Linear4 forms, per output element and per 32-wide K group, the exact sum of e2m1 × e4m3
// products, rounds it to fp32 once, multiplies by s_act[k/4] and then by the weight scale, and
// accumulates the groups in K order in fp32. The caller sums the workers' partials and rounds
// once. With one slice (n = 1) and round_expert_outputs = true the result is bit-identical to
// the reference's routed sum (before the shared expert is added).
//
// Every ISA variant (see dispatch.h) forms each 32-group's partial as an exact integer sum
// (kernels/linear4.h) and rounds it to fp32 once, where the scalar definition rounds its exact
// double sum, then scales and accumulates groups in the same order: the variants are
// bit-identical to the scalar kernel for all inputs (the payload of a NaN output aside).
//
// Threading: a kernel call is pure apart from writing `out` and the workspace; concurrent calls
// with distinct workspaces and outputs are safe. A worker spreads one call over its cores with
// the two halves of `run` (ExpertKernel::gate_up and ::down below): gate_up for (expert, row
// batch, 128-multiple column range) units writes the w2 input of those columns, down for
// ranges of output columns sums every expert's w2 product in `run`'s order, so any split gives
// exactly `run`'s bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ss::expert {

inline constexpr int64_t kActBlock = 128;  // activation-quantisation block (spec §5.2)
inline constexpr int64_t kMxGroup = 32;    // MXFP4 scale group along K (spec §2.4)

// The bytes of one expert's slice. All six pointers null means "not held by this worker";
// referencing such an expert is an error (NotFound, naming the id). Rows are K-contiguous
// MXFP4: two e2m1 codes per byte, element 2j in the low nibble; one ue8m0 byte per 32 elements.
struct ExpertSliceView {
  const uint8_t* w1 = nullptr;        // [i_slice, dim/2], row r at w1 + r·dim/2
  const uint8_t* w1_scale = nullptr;  // [i_slice, dim/32], row r at w1_scale + r·dim/32
  const uint8_t* w3 = nullptr;        // like w1
  const uint8_t* w3_scale = nullptr;  // like w1_scale
  const uint8_t* w2 = nullptr;        // [dim, i_slice/2], row r at w2 + r·w2_stride
  const uint8_t* w2_scale = nullptr;  // [dim, i_slice/32], row r at w2_scale + r·w2_scale_stride
  int64_t w2_stride = 0;              // bytes, >= i_slice/2 (I/2 inside the checkpoint)
  int64_t w2_scale_stride = 0;        // bytes, >= i_slice/32 (I/32 inside the checkpoint)
  // 0: w1, w3 and w2 rows as above. T = 8 or 16: TILED -- each matrix in tiles of T rows,
  // tile t at t·T·(row bytes), holding K block kb (64 bytes a row) of its T rows at
  // kb·T·64 + j·64: the order a kernel with T-row tiles reads them (ExpertKernel::tile_rows), so
  // a call streams its weights sequentially (16 row-major rows 2 KB apart read slower than one
  // sequential stream: bench/RESULTS.md, "Weights stored in the kernels' reading order").
  // Needs w2_stride = i_slice/2, row counts that are multiples of T, and a
  // kernel whose tile height divides T. Scales stay row-major.
  int64_t tile_rows = 0;
};

// The tile heights ExpertSliceView::tile_rows may take besides 0: 8 and 16.
inline bool IsWeightTileRows(int64_t tile_rows) { return tile_rows == 8 || tile_rows == 16; }

// Copies `rows` (a multiple of tile_rows) MXFP4 rows of `row_bytes` (a multiple of 64) bytes,
// src_stride apart, into dst in the tiled order of ExpertSliceView::tile_rows.
void TileWeightRows(uint8_t* dst, const uint8_t* src, int64_t rows, int64_t row_bytes,
                    int64_t src_stride, int64_t tile_rows);

// A whole expert as the checkpoint stores it: w1/w3 [I, dim/2] + [I, dim/32],
// w2 [dim, I/2] + [dim, I/32], all row-major and dense.
struct ExpertMatrices {
  const uint8_t* w1 = nullptr;
  const uint8_t* w1_scale = nullptr;
  const uint8_t* w3 = nullptr;
  const uint8_t* w3_scale = nullptr;
  const uint8_t* w2 = nullptr;
  const uint8_t* w2_scale = nullptr;
};

// The view of slice `index` of `count` of a whole expert (pointers into `e`, no copy).
// Errors: count < 1, index outside [0, count), I not divisible by count, I/count or dim not a
// multiple of 128, a null pointer.
absl::StatusOr<ExpertSliceView> SliceExpert(const ExpertMatrices& e, int64_t dim, int64_t inter,
                                            int64_t index, int64_t count);

// One call: everything a kernel reads and writes. Pointers are borrowed for the call.
struct ExpertCall {
  int64_t num_tokens = 0;                    // T; 0 is a no-op that touches nothing
  int64_t dim = 0;                           // hidden size; a multiple of 128
  int64_t top_k = 0;                         // experts per token, >= 1
  int64_t inter_slice = 0;                   // I_slice; a multiple of 128
  const uint16_t* x = nullptr;               // [T, dim] bf16 bits
  const int32_t* expert_ids = nullptr;       // [T, top_k]; repeated ids in a row are allowed
  const float* expert_weights = nullptr;     // [T, top_k] routing weights (route_scale applied)
  const ExpertSliceView* experts = nullptr;  // [num_experts], indexed by expert id
  int64_t num_experts = 0;
  float swiglu_limit = 0.0f;  // >= 0; 0 disables the clamp
  // Round each expert's w2 result to bf16 before accumulating (only meaningful with one slice:
  // it reproduces the reference's per-expert bf16 output bit for bit).
  bool round_expert_outputs = false;
  float* out = nullptr;  // [T, dim] fp32, overwritten with the partial sum
  // Optional pre-quantised activations (a caller sharing one quantisation of a token row among
  // many calls). When xq_rows is set, token t's activations are xq_rows[t] (dim floats, 64-byte
  // aligned) with scales xs_rows[t] (dim/128 floats), both as the SAME kernel's quantize_row
  // wrote them from x[t]; x is then not read (may be null). The result is bit-identical to
  // passing x.
  const float* const* xq_rows = nullptr;  // [T]
  const float* const* xs_rows = nullptr;  // [T]
};

// Rows of one gate_up / down kernel call (a larger expert batch is cut into several calls).
inline constexpr int64_t kMaxUnitRows = 64;

// A prefetch hint: where the caller's next call of the same kind (gate_up after gate_up, down
// after down) starts reading, so the weight prefetch runs on into it instead of stopping at the
// end of this call. For gate_up, that call's w1 rows [col_begin, col_end) of its expert; for
// down, its first group's w2 rows [col_begin, col_end). The expert must have this call's
// layout (slice, tiling); expert null: no hint. It changes no result.
struct NextRows {
  const ExpertSliceView* expert = nullptr;
  int64_t col_begin = 0, col_end = 0;
};

// The first half of `run` for one expert, a batch of its rows and a range of its slice's
// intermediate columns: per row i, the w2 input a (see above) for columns [col_begin, col_end),
// quantised like `run` does it, into hq_rows[i] (this kernel's layout, like xq_rows) and
// hs_rows[i] (scales of the range's 128-blocks). Other columns are not touched.
struct GateUpCall {
  int64_t rows = 0;                    // 1..kMaxUnitRows
  int64_t dim = 0;                     // a multiple of 128
  int64_t inter_slice = 0;             // a multiple of 128
  int64_t col_begin = 0, col_end = 0;  // multiples of 128, 0 <= begin < end <= inter_slice
  const ExpertSliceView* expert = nullptr;
  const float* const* xq_rows = nullptr;  // [rows] activations as quantize_row writes them
  const float* const* xs_rows = nullptr;  // [rows]
  const float* weights = nullptr;         // [rows] routing weights
  float swiglu_limit = 0.0f;
  float* const* hq_rows = nullptr;  // [rows] -> inter_slice floats, 64-byte aligned
  float* const* hs_rows = nullptr;  // [rows] -> inter_slice / 128 floats
  NextRows next;                    // optional
};

// The second half of `run` for output columns [col_begin, col_end): for each expert group g in
// the given (ascending id) order and each of its rows i in order,
//   out_rows[i][col_begin, col_end) += (round_expert_outputs ? bf16 : id)(w2 · a_i)
// with a_i = hq_rows[i] / hs_rows[i] as gate_up wrote them (every column of the slice). The
// caller zeroes the columns first.
struct DownCall {
  int64_t dim = 0, inter_slice = 0;
  int64_t col_begin = 0, col_end = 0;  // multiples of 16, 0 <= begin < end <= dim
  int64_t num_groups = 0;
  const ExpertSliceView* const* experts = nullptr;  // [num_groups]
  const int32_t* group_offsets = nullptr;  // [num_groups + 1]: group g has rows [o[g], o[g+1])
  const float* const* hq_rows = nullptr;   // [rows]
  const float* const* hs_rows = nullptr;   // [rows]
  float* const* out_rows = nullptr;        // [rows] -> dim floats (rows may share a token)
  bool round_expert_outputs = false;
  NextRows next;  // optional
};

// Bytes of workspace one gate_up or down call needs (a worker sizes it once).
size_t ExpertUnitWorkspaceBytes(int64_t dim, int64_t inter_slice);

// Bytes of caller-owned workspace a call with these sizes needs (any ISA; kernels align it
// internally). Depends on num_tokens, dim, top_k, inter_slice and num_experts only, so a worker
// sizes it once for its largest batch.
size_t ExpertWorkspaceBytes(const ExpertCall& call);

// A kernel variant. `run` validates the call (shapes, pointers, ids, workspace size) before it
// writes anything, then fills call.out; it never allocates. Errors: InvalidArgument for bad
// shapes, null pointers, ids outside [0, num_experts) or a short workspace; NotFound for an id
// whose slice this worker does not hold.
struct ExpertKernel {
  const char* name;  // "scalar", "avx2", "avx512"
  // The rows of this kernel's weight tiles (AVX-512 16, AVX2 8; scalar 0: it reads any layout):
  // the ExpertSliceView::tile_rows to store weights in, and what a view's tile_rows must be a
  // multiple of (InvalidArgument otherwise).
  int64_t tile_rows;
  absl::Status (*run)(const ExpertCall& call, void* workspace, size_t workspace_bytes);
  // This ISA's activation quantiser: ss::QuantizeActE4m3(x, n, 128, codes, scales), codes and
  // scales bit-identical, for n a multiple of 128 (scales: n/128 floats). Thread-safe.
  void (*quantize_act)(const float* x, int64_t n, uint8_t* codes, float* scales);
  // One bf16 activation row x[0..n) (n a multiple of 128) in the pre-quantised form `run`
  // accepts (ExpertCall::xq_rows): q gets n floats' worth of this kernel's layout (64-byte
  // aligned; kernels/linear4.h), scales n/128. Exactly what `run` computes from x internally.
  // Thread-safe.
  void (*quantize_row)(const uint16_t* x, int64_t n, float* q, float* scales);
  // The two halves of `run` (see GateUpCall, DownCall). They check shapes, pointers and that the
  // views' weight tiling suits this kernel (InvalidArgument), not expert ids or the rest of the
  // views: the caller validated the request. Thread-safe with distinct workspaces and outputs.
  absl::Status (*gate_up)(const GateUpCall& call, void* workspace, size_t workspace_bytes);
  absl::Status (*down)(const DownCall& call, void* workspace, size_t workspace_bytes);
};

}  // namespace ss::expert
