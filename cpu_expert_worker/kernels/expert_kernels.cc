#include "cpu_expert_worker/kernels/expert_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/codecs.h"
#include "common/status.h"
#include "cpu_expert_worker/kernels/expert_driver.h"

namespace ss::expert {
namespace {

constexpr size_t kAlign = 64;

size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Carves 64-byte aligned pieces off a buffer (or only sizes them, with a null base).
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {
    if (base_ != nullptr) base_ += (kAlign - reinterpret_cast<uintptr_t>(base_) % kAlign) % kAlign;
  }
  template <class T>
  T* Take(size_t count) {
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + at_) : nullptr;
    at_ += AlignUp(count * sizeof(T));
    return p;
  }
  size_t bytes() const { return at_ + kAlign; }  // room to align the caller's pointer

 private:
  char* base_;
  size_t at_ = 0;
};

// The workspace of one gate_up or down call (also the tail of `run`'s).
struct UnitSpace {
  float* g;           // [B, I] w1 outputs
  float* u;           // [B, I] w3 outputs
  float* xf;          // [I] one SwiGLU row
  const float** qp;   // [B] Linear4 activation rows
  const float** sap;  // [B] their scales
  float** yp;         // [B] outputs
  float** yp2;        // [B] the second outputs of a pair of calls
  float* scratch;     // Linear4ScratchFloats(max(dim, I), B)
  UnitSpace(Carver& c, int64_t dim, int64_t I) {
    const size_t B = kMaxUnitRows;
    g = c.Take<float>(B * I);
    u = c.Take<float>(B * I);
    xf = c.Take<float>(I);
    qp = c.Take<const float*>(B);
    sap = c.Take<const float*>(B);
    yp = c.Take<float*>(B);
    yp2 = c.Take<float*>(B);
    scratch = c.Take<float>(internal::Linear4ScratchFloats(std::max(dim, I), B));
  }
};

// `run`'s own pieces, ahead of its UnitSpace.
struct RunSpace {
  float *xq, *xs;             // [T, dim], [T, dim/128]: the quantised x rows
  int32_t *offsets, *cursor;  // [E + 1], [E]
  int32_t* entry_tok;         // [T·k] expert-sorted
  float* entry_w;             // [T·k]
  float *aq, *as;             // [B, I], [B, I/128]: the w2 inputs of one batch
  const float **hq, **hs;     // [B] into aq / as
  float** out_rows;           // [B]
  RunSpace(Carver& c, const ExpertCall& call) {
    const size_t T = call.num_tokens, dim = call.dim, I = call.inter_slice, E = call.num_experts;
    const size_t entries = T * call.top_k, B = kMaxUnitRows;
    xq = c.Take<float>(T * dim);
    xs = c.Take<float>(T * (dim / kActBlock));
    offsets = c.Take<int32_t>(E + 1);
    cursor = c.Take<int32_t>(E);
    entry_tok = c.Take<int32_t>(entries);
    entry_w = c.Take<float>(entries);
    aq = c.Take<float>(B * I);
    as = c.Take<float>(B * (I / kActBlock));
    hq = c.Take<const float*>(B);
    hs = c.Take<const float*>(B);
    out_rows = c.Take<float*>(B);
  }
};

size_t UnitBytes(int64_t dim, int64_t I) {
  Carver c(nullptr);
  UnitSpace unit(c, dim, I);
  return c.bytes();
}

const std::array<float, 256>& E4m3Values() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int i = 0; i < 256; ++i) v[i] = E4m3ToFloat(static_cast<uint8_t>(i));
    return v;
  }();
  return t;
}

// The reference's SwiGLU (ss::model moe.cc): clamp, silu(g)·u, times the routing weight, in
// fp32, rounded to bf16 as the input of w2.
void SwiGlu(const float* g, const float* u, int64_t n, float limit, float weight, float* a) {
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i], ui = u[i];
    if (limit > 0.0f) {
      ui = std::clamp(ui, -limit, limit);
      gi = std::min(gi, limit);
    }
    const float v = gi / (1.0f + std::exp(-gi)) * ui;
    a[i] = RoundBf16(weight * v);
  }
}

// Whether weights in tiles of `tile_rows` rows suit this ISA's kernel (tile_rows != 0).
bool TilesFit(const internal::IsaOps& ops, int64_t tile_rows) {
  return IsWeightTileRows(tile_rows) && (ops.tile_rows == 0 || tile_rows % ops.tile_rows == 0);
}

absl::Status CheckView(const internal::IsaOps& ops, const ExpertSliceView& v, int64_t id,
                       int64_t token, int64_t I) {
  const uint8_t* const ptrs[] = {v.w1, v.w1_scale, v.w3, v.w3_scale, v.w2, v.w2_scale};
  static constexpr const char* kNames[] = {"w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"};
  int nulls = 0;
  for (const uint8_t* p : ptrs) nulls += p == nullptr;
  if (nulls == 6) {
    return absl::NotFoundError(
        absl::StrCat("expert ", id, " (token ", token, ") is not held by this worker"));
  }
  for (int i = 0; i < 6; ++i) {
    if (ptrs[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("expert ", id, ": ", kNames[i], " is null"));
    }
  }
  if (v.w2_stride < I / 2 || v.w2_scale_stride < I / kMxGroup) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert ", id, ": w2 strides (", v.w2_stride, ", ", v.w2_scale_stride,
                     ") are shorter than a slice row (", I / 2, ", ", I / kMxGroup, ")"));
  }
  if (v.tile_rows != 0 && !TilesFit(ops, v.tile_rows)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert ", id, ": weights in tiles of tile_rows ", v.tile_rows, " rows; this kernel reads ",
        "tiles of ", ops.tile_rows, " (tile_rows must be 8 or 16 and a multiple of it)"));
  }
  if (v.tile_rows != 0 && v.w2_stride != I / 2) {
    return absl::InvalidArgumentError(absl::StrCat("expert ", id,
                                                   ": tiled weights need a dense w2 (w2_stride ",
                                                   I / 2, "), not w2_stride ", v.w2_stride));
  }
  return absl::OkStatus();
}

absl::Status ValidateShape(const ExpertCall& c) {
  if (c.dim <= 0 || c.dim % kActBlock != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dim ", c.dim, " is not a positive multiple of ", kActBlock));
  }
  if (c.inter_slice <= 0 || c.inter_slice % kActBlock != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("inter_slice ", c.inter_slice, " is not a positive multiple of ", kActBlock,
                     " (the w2 input's activation blocks must not straddle slices)"));
  }
  if (c.top_k < 1) return absl::InvalidArgumentError(absl::StrCat("top_k ", c.top_k, " < 1"));
  if (c.num_experts < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_experts ", c.num_experts, " < 1"));
  }
  if (!(c.swiglu_limit >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("swiglu_limit ", c.swiglu_limit, " < 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExpertSliceView> SliceExpert(const ExpertMatrices& e, int64_t dim, int64_t inter,
                                            int64_t index, int64_t count) {
  if (count < 1 || index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("slice ", index, " of ", count));
  }
  if (dim <= 0 || dim % kActBlock != 0 || inter <= 0 || inter % count != 0 ||
      (inter / count) % kActBlock != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot cut an expert with dim ", dim, ", I ", inter, " into ", count,
                     " slices whose width is a multiple of ", kActBlock));
  }
  if (!e.w1 || !e.w1_scale || !e.w3 || !e.w3_scale || !e.w2 || !e.w2_scale) {
    return absl::InvalidArgumentError("SliceExpert: null expert matrix");
  }
  const int64_t is = inter / count, r0 = index * is;
  ExpertSliceView v;
  v.w1 = e.w1 + r0 * (dim / 2);
  v.w1_scale = e.w1_scale + r0 * (dim / kMxGroup);
  v.w3 = e.w3 + r0 * (dim / 2);
  v.w3_scale = e.w3_scale + r0 * (dim / kMxGroup);
  v.w2 = e.w2 + r0 / 2;
  v.w2_stride = inter / 2;
  v.w2_scale = e.w2_scale + r0 / kMxGroup;
  v.w2_scale_stride = inter / kMxGroup;
  return v;
}

size_t ExpertWorkspaceBytes(const ExpertCall& call) {
  if (call.num_tokens <= 0 || call.top_k < 1 || call.dim <= 0 || call.inter_slice <= 0 ||
      call.num_experts < 1) {
    return 0;
  }
  Carver c(nullptr);
  RunSpace run(c, call);
  UnitSpace unit(c, call.dim, call.inter_slice);
  return c.bytes();
}

size_t ExpertUnitWorkspaceBytes(int64_t dim, int64_t inter_slice) {
  if (dim <= 0 || inter_slice <= 0) return 0;
  return UnitBytes(dim, inter_slice);
}

void TileWeightRows(uint8_t* dst, const uint8_t* src, int64_t rows, int64_t row_bytes,
                    int64_t src_stride, int64_t tile_rows) {
  constexpr int64_t kLine = 64;
  const int64_t T = tile_rows;
  for (int64_t t = 0; t < rows / T; ++t) {
    for (int64_t kb = 0; kb < row_bytes / kLine; ++kb) {
      for (int64_t j = 0; j < T; ++j) {
        std::memcpy(dst + (t * row_bytes + kb * kLine) * T + j * kLine,
                    src + (t * T + j) * src_stride + kb * kLine, kLine);
      }
    }
  }
}

namespace internal {

const float* E4m3Table() { return E4m3Values().data(); }

void QuantizeActScalar(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                       const float* e4m3) {
  uint8_t block[kActBlock];
  for (int64_t b = 0; b < n; b += kActBlock) {
    uint8_t* cb = codes != nullptr ? codes + b : block;
    QuantizeActE4m3(x + b, kActBlock, kActBlock, cb, scales + b / kActBlock);
    if (q != nullptr) {
      for (int64_t i = 0; i < kActBlock; ++i) q[b + i] = e4m3[cb[i]];
    }
  }
}

void QuantizeBf16Row(const IsaOps& ops, const uint16_t* x, int64_t n, float* q, float* scales) {
  // Block by block: every layout permutes within a 128-block only.
  alignas(kAlign) float xf[kActBlock];
  const float* e4m3 = E4m3Table();
  for (int64_t b = 0; b < n; b += kActBlock) {
    for (int64_t i = 0; i < kActBlock; ++i) xf[i] = Bf16ToFloat(x[b + i]);
    ops.quantize(xf, kActBlock, nullptr, scales + b / kActBlock, q + b, e4m3);
  }
}

namespace {

// gate_up without checks: w1 and w3 rows [col_begin, col_end) for the batch, SwiGLU, quantised.
void GateUpRows(const IsaOps& ops, const GateUpCall& c, const UnitSpace& ws) {
  const ExpertSliceView& v = *c.expert;
  const int64_t n = c.rows, dim = c.dim, c0 = c.col_begin, cols = c.col_end - c.col_begin;
  Linear4Args a;
  a.rows = cols;
  a.k = dim;
  a.n = n;
  a.q = c.xq_rows;
  a.sa = c.xs_rows;
  a.y = ws.yp;
  a.epilogue = Epilogue::kStoreBf16;
  a.scratch = ws.scratch;
  a.w_stride = dim / 2;
  a.w_tile_rows = v.tile_rows;
  a.s_stride = dim / kMxGroup;
  for (int64_t i = 0; i < n; ++i) ws.yp[i] = ws.g + i * cols;
  for (int64_t i = 0; i < n; ++i) ws.yp2[i] = ws.u + i * cols;
  a.w = v.w1 + c0 * a.w_stride;
  a.s = v.w1_scale + c0 * a.s_stride;
  a.next_w = v.w3 + c0 * a.w_stride;  // the w3 rows come next
  a.next_s = v.w3_scale + c0 * a.s_stride;
  a.next_rows = cols;
  Linear4Args b = a;
  b.y = ws.yp2;
  b.w = a.next_w;
  b.s = a.next_s;
  b.next_w = b.next_s = nullptr;
  b.next_rows = 0;
  if (c.next.expert != nullptr) {  // the prefetch runs on into the next call's w1 rows
    const ExpertSliceView& nv = *c.next.expert;
    b.next_w = nv.w1 + c.next.col_begin * a.w_stride;
    b.next_s = nv.w1_scale + c.next.col_begin * a.s_stride;
    b.next_rows = c.next.col_end - c.next.col_begin;
  }
  if (ops.linear4_pair != nullptr) {
    ops.linear4_pair(a, b);
  } else {
    ops.linear4(a);
    ops.linear4(b);
  }
  const float* e4m3 = E4m3Table();
  for (int64_t i = 0; i < n; ++i) {
    SwiGlu(ws.g + i * cols, ws.u + i * cols, cols, c.swiglu_limit, c.weights[i], ws.xf);
    ops.quantize(ws.xf, cols, nullptr, c.hs_rows[i] + c0 / kActBlock, c.hq_rows[i] + c0, e4m3);
  }
}

// down without checks: every group's w2 rows [col_begin, col_end) into the output rows.
void DownRows(const IsaOps& ops, const DownCall& c, const UnitSpace& ws) {
  const int64_t d0 = c.col_begin, rows = c.col_end - c.col_begin, I = c.inter_slice;
  for (int64_t g = 0; g < c.num_groups; ++g) {
    const ExpertSliceView& v = *c.experts[g];
    for (int64_t b0 = c.group_offsets[g]; b0 < c.group_offsets[g + 1]; b0 += kMaxUnitRows) {
      const int64_t b1 = std::min<int64_t>(b0 + kMaxUnitRows, c.group_offsets[g + 1]);
      Linear4Args a;
      a.w = v.w2 + d0 * v.w2_stride;
      a.w_stride = v.w2_stride;
      a.w_tile_rows = v.tile_rows;
      a.s = v.w2_scale + d0 * v.w2_scale_stride;
      a.s_stride = v.w2_scale_stride;
      a.rows = rows;
      a.k = I;
      a.n = b1 - b0;
      a.q = c.hq_rows + b0;
      a.sa = c.hs_rows + b0;
      for (int64_t i = b0; i < b1; ++i) ws.yp[i - b0] = c.out_rows[i] + d0;
      a.y = ws.yp;
      a.epilogue = c.round_expert_outputs ? Epilogue::kAddBf16 : Epilogue::kAddF32;
      a.scratch = ws.scratch;
      // The prefetch runs on into the next group's rows (a later batch of this group reads the
      // same rows again, from cache), after the last group into the caller's next call.
      const bool last = g + 1 == c.num_groups;
      const ExpertSliceView* nv = last ? c.next.expert : c.experts[g + 1];
      if (b1 == c.group_offsets[g + 1] && nv != nullptr && nv->w2_stride == v.w2_stride &&
          nv->w2_scale_stride == v.w2_scale_stride && nv->tile_rows == v.tile_rows) {
        const int64_t n0 = last ? c.next.col_begin : d0;
        a.next_w = nv->w2 + n0 * nv->w2_stride;
        a.next_s = nv->w2_scale + n0 * nv->w2_scale_stride;
        a.next_rows = last ? c.next.col_end - c.next.col_begin : rows;
      }
      ops.linear4(a);
    }
  }
}

// A NextRows hint's columns: within [0, limit), its start a multiple of `align`, and the
// expert in the layout of `v` (tiling; for down also the strides).
absl::Status CheckNext(const NextRows& n, const ExpertSliceView& v, int64_t limit, int64_t align,
                       const char* what) {
  if (n.expert == nullptr) return absl::OkStatus();
  const ExpertSliceView& nv = *n.expert;
  if (n.col_begin < 0 || n.col_begin % align != 0 || n.col_end <= n.col_begin ||
      n.col_end > limit || nv.tile_rows != v.tile_rows || nv.w2_stride != v.w2_stride) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": next-call hint of columns [", n.col_begin, ", ", n.col_end, ") in tiles of ",
        nv.tile_rows, " rows; this call has ", limit, " columns in tiles of ", v.tile_rows));
  }
  return absl::OkStatus();
}

absl::Status CheckUnitWorkspace(const void* workspace, size_t bytes, int64_t dim, int64_t I) {
  if (workspace == nullptr) return absl::InvalidArgumentError("null workspace");
  const size_t need = UnitBytes(dim, I);
  if (bytes < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("workspace of ", bytes, " bytes; this call needs ", need));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GateUp(const IsaOps& ops, const GateUpCall& c, void* workspace,
                    size_t workspace_bytes) {
  if (c.rows < 1 || c.rows > kMaxUnitRows || c.dim <= 0 || c.dim % kActBlock != 0 ||
      c.inter_slice <= 0 || c.inter_slice % kActBlock != 0 || c.col_begin < 0 ||
      c.col_begin % kActBlock != 0 || c.col_end % kActBlock != 0 || c.col_end <= c.col_begin ||
      c.col_end > c.inter_slice || !(c.swiglu_limit >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gate_up: rows ", c.rows, ", dim ", c.dim, ", inter_slice ", c.inter_slice,
                     ", columns [", c.col_begin, ", ", c.col_end, "), limit ", c.swiglu_limit));
  }
  if (!c.expert || !c.xq_rows || !c.xs_rows || !c.weights || !c.hq_rows || !c.hs_rows) {
    return absl::InvalidArgumentError("gate_up: null pointer");
  }
  if (c.expert->tile_rows != 0 && !TilesFit(ops, c.expert->tile_rows)) {
    return absl::InvalidArgumentError(absl::StrCat("gate_up: weights in tiles of ",
                                                   c.expert->tile_rows, " rows; this kernel reads ",
                                                   ops.tile_rows));
  }
  RETURN_IF_ERROR(CheckNext(c.next, *c.expert, c.inter_slice, kActBlock, "gate_up"));
  RETURN_IF_ERROR(CheckUnitWorkspace(workspace, workspace_bytes, c.dim, c.inter_slice));
  Carver carve(workspace);
  GateUpRows(ops, c, UnitSpace(carve, c.dim, c.inter_slice));
  return absl::OkStatus();
}

absl::Status Down(const IsaOps& ops, const DownCall& c, void* workspace, size_t workspace_bytes) {
  if (c.dim <= 0 || c.dim % kActBlock != 0 || c.inter_slice <= 0 ||
      c.inter_slice % kActBlock != 0 || c.col_begin < 0 || c.col_begin % 16 != 0 ||
      c.col_end % 16 != 0 || c.col_end <= c.col_begin || c.col_end > c.dim || c.num_groups < 0) {
    return absl::InvalidArgumentError(absl::StrCat("down: dim ", c.dim, ", inter_slice ",
                                                   c.inter_slice, ", columns [", c.col_begin, ", ",
                                                   c.col_end, "), groups ", c.num_groups));
  }
  if (c.num_groups == 0) return absl::OkStatus();
  if (!c.experts || !c.group_offsets || !c.hq_rows || !c.hs_rows || !c.out_rows) {
    return absl::InvalidArgumentError("down: null pointer");
  }
  for (int64_t g = 0; g < c.num_groups; ++g) {
    const int64_t tr = c.experts[g] != nullptr ? c.experts[g]->tile_rows : 0;
    if (tr != 0 && !TilesFit(ops, tr)) {
      return absl::InvalidArgumentError(absl::StrCat("down: weights in tiles of ", tr,
                                                     " rows; this kernel reads ", ops.tile_rows));
    }
  }
  if (c.experts[c.num_groups - 1] != nullptr) {
    RETURN_IF_ERROR(CheckNext(c.next, *c.experts[c.num_groups - 1], c.dim, 16, "down"));
  }
  RETURN_IF_ERROR(CheckUnitWorkspace(workspace, workspace_bytes, c.dim, c.inter_slice));
  Carver carve(workspace);
  DownRows(ops, c, UnitSpace(carve, c.dim, c.inter_slice));
  return absl::OkStatus();
}

absl::Status RunExperts(const IsaOps& ops, const ExpertCall& c, void* workspace,
                        size_t workspace_bytes) {
  if (c.num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_tokens ", c.num_tokens, " < 0"));
  }
  if (c.num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateShape(c));
  const bool prequantised = c.xq_rows != nullptr;
  if ((!c.x && !prequantised) || !c.expert_ids || !c.expert_weights || !c.experts || !c.out ||
      !workspace || (prequantised && !c.xs_rows)) {
    return absl::InvalidArgumentError(
        "null pointer among x, expert_ids, expert_weights, experts, out, workspace (or xs_rows "
        "with xq_rows)");
  }
  if (prequantised) {
    for (int64_t t = 0; t < c.num_tokens; ++t) {
      if (!c.xq_rows[t] || !c.xs_rows[t] || reinterpret_cast<uintptr_t>(c.xq_rows[t]) % kAlign) {
        return absl::InvalidArgumentError(
            absl::StrCat("pre-quantised row ", t, " is null or not 64-byte aligned"));
      }
    }
  }
  const size_t need = ExpertWorkspaceBytes(c);
  if (workspace_bytes < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("workspace of ", workspace_bytes, " bytes; this call needs ", need));
  }
  const int64_t T = c.num_tokens, dim = c.dim, K = c.top_k, I = c.inter_slice, E = c.num_experts;
  const int64_t nbx = dim / kActBlock, nbi = I / kActBlock;
  Carver carve(workspace);
  const RunSpace rs(carve, c);
  const UnitSpace unit(carve, dim, I);
  int32_t* offsets = rs.offsets;

  // Group (token, choice) pairs by expert, keeping t-major order inside an expert (the order
  // in which the reference adds a token's repeated choices). Ids are checked before any output
  // is written.
  std::fill(offsets, offsets + E + 1, 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t id = c.expert_ids[t * K + j];
      if (id < 0 || id >= E) {
        return absl::InvalidArgumentError(
            absl::StrCat("expert id ", id, " (token ", t, ") is outside [0, ", E, ")"));
      }
      if (offsets[id + 1]++ == 0) RETURN_IF_ERROR(CheckView(ops, c.experts[id], id, t, I));
    }
  }
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::copy(offsets, offsets + E, rs.cursor);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t pos = rs.cursor[c.expert_ids[t * K + j]]++;
      rs.entry_tok[pos] = static_cast<int32_t>(t);
      rs.entry_w[pos] = c.expert_weights[t * K + j];
    }
  }

  if (!prequantised) {
    for (int64_t t = 0; t < T; ++t) {
      QuantizeBf16Row(ops, c.x + t * dim, dim, rs.xq + t * dim, rs.xs + t * nbx);
    }
  }
  std::fill(c.out, c.out + T * dim, 0.0f);

  // Per expert and batch of rows: the gate_up half over every column, then the down half over
  // every output column (what a multi-threaded caller splits, in the same order).
  const float* qrow[kMaxUnitRows];
  const float* srow[kMaxUnitRows];
  float* hq[kMaxUnitRows];
  float* hs[kMaxUnitRows];
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t b0 = offsets[e]; b0 < offsets[e + 1]; b0 += kMaxUnitRows) {
      const int64_t n = std::min<int64_t>(kMaxUnitRows, offsets[e + 1] - b0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = rs.entry_tok[b0 + i];
        qrow[i] = prequantised ? c.xq_rows[t] : rs.xq + t * dim;
        srow[i] = prequantised ? c.xs_rows[t] : rs.xs + t * nbx;
        hq[i] = rs.aq + i * I;
        hs[i] = rs.as + i * nbi;
        rs.hq[i] = hq[i];
        rs.hs[i] = hs[i];
        rs.out_rows[i] = c.out + t * dim;
      }
      GateUpCall gu;
      gu.rows = n;
      gu.dim = dim;
      gu.inter_slice = I;
      gu.col_begin = 0;
      gu.col_end = I;
      gu.expert = &c.experts[e];
      gu.xq_rows = qrow;
      gu.xs_rows = srow;
      gu.weights = rs.entry_w + b0;
      gu.swiglu_limit = c.swiglu_limit;
      gu.hq_rows = hq;
      gu.hs_rows = hs;
      GateUpRows(ops, gu, unit);
      const ExpertSliceView* expert = &c.experts[e];
      const int32_t group[2] = {0, static_cast<int32_t>(n)};
      DownCall dc;
      dc.dim = dim;
      dc.inter_slice = I;
      dc.col_begin = 0;
      dc.col_end = dim;
      dc.num_groups = 1;
      dc.experts = &expert;
      dc.group_offsets = group;
      dc.hq_rows = rs.hq;
      dc.hs_rows = rs.hs;
      dc.out_rows = rs.out_rows;
      dc.round_expert_outputs = c.round_expert_outputs;
      DownRows(ops, dc, unit);
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace ss::expert
