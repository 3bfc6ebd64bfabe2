#include "gpu_worker/step_workspace.h"

#include <algorithm>

#include "gpu_worker/kernels/paged_kv_sizes.h"

namespace ss::gpu {
namespace {

// Carves aligned pieces out of one allocation. With a null base it only measures.
class Carver {
 public:
  explicit Carver(char* base) : base_(reinterpret_cast<uintptr_t>(base)) {}
  template <typename T>
  T* Take(int64_t n) {
    T* p = base_ == 0 ? nullptr : reinterpret_cast<T*>(base_ + off_);
    off_ += (static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T) + 255) / 256 * 256;
    return p;
  }
  size_t used() const { return off_; }

 private:
  uintptr_t base_;
  size_t off_ = 0;
};

}  // namespace

size_t CarveStepScratch(const ModelConfig& c, int tp, int64_t T, char* base, StepScratch* s) {
  Carver cv(base);
  const int64_t hc = c.hc_mult, dim = c.dim, H = c.n_heads / tp, Dh = c.head_dim;
  const int64_t rd = c.rope_head_dim, inter = c.moe_inter_dim;
  const int64_t max_in = std::max({dim, c.q_lora_rank, c.o_groups * c.o_lora_rank, inter});
  s->h = cv.Take<cuda::bf16_t>(T * hc * dim);
  s->h2 = cv.Take<cuda::bf16_t>(T * hc * dim);
  s->mid = cv.Take<cuda::bf16_t>(T * hc * dim);
  s->y = cv.Take<cuda::bf16_t>(T * dim);
  s->xn = cv.Take<cuda::bf16_t>(T * dim);
  s->attn = cv.Take<cuda::bf16_t>(T * dim);
  s->moe = cv.Take<cuda::bf16_t>(T * dim);
  s->shared = cv.Take<cuda::bf16_t>(T * dim);
  s->pre = cv.Take<float>(T * hc);
  s->post = cv.Take<float>(T * hc);
  s->comb = cv.Take<float>(T * hc * hc);
  s->qa = cv.Take<cuda::bf16_t>(T * c.q_lora_rank);
  s->qr = cv.Take<cuda::bf16_t>(T * c.q_lora_rank);
  s->q = cv.Take<cuda::bf16_t>(T * H * Dh);
  s->kva = cv.Take<cuda::bf16_t>(T * Dh);
  s->kv = cv.Take<cuda::bf16_t>(T * Dh);
  s->o = cv.Take<cuda::bf16_t>(T * H * Dh);
  s->z = cv.Take<cuda::bf16_t>(T * c.o_groups / tp * c.o_lora_rank);
  const int64_t width = 2 * std::max(Dh, c.index_head_dim);
  s->cv = cv.Take<float>(T * width);
  s->cg = cv.Take<float>(T * width);
  s->icv = cv.Take<float>(T * width);
  s->icg = cv.Take<float>(T * width);
  s->iq = cv.Take<cuda::bf16_t>(T * c.index_n_heads * c.index_head_dim);
  s->proj = cv.Take<float>(T * c.index_n_heads);
  s->iw = cv.Take<cuda::bf16_t>(T * c.index_n_heads);
  s->rlogits = cv.Take<float>(T * c.n_routed_experts);
  s->ridx = cv.Take<int32_t>(T * c.n_activated_experts);
  s->rw = cv.Take<float>(T * c.n_activated_experts);
  s->sg = cv.Take<cuda::bf16_t>(T * inter);
  s->su = cv.Take<cuda::bf16_t>(T * inter);
  s->sa = cv.Take<cuda::bf16_t>(T * inter);
  s->qbuf = cv.Take<cuda::e4m3_t>(T * max_in);
  s->sbuf = cv.Take<float>(T * ((max_in + 127) / 128));
  s->qbuf2 = cv.Take<cuda::e4m3_t>(T * c.q_lora_rank);
  s->sbuf2 = cv.Take<float>(T * ((c.q_lora_rank + 127) / 128));
  s->cos0 = cv.Take<float>(T * rd / 2);
  s->sin0 = cv.Take<float>(T * rd / 2);
  s->cos1 = cv.Take<float>(T * rd / 2);
  s->sin1 = cv.Take<float>(T * rd / 2);
  if (tp > 1) s->part = cv.Take<float>(2 * T * dim);
  s->routed = cv.Take<float>(T * dim);
  s->staging = cv.Take<uint8_t>(T * 2 * Dh);  // ≥ a record of either layout
  s->centries = cv.Take<cuda::bf16_t>(T * Dh);
  s->ckeys = cv.Take<cuda::bf16_t>(T * c.index_head_dim);
  return cv.used();
}

int64_t StepWorkspaceBytes(const ModelConfig& c, int tp, int first_layer, int end_layer,
                           int64_t tokens, int64_t context) {
  const int64_t positions = context > 0 ? context
                                        : (c.max_position_embeddings > 0 ? c.max_position_embeddings
                                                                         : c.yarn.original_seq_len);
  const int64_t T = std::max<int64_t>(tokens, 1), E = std::max(positions, T);
  const int64_t H = c.n_heads / std::max(tp, 1), Dh = c.head_dim;
  StepScratch sc;
  int64_t bytes = static_cast<int64_t>(CarveStepScratch(c, std::max(tp, 1), T, nullptr, &sc));
  // Run's per-step buffers at a chunk ending at E: candidate lists, decoded rows, the indexer's
  // scores and selections, the upload (its fp32 input streams and the plan's tables).
  int64_t max_cand = 1, n_sel = 0;
  for (int l = first_layer; l < end_layer; ++l) {
    const int64_t ratio = l < static_cast<int>(c.compress_ratios.size()) ? c.compress_ratios[l] : 0;
    const bool indexer = ratio == 4;  // the CSA layers (model/weights.cc)
    const int64_t n_comp = indexer ? std::min(c.index_topk, E / 4) : (ratio > 0 ? E / ratio : 0);
    max_cand = std::max(max_cand, std::min(c.window_size, E) + n_comp);
    if (indexer) n_sel = std::min(c.index_topk, E / 4);
  }
  const int64_t attn_rows = std::clamp<int64_t>(
      kAttentionRowsBytes / cuda::KvSparseAttentionRowsBytes(1, max_cand, Dh, 0), 1, T);
  bytes += T * max_cand * 8 + cuda::KvSparseAttentionRowsBytes(attn_rows, max_cand, Dh, H);
  if (n_sel > 0) {
    const int64_t n_cols = (E / 4 + kScoreColumns - 1) / kScoreColumns * kScoreColumns;
    bytes += IndexerScoreRows(T, n_cols, kIndexerScoresBytes) * n_cols * 4 + T * n_sel * 4;
  }
  const int64_t n_layers = std::max(end_layer - first_layer, 0);
  bytes += T * c.hc_mult * c.dim * 4 + n_layers * T * 64 + (int64_t{1} << 20);
  return bytes;
}

}  // namespace ss::gpu
