// Binds a DeepSeek-V4 checkpoint's tensors (spec §2.2) to typed views for the reference model.
//
// Large tensors (FP8/FP4 linears, BF16 matrices) stay in the checkpoint's mmap; small fp32
// parameters (norm weights upcast from BF16, HC parameters, sinks, ape, router bias) are copied
// into vectors. The ModelWeights object keeps the Checkpoint alive; it is immutable after
// Bind and may be read from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/linear.h"
#include "common/model_config.h"
#include "common/safetensors.h"

namespace ss::model {

struct HcWeights {           // one hyper-connection mixer (hc_attn_*, hc_ffn_* or hc_head_*)
  std::vector<float> fn;     // [mix, hc*dim]
  std::vector<float> base;   // [mix]
  std::vector<float> scale;  // [3] for blocks, [1] for heads
};

struct CompressorWeights {
  int64_t ratio = 0, head_dim = 0;  // output dim d; rows are coff*d
  std::vector<float> ape;           // [ratio, coff*d]
  Bf16Matrix wkv, wgate;            // [coff*d, dim]
  std::vector<float> norm;          // [d]
};

struct IndexerWeights {
  Fp8Weight wq_b;           // [index_n_heads*index_head_dim, q_lora_rank]
  Bf16Matrix weights_proj;  // [index_n_heads, dim]
  CompressorWeights compressor;
};

struct AttentionWeights {
  int64_t ratio = 0;
  std::vector<float> attn_sink;  // [n_heads]
  Fp8Weight wq_a, wq_b, wkv, wo_a, wo_b;
  std::vector<float> q_norm, kv_norm;
  bool has_compressor = false, has_indexer = false;
  CompressorWeights compressor;
  IndexerWeights indexer;
};

struct ExpertWeights {
  Fp4Weight w1, w2, w3;
};

struct MoeWeights {
  Bf16Matrix gate;  // [n_routed, dim]
  bool hash = false;
  std::vector<int32_t> tid2eid;  // [vocab, k] when hash
  std::vector<float> bias;       // [n_routed] when learned
  std::vector<ExpertWeights> experts;
  Fp8Weight shared_w1, shared_w2, shared_w3;
};

struct BlockWeights {
  std::vector<float> attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  MoeWeights moe;
};

struct MtpWeights {
  BlockWeights block;
  Fp8Weight e_proj, h_proj;
  std::vector<float> enorm, hnorm, norm;
  HcWeights hc_head;
};

struct ModelWeights {
  ModelConfig config;
  std::unique_ptr<Checkpoint> checkpoint;  // owns the mappings the views point into
  Bf16Matrix embed, head;
  std::vector<float> norm;
  HcWeights hc_head;
  std::vector<BlockWeights> blocks;
  std::vector<MtpWeights> mtp;
};

// Validates every tensor of `checkpoint` against `config`'s schema and binds them; the result
// owns the checkpoint. Real and dummy weights (Checkpoint::Open, MakeDummyCheckpoint) bind
// through this one function. Errors name the tensor and its file (or the dummy label).
absl::StatusOr<std::unique_ptr<ModelWeights>> BindModelWeights(
    ModelConfig config, std::unique_ptr<Checkpoint> checkpoint);

// Opens `dir` (config.json + safetensors, single or sharded) and binds it (BindModelWeights).
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::string& dir);

}  // namespace ss::model
