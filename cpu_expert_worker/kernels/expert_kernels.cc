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

// Token rows per Linear4 pass: bounds the workspace; an expert with more rows streams its
// weights once per batch of this many.
constexpr int64_t kTokenBatch = 64;
constexpr size_t kAlign = 64;

size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Offsets (from the aligned workspace start) of everything a call uses.
struct Layout {
  size_t xq, xs, xf, codes, offsets, cursor, entry_tok, entry_w, g, u, aq, as, qp, sap, yp, scratch,
      total;
};

Layout MakeLayout(const ExpertCall& c) {
  const size_t T = c.num_tokens, dim = c.dim, I = c.inter_slice, E = c.num_experts;
  const size_t entries = T * c.top_k;
  const size_t B = std::min<size_t>(kTokenBatch, entries);
  const size_t kmax = std::max(dim, I);
  Layout l{};
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t off = at;
    at += AlignUp(bytes);
    return off;
  };
  l.xq = take(T * dim * sizeof(float));
  l.xs = take(T * (dim / kActBlock) * sizeof(float));
  l.xf = take(kmax * sizeof(float));
  l.codes = take(kmax);
  l.offsets = take((E + 1) * sizeof(int32_t));
  l.cursor = take(E * sizeof(int32_t));
  l.entry_tok = take(entries * sizeof(int32_t));
  l.entry_w = take(entries * sizeof(float));
  l.g = take(B * I * sizeof(float));
  l.u = take(B * I * sizeof(float));
  l.aq = take(B * I * sizeof(float));
  l.as = take(B * (I / kActBlock) * sizeof(float));
  l.qp = take(B * sizeof(const float*));
  l.sap = take(B * sizeof(const float*));
  l.yp = take(B * sizeof(float*));
  l.scratch = take(internal::Linear4ScratchFloats(kmax, B) * sizeof(float));
  l.total = at + kAlign;  // room to align the caller's pointer
  return l;
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

absl::Status CheckView(const ExpertSliceView& v, int64_t id, int64_t token, int64_t I) {
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
  return MakeLayout(call).total;
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

absl::Status RunExperts(const IsaOps& ops, const ExpertCall& c, void* workspace,
                        size_t workspace_bytes) {
  const Linear4Fn linear4 = ops.linear4;
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
  const Layout l = MakeLayout(c);
  if (workspace_bytes < l.total) {
    return absl::InvalidArgumentError(
        absl::StrCat("workspace of ", workspace_bytes, " bytes; this call needs ", l.total));
  }
  const int64_t T = c.num_tokens, dim = c.dim, K = c.top_k, I = c.inter_slice, E = c.num_experts;
  const int64_t nbx = dim / kActBlock, nbi = I / kActBlock;

  char* base = static_cast<char*>(workspace);
  base += (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  auto at = [base](size_t off) { return base + off; };
  float* xq = reinterpret_cast<float*>(at(l.xq));
  float* xs = reinterpret_cast<float*>(at(l.xs));
  float* xf = reinterpret_cast<float*>(at(l.xf));
  int32_t* offsets = reinterpret_cast<int32_t*>(at(l.offsets));
  int32_t* cursor = reinterpret_cast<int32_t*>(at(l.cursor));
  int32_t* entry_tok = reinterpret_cast<int32_t*>(at(l.entry_tok));
  float* entry_w = reinterpret_cast<float*>(at(l.entry_w));
  float* g = reinterpret_cast<float*>(at(l.g));
  float* u = reinterpret_cast<float*>(at(l.u));
  float* aq = reinterpret_cast<float*>(at(l.aq));
  float* as = reinterpret_cast<float*>(at(l.as));
  const float** qp = reinterpret_cast<const float**>(at(l.qp));
  const float** sap = reinterpret_cast<const float**>(at(l.sap));
  float** yp = reinterpret_cast<float**>(at(l.yp));
  float* scratch = reinterpret_cast<float*>(at(l.scratch));

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
      if (offsets[id + 1]++ == 0) RETURN_IF_ERROR(CheckView(c.experts[id], id, t, I));
    }
  }
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::copy(offsets, offsets + E, cursor);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t pos = cursor[c.expert_ids[t * K + j]]++;
      entry_tok[pos] = static_cast<int32_t>(t);
      entry_w[pos] = c.expert_weights[t * K + j];
    }
  }

  if (!prequantised) {
    for (int64_t t = 0; t < T; ++t) QuantizeBf16Row(ops, c.x + t * dim, dim, xq + t * dim, xs + t * nbx);
  }
  auto x_row = [&](int64_t t) { return prequantised ? c.xq_rows[t] : xq + t * dim; };
  auto x_scales = [&](int64_t t) { return prequantised ? c.xs_rows[t] : xs + t * nbx; };
  std::fill(c.out, c.out + T * dim, 0.0f);

  for (int64_t e = 0; e < E; ++e) {
    const ExpertSliceView& v = c.experts[e];
    for (int64_t b0 = offsets[e]; b0 < offsets[e + 1]; b0 += kTokenBatch) {
      const int64_t n = std::min<int64_t>(kTokenBatch, offsets[e + 1] - b0);
      Linear4Args a;
      a.rows = I;
      a.k = dim;
      a.n = n;
      a.q = qp;
      a.sa = sap;
      a.y = yp;
      a.epilogue = Epilogue::kStoreBf16;
      a.scratch = scratch;
      a.w_stride = dim / 2;
      a.s_stride = dim / kMxGroup;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = entry_tok[b0 + i];
        qp[i] = x_row(t);
        sap[i] = x_scales(t);
        yp[i] = g + i * I;
      }
      a.w = v.w1;
      a.s = v.w1_scale;
      linear4(a);
      for (int64_t i = 0; i < n; ++i) yp[i] = u + i * I;
      a.w = v.w3;
      a.s = v.w3_scale;
      linear4(a);

      for (int64_t i = 0; i < n; ++i) {
        SwiGlu(g + i * I, u + i * I, I, c.swiglu_limit, entry_w[b0 + i], xf);
        ops.quantize(xf, I, nullptr, as + i * nbi, aq + i * I, E4m3Table());
        qp[i] = aq + i * I;
        sap[i] = as + i * nbi;
        yp[i] = c.out + static_cast<int64_t>(entry_tok[b0 + i]) * dim;
      }
      a.w = v.w2;
      a.w_stride = v.w2_stride;
      a.s = v.w2_scale;
      a.s_stride = v.w2_scale_stride;
      a.rows = dim;
      a.k = I;
      a.epilogue = c.round_expert_outputs ? Epilogue::kAddBf16 : Epilogue::kAddF32;
      linear4(a);
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace ss::expert
