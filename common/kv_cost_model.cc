#include "common/kv_cost_model.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ss::sched {
namespace {

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
int64_t CeilDiv(int64_t x, int64_t by) { return (x + by - 1) / by; }

// fp32 kv + score partial state of one compressor: coff*m token slots of coff*d channels.
int64_t CompressorStateBytes(int64_t ratio, int64_t d) {
  const int64_t coff = ratio == 4 ? 2 : 1;
  return 2 * (coff * ratio) * (coff * d) * 4;
}

}  // namespace

absl::StatusOr<KvCostModel> KvCostModel::FromModelConfig(const ModelConfig& config,
                                                         const KvCostOptions& options) {
  const int64_t end_layer = options.end_layer < 0 ? config.n_layers : options.end_layer;
  if (options.first_layer < 0 || options.first_layer >= end_layer || end_layer > config.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cost model: layer range [", options.first_layer, ", ", end_layer,
                     ") is not a non-empty range of the model's ", config.n_layers, " layers"));
  }
  if (options.block_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cost model: block_tokens = ", options.block_tokens, " must be positive"));
  }
  const int64_t n_ratios = static_cast<int64_t>(config.compress_ratios.size());
  if (n_ratios != config.n_layers + config.n_mtp_layers) {
    return absl::InvalidArgumentError(absl::StrCat("KV cost model: compress_ratios has ", n_ratios,
                                                   " entries, expected ",
                                                   config.n_layers + config.n_mtp_layers));
  }
  const int64_t nope = config.nope_head_dim();
  const int64_t rope = config.rope_head_dim;
  if (nope <= 0 || nope % 64 != 0 || rope <= 0 || config.window_size <= 0 ||
      config.index_head_dim <= 0 || config.index_head_dim % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cost model: head_dim ", config.head_dim, ", rope_head_dim ", rope,
                     ", window ", config.window_size, ", index_head_dim ", config.index_head_dim,
                     " do not describe fp8_ds_mla entries (nope a positive multiple of 64, "
                     "index_head_dim a multiple of 32)"));
  }
  const int64_t main_entry = nope + 2 * rope + RoundUp(nope / 64, 8);
  const int64_t index_entry = options.indexer_keys == IndexerKeyFormat::kFp8
                                  ? config.index_head_dim + 4
                                  : config.index_head_dim / 2 + config.index_head_dim / 32;

  KvCostModel model;
  model.block_tokens = options.block_tokens;
  auto add_layer = [&](int64_t layer) -> absl::Status {
    const int64_t m = config.compress_ratios[layer];
    model.fixed_bytes += config.window_size * main_entry;
    if (m == 0) return absl::OkStatus();
    if (options.block_tokens % m != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV cost model: block_tokens = ", options.block_tokens, " must be a multiple of layer ",
          layer, "'s compress ratio ", m, " so that every block holds whole compressed entries"));
    }
    model.fixed_bytes += CompressorStateBytes(m, config.head_dim);
    model.block_bytes += options.block_tokens / m * main_entry;
    if (m == 4) {
      model.fixed_bytes += CompressorStateBytes(m, config.index_head_dim);
      model.block_bytes += options.block_tokens / m * index_entry;
    }
    return absl::OkStatus();
  };
  for (int64_t layer = options.first_layer; layer < end_layer; ++layer) {
    if (absl::Status s = add_layer(layer); !s.ok()) return s;
  }
  if (options.include_mtp) {
    for (int64_t k = 0; k < config.n_mtp_layers; ++k) {
      if (absl::Status s = add_layer(config.n_layers + k); !s.ok()) return s;
    }
  }
  if (model.block_bytes == 0) {
    // Nothing grows: blocks have no size. Such a pool (SWA-only layers) is bounded by sequences,
    // not tokens; it belongs in the pipeline's running-sequence limit, not in block accounting.
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cost model: layers [", options.first_layer, ", ", end_layer,
        ") have no compressed layer, so their KV does not grow with length; bound such a stage "
        "by its number of sequences (fixed state ",
        model.fixed_bytes, " B each)"));
  }
  model.fixed_blocks = CeilDiv(model.fixed_bytes, model.block_bytes);
  return model;
}

absl::StatusOr<KvCostModel> KvCostModel::Pipeline(std::span<const KvCostModel> stages) {
  if (stages.empty()) return absl::InvalidArgumentError("KV cost model: a pipeline has no stage");
  KvCostModel out = stages[0];
  for (const KvCostModel& s : stages) {
    if (s.block_tokens != out.block_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV cost model: pipeline stages disagree on block_tokens (",
                       out.block_tokens, " vs ", s.block_tokens, ")"));
    }
    if (s.fixed_blocks > out.fixed_blocks) out = s;
  }
  return out;
}

std::string KvCostModel::DebugString() const {
  return absl::StrCat("KvCostModel{block_tokens=", block_tokens, " block_bytes=", block_bytes,
                      " fixed_bytes=", fixed_bytes, " fixed_blocks=", fixed_blocks, "}");
}

}  // namespace ss::sched
