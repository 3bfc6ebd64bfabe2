// The host side of a cuda backend step (cuda_backend_internal.h StepPlan): from the batch's sizes,
// positions and block tables alone, what the step's launches take, and its one upload.
#include <algorithm>
#include <cstring>

#include "gpu_worker/cuda/cuda_backend_internal.h"

namespace ss::gpu::cuda_backend_internal {

namespace {

// A decode step's size rounded up (kDecodeSizeStep); any other step's as it is.
int64_t DecodeSize(const StepPlan& p, int64_t n) {
  return p.index_one_launch ? (n + kDecodeSizeStep - 1) / kDecodeSizeStep * kDecodeSizeStep : n;
}

}  // namespace

StepPlan PlanStep(std::span<const StageChunk> batch, const ModelConfig& c,
                  std::span<const DevBlock> blocks, const KvLayout& kvl,
                  std::span<const KvSeq* const> seq, const uint8_t* pool,
                  int64_t indexer_scores_bytes) {
  StepPlan p;
  const size_t nc = batch.size();
  const int64_t n_layers = static_cast<int64_t>(blocks.size());
  const int64_t W = c.window_size, B = kvl.block_tokens;
  p.row0.assign(nc + 1, 0);
  for (size_t i = 0; i < nc; ++i) {
    const StageChunk& ch = batch[i];
    const int64_t S = static_cast<int64_t>(ch.tokens.size());
    p.row0[i + 1] = p.row0[i] + S;
    p.max_rows = std::max(p.max_rows, S);
    for (int64_t t = 0; t < S; ++t) {
      p.ids.push_back(ch.tokens[t]);
      p.pos.push_back(ch.start + t);
    }
  }
  const int64_t T = p.T = p.row0[nc];

  // Per chunk the indexer's selection count (the same in every CSA layer) and where its
  // selections go. The indexer's score rows have n_cols columns: the chunk's end / 4 keys rounded
  // up to kScoreColumns (the columns past a token's eligible keys score −inf and are never
  // selected while k ≤ its eligible keys, so the selections are the same), which keeps a decode
  // step's launches the same for kScoreColumns · 4 positions (one CUDA graph).
  p.n_sel.assign(nc, 0);
  p.sel_base.assign(nc + 1, 0);
  p.n_cols.assign(nc, 0);
  p.index_one_launch = T <= kIndexerOneLaunchTokens;
  for (size_t i = 0; i < nc; ++i) {
    const int64_t S = p.row0[i + 1] - p.row0[i], end = batch[i].start + S;
    p.n_sel[i] = std::min(c.index_topk, end / 4);
    p.n_cols[i] = (end / 4 + kScoreColumns - 1) / kScoreColumns * kScoreColumns;
    p.index_cols = std::max(p.index_cols, p.n_cols[i]);
    p.index_k = std::max(p.index_k, p.n_sel[i]);
  }
  p.index_k = std::min(DecodeSize(p, p.index_k), p.index_cols);  // n_cols[i] >= n_sel[i]
  p.score_rows.assign(nc, 0);
  for (size_t i = 0; i < nc; ++i) {
    const int64_t S = p.row0[i + 1] - p.row0[i];
    p.sel_base[i + 1] = p.sel_base[i] + S * (p.index_one_launch ? p.index_k : p.n_sel[i]);
    p.score_rows[i] = IndexerScoreRows(S, p.n_cols[i], indexer_scores_bytes);
    p.scores_cap = p.index_one_launch ? T * p.index_cols
                                      : std::max(p.scores_cap, p.score_rows[i] * p.n_cols[i]);
  }
  // The batch's tables, uploaded with the step (offsets in int32s from their start).
  p.table_off.assign(nc + 1, 0);
  for (size_t i = 0; i < nc; ++i) {
    p.table_off[i + 1] = p.table_off[i] + static_cast<int64_t>(seq[i]->table.size());
  }
  p.table_cap = DecodeSize(p, p.table_off[nc]);
  // Per (layer, token) a KvToken; per layer the longest candidate list.
  p.tokens.assign(static_cast<size_t>(n_layers * T), cuda::KvToken{});
  p.n_cand.assign(n_layers, 1);
  for (int64_t l = 0; l < n_layers; ++l) {
    const DevBlock& b = blocks[l];
    for (size_t i = 0; i < nc; ++i) {
      const int64_t S = p.row0[i + 1] - p.row0[i], start = batch[i].start, end = start + S;
      const int64_t win_width = start == 0 ? std::min(S, W) : W;
      const int64_t n_comp = b.has_indexer ? p.n_sel[i] : (b.ratio > 0 ? end / b.ratio : 0);
      p.n_cand[l] = std::max(p.n_cand[l], win_width + n_comp);
      for (int64_t s = 0; s < S; ++s) {
        cuda::KvToken& d = p.tokens[l * T + p.row0[i] + s];
        d.n_table = static_cast<int32_t>(seq[i]->table.size());
        d.pos = static_cast<int32_t>(start + s);
        d.chunk_start = static_cast<int32_t>(start);
        d.chunk_end = static_cast<int32_t>(end);
        d.win_width = static_cast<int32_t>(win_width);
        d.n_comp = static_cast<int32_t>(n_comp);
        d.sel_off = b.has_indexer && p.n_sel[i] > 0
                        ? static_cast<int32_t>(p.sel_base[i] +
                                               s * (p.index_one_launch ? p.index_k : p.n_sel[i]))
                        : -1;
      }
    }
  }
  for (int64_t& n : p.n_cand) n = DecodeSize(p, n);
  p.max_cand = *std::max_element(p.n_cand.begin(), p.n_cand.end());
  // Per (layer, chunk): the scratch row of the chunk's first new compressed entry (ebase), and per
  // layer the record / key address of every scratch row (0: unused), for the encoders.
  p.ebase.assign(static_cast<size_t>(n_layers) * nc, 0);
  p.dst_main.assign(static_cast<size_t>(n_layers * T), 0);
  p.dst_key.assign(static_cast<size_t>(n_layers * T), 0);
  for (int64_t l = 0; l < n_layers; ++l) {
    const int64_t m = blocks[l].ratio;
    if (m == 0) continue;
    const KvLayout::Layer& y = kvl.layers[l];
    int64_t row = 0;
    for (size_t i = 0; i < nc; ++i) {
      p.ebase[l * nc + i] = row;
      const int64_t start = batch[i].start, end = start + (p.row0[i + 1] - p.row0[i]);
      const std::vector<int32_t>& tb = seq[i]->table;
      for (int64_t e = start / m; e < end / m; ++e, ++row) {
        const int64_t blk = tb[kvl.window_blocks + e / (B / m)];
        p.dst_main[l * T + row] = reinterpret_cast<uint64_t>(pool) + blk * kvl.block_bytes +
                                  y.main_off + (e % (B / m)) * kvl.record_bytes;
        if (y.has_indexer) {
          p.dst_key[l * T + row] = reinterpret_cast<uint64_t>(pool) + blk * kvl.block_bytes +
                                   y.key_off + (e % (B / 4)) * kvl.key_bytes;
        }
      }
      row = std::max(row, p.ebase[l * nc + i] + (end - start) / m + 1);  // the compressor's max_new
    }
  }
  // Compressor parameters of every (layer, kind: main, indexer): CompressorBatch's device arrays
  // over the batch's chunks, [start | row_begin (nc + 1) | entry_begin | kv_state | score_state],
  // so each compressor runs once per layer for the whole batch (one sequence per grid row).
  p.cb_stride = 5 * nc + 1;
  p.params.assign(static_cast<size_t>(n_layers) * 2 * p.cb_stride, 0);
  for (int64_t l = 0; l < n_layers; ++l) {
    for (int kind = 0; kind < 2; ++kind) {
      int64_t* a = p.params.data() + (l * 2 + kind) * p.cb_stride;
      for (size_t i = 0; i < nc; ++i) {
        const KvSeq::Layer& k = seq[i]->layers[l];
        float* base = kind == 0 ? k.comp_state : k.index_state;
        const int64_t half = kind == 0 ? k.comp_n : k.index_n;
        a[i] = batch[i].start;
        a[nc + i] = p.row0[i];
        a[2 * nc + 1 + i] = blocks[l].ratio > 0 ? p.ebase[l * nc + i] : 0;
        a[3 * nc + 1 + i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(base));
        a[4 * nc + 1 + i] =
            static_cast<int64_t>(reinterpret_cast<uintptr_t>(base ? base + half : nullptr));
      }
      a[2 * nc] = p.row0[nc];
    }
  }
  // The upload's layout.
  p.tokens_at = p.params.size() * sizeof(int64_t);
  p.tables_at = p.tokens_at + p.tokens.size() * sizeof(cuda::KvToken);
  p.dst_at = p.tables_at + (p.table_cap * 4 + 7) / 8 * 8;
  p.ids_at = p.dst_at + 2 * p.dst_main.size() * 8;
  p.streams_at = (p.ids_at + 2 * T * 8 + 255) / 256 * 256;
  return p;
}

void StepPlan::FillUpload(char* host, const char* dev, uint64_t staging, int64_t record_bytes,
                          std::span<const KvSeq* const> seq) {
  const size_t nc = seq.size();
  const int32_t* dtables = reinterpret_cast<const int32_t*>(dev + tables_at);
  const int64_t n_layers = T > 0 ? static_cast<int64_t>(tokens.size()) / T : 0;
  for (int64_t l = 0; l < n_layers; ++l) {
    for (size_t i = 0; i < nc; ++i) {
      for (int64_t t = row0[i]; t < row0[i + 1]; ++t) {
        tokens[l * T + t].table = reinterpret_cast<uint64_t>(dtables + table_off[i]);
        tokens[l * T + t].staging = staging + static_cast<uint64_t>(row0[i] * record_bytes);
      }
    }
  }
  std::memcpy(host, params.data(), tokens_at);
  std::memcpy(host + tokens_at, tokens.data(), tables_at - tokens_at);
  for (size_t i = 0; i < nc; ++i) {
    std::memcpy(host + tables_at + table_off[i] * 4, seq[i]->table.data(),
                seq[i]->table.size() * 4);
  }
  const size_t dst_bytes = dst_main.size() * 8;
  std::memcpy(host + dst_at, dst_main.data(), dst_bytes);
  std::memcpy(host + dst_at + dst_bytes, dst_key.data(), dst_bytes);
  std::memcpy(host + ids_at, ids.data(), T * 8);
  std::memcpy(host + ids_at + T * 8, pos.data(), T * 8);
}

}  // namespace ss::gpu::cuda_backend_internal
