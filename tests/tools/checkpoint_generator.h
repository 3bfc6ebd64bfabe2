// Test-only generator of random-weight DeepSeek-V4 checkpoints in the exact hub format
// (spec §2, initialisation of spec §9.4 / tiny-a), for any config that ParseModelConfig accepts.
//
// Every tensor of ExpectedTensors(cfg) is written, in that order:
//   * FP8 linears: W ~ N(0, 1/fan_in) in fp32, quantised per 128x128 block (partial edge blocks
//     allowed) with s = 2^ceil(log2(amax/448)) (Pow2Scale, stored as a ue8m0 byte) and e4m3
//     round-to-nearest-even.
//   * MXFP4 routed experts (I8 [out, in/2] + ue8m0 [out, in/32]): w1/w3 ~ N(0, 64/fan_in),
//     w2 ~ N(0, 0.0625/fan_in) (tiny-a's init, so the SwiGLU clamp fires); per 1x32 group
//     s = 2^ceil(log2(amax/6)), e2m1 round-to-nearest-even, element 2j in the low nibble and
//     2j+1 in the high nibble, zero always code 0.
//   * BF16: embed N(0,1), head N(0,1/dim), every *norm.weight 1+N(0,0.1²), other matrices
//     (compressor wkv/wgate, indexer weights_proj, gate.weight) N(0, 1/fan_in).
//   * F32: hc_*_fn N(0,0.02²), hc_*_base N(0,0.5²), hc_*_scale U(0.5,1.5), attn_sink N(0,1),
//     ape N(0,0.5²), gate.bias N(0,0.1²).
//   * I64 tid2eid: n_activated distinct expert ids per row (a random permutation's prefix).
//
// Determinism: each tensor draws from its own std::mt19937_64 seeded from (seed, tensor name),
// with our own uniform and Box-Muller normal, so the bytes depend only on the seed, the config
// and libm's log/cos/sqrt — not on the standard library's distributions, on the shard count or
// on the tensor order. Single-threaded; holds the whole checkpoint in memory while writing.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/model_config.h"

namespace ss {

// Quantises a row-major fp32 matrix [rows, cols] to e4m3 codes (rows*cols bytes) and ue8m0
// block scales ([ceil(rows/128), ceil(cols/128)] bytes) with the rule above.
void QuantizeFp8Blocks(const float* w, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales);

// Quantises a row-major fp32 matrix [rows, cols] (cols a multiple of 32) to packed MXFP4:
// rows*cols/2 bytes of nibble pairs and [rows, cols/32] ue8m0 group scales.
void QuantizeMxfp4(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scales);

// Writes `out_dir`/config.json (= `config_json_text`, verbatim) and the weights for `cfg`
// (which must be the parse of that text): `model.safetensors` when shards == 1, otherwise
// `model-0000i-of-0000K.safetensors` (i = 1..K, K contiguous groups of the tensor list) plus
// `model.safetensors.index.json` ({"metadata": {"total_size": N}, "weight_map": {...}}).
// Creates `out_dir` if needed and first removes any model*.safetensors / index it holds, so a
// re-run with a different shard count leaves a consistent directory. Errors: InvalidArgument
// for shards < 1 or more shards than tensors, Internal for a tensor without an init rule,
// and the writer's errors for I/O.
absl::Status GenerateCheckpoint(const ModelConfig& cfg, const std::string& config_json_text,
                                const std::string& out_dir, uint64_t seed, int shards);

}  // namespace ss
