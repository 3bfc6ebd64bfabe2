// Dummy weights (`--load-format dummy`, vLLM's meaning): every tensor of a DeepSeek-V4 checkpoint
// (ExpectedTensors(config)) generated in memory in its native format, deterministic from a seed,
// so that a model of any size can be served and measured without its files. Nothing is read from
// disk but config.json.
//
// Formats are the checkpoint's own: e4m3 codes with ue8m0 128x128 block scales, MXFP4 e2m1 nibble
// pairs with ue8m0 1x32 scales, bf16 and fp32 tensors, int64 tid2eid rows of distinct expert
// ids. Magnitudes follow a trained model's (and tests/tools/checkpoint_generator's init rules),
// so activations stay finite through every layer.
//
// Determinism: a tensor's bytes depend only on (config, seed, tensor name) — not on the thread
// count, the order of generation or which other tensors are generated — so every process of a
// cluster generates the same model. Generation runs on all the pool's threads at memory speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/checkpoint_schema.h"
#include "common/model_config.h"
#include "common/safetensors.h"

namespace ss {

class ThreadPool;

// Which tensors (by checkpoint name) a process generates.
using TensorFilter = std::function<bool(std::string_view name)>;

// The tensors a pipeline stage holding blocks [first_layer, end_layer) uses: the non-expert
// tensors of those blocks, embed.weight when `embed`, head.weight / norm.weight / hc_head_* when
// `head`, the MTP blocks' tensors when `mtp`, and the routed experts of its blocks only when
// `routed_experts` (they normally live in the expert workers).
TensorFilter StageTensors(const ModelConfig& c, int first_layer, int end_layer, bool embed,
                          bool head, bool mtp, bool routed_experts);

// Writes tensor `t`'s bytes (`nbytes` == its size) into `dst`, deterministic as above.
// InvalidArgument for a size mismatch, Internal for a tensor without a rule.
absl::Status FillDummyTensor(const ModelConfig& c, const ExpectedTensor& t, uint64_t seed,
                             uint8_t* dst, size_t nbytes);

// A checkpoint of every tensor of ExpectedTensors(c), generated on `pool` (null: the calling
// thread alone). Tensors `materialize` rejects read as zeros and take no memory (one shared
// read-only zero mapping); null accepts all. Logs bytes generated, seconds and GB/s.
absl::StatusOr<std::unique_ptr<Checkpoint>> MakeDummyCheckpoint(const ModelConfig& c, uint64_t seed,
                                                                const TensorFilter& materialize,
                                                                ThreadPool* pool);

}  // namespace ss
