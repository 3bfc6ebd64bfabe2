#include "common/kv_cost_model.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/int_math.h"

namespace ss::sched {
namespace {

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
  const int64_t main_entry = options.main_entries == MainEntryFormat::kFp8DsMla
                                 ? nope + 2 * rope + RoundUp(nope / 64, 8)
                                 : 2 * config.head_dim;
  const int64_t index_entry = options.indexer_keys == IndexerKeyFormat::kFp8
                                  ? config.index_head_dim + 4
                                  : config.index_head_dim / 2 + config.index_head_dim / 32;

  KvCostModel model;
  model.block_tokens = options.block_tokens;
  model.entry_bytes = main_entry;
  model.index_entry_bytes = index_entry;
  int64_t growing = 0;  // bytes of B tokens' compressed entries, all covered layers
  int64_t layers = 0;
  auto add_layer = [&](int64_t layer) -> absl::Status {
    const int64_t m = config.compress_ratios[layer];
    ++layers;
    if (m == 0) return absl::OkStatus();
    if (options.block_tokens % m != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV cost model: block_tokens = ", options.block_tokens, " must be a multiple of layer ",
          layer, "'s compress ratio ", m, " so that every block holds whole compressed entries"));
    }
    model.state_bytes += CompressorStateBytes(m, config.head_dim);
    growing += options.block_tokens / m * main_entry;
    if (m == 4) {
      model.state_bytes += CompressorStateBytes(m, config.index_head_dim);
      model.carry_bytes += 4 * 2 * 4 * (2 * config.head_dim + 2 * config.index_head_dim);
      growing += options.block_tokens / m * index_entry;
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
  // The window blocks, packed as the cuda backend's pool packs them (cuda_backend_kv.h).
  const int64_t rings = layers * config.window_size;
  model.fixed_bytes = rings * main_entry;
  // Layers that do not grow (SWA only): one block holds all their rings.
  model.block_bytes = RoundUp(growing > 0 ? growing : rings * main_entry, 8);
  model.windows_per_block = model.block_bytes / main_entry;
  if (model.windows_per_block < 1) {
    model.block_bytes = main_entry;
    model.windows_per_block = 1;
  }
  model.fixed_blocks = CeilDiv(rings, model.windows_per_block);
  model.snapshot_blocks = model.fixed_blocks + CeilDiv(model.carry_bytes, model.block_bytes);
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
  for (const KvCostModel& s : stages) {
    out.state_bytes = std::max(out.state_bytes, s.state_bytes);
    out.carry_bytes = std::max(out.carry_bytes, s.carry_bytes);
    out.snapshot_blocks = std::max(out.snapshot_blocks, s.snapshot_blocks);
  }
  return out;
}

std::string KvCostModel::DebugString() const {
  return absl::StrCat("KvCostModel{block_tokens=", block_tokens, " block_bytes=", block_bytes,
                      " entry_bytes=", entry_bytes, " index_entry_bytes=", index_entry_bytes,
                      " fixed_bytes=", fixed_bytes, " windows_per_block=", windows_per_block,
                      " fixed_blocks=", fixed_blocks, " state_bytes=", state_bytes,
                      " carry_bytes=", carry_bytes, " snapshot_blocks=", snapshot_blocks, "}");
}

}  // namespace ss::sched
