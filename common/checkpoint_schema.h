// The tensor schema of a DeepSeek-V4 checkpoint (spec §2.2, §2.8): which tensors a checkpoint of a
// given ModelConfig must hold, with their dtypes and shapes, and a validator that checks a
// loaded Checkpoint against it before any tensor is used.
//
// Naming follows the hub/demo names: `embed.weight`, `layers.L.attn.wq_a.weight` / `.scale`,
// `layers.L.ffn.experts.E.w1.weight`, `mtp.K.e_proj.weight`, ... The MTP blocks `mtp.K.`
// (K < n_mtp_layers) hold a full SWA-only, learned-routing block plus their own e_proj/h_proj,
// enorm/hnorm/norm and hc_head_*; they share `embed.weight` and `head.weight`.
//
// Storage rules encoded here:
//   * FP8 linears: `.weight` F8_E4M3 [out, in] and `.scale` F8_E8M0 [ceil(out/128), ceil(in/128)].
//   * MXFP4 routed experts: `.weight` I8 [out, in/2] (two e2m1 codes a byte) and `.scale`
//     F8_E8M0 [out, in/32].
//   * `ffn.gate.tid2eid` I64 [vocab, n_activated] iff layer < n_hash_layers, else `ffn.gate.bias`
//     F32 [n_routed] (MTP blocks always use the bias).
//   * `attn.compressor.*` iff the layer's compress ratio m > 0 and `attn.indexer.*` iff m == 4;
//     compressor rows are coff * head_dim with coff = 2 iff m == 4.
// Pure functions of their arguments; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model_config.h"
#include "common/safetensors.h"

namespace ss {

struct ExpectedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Every tensor a checkpoint of `c` must hold, in a fixed order: the global tensors, then
// layers 0..n_layers-1, then the MTP blocks. Sizes are exact: no tensor is optional. `c` must
// have passed ParseModelConfig (sizes positive, compress_ratios complete).
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c);

// Checks that `ckpt` holds every expected tensor with the expected dtype and shape. The first
// mismatch is returned: NotFound for a missing tensor, InvalidArgument naming the tensor, its
// file, and the expected vs found dtype or shape. Tensors of the checkpoint that the schema does
// not know are not an error: they are logged (one spdlog warning) and, when `unexpected` is not
// null, appended to it in sorted order.
absl::Status ValidateCheckpoint(const Checkpoint& ckpt, const ModelConfig& c,
                                std::vector<std::string>* unexpected);

}  // namespace ss
