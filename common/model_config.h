// The model's structural configuration, parsed from the Hugging Face `config.json` of a
// DeepSeek-V4 checkpoint (spec §1.1) and validated against every constraint of spec §9.2.
// Field names follow the demo's ModelArgs (spec §1.2). Immutable after parsing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ss {

struct YarnConfig {
  double factor = 16;
  int64_t original_seq_len = 65536;  // rope_scaling.original_max_position_embeddings
  double beta_fast = 32;
  double beta_slow = 1;
};

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t dim = 0;            // hidden_size
  int64_t n_layers = 0;       // num_hidden_layers (MTP blocks are extra)
  int64_t n_heads = 0;        // num_attention_heads
  int64_t head_dim = 0;       // q/k/v width per head (512 in Flash)
  int64_t rope_head_dim = 0;  // qk_rope_head_dim: the LAST rope_head_dim dims of a head
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t window_size = 0;  // sliding_window
  // compress_ratios[i] for i < n_layers are the layers, the entries after are the MTP blocks.
  std::vector<int64_t> compress_ratios;
  double rope_theta = 10000;
  double compress_rope_theta = 160000;
  bool has_yarn = false;  // rope_scaling present with type "yarn"
  YarnConfig yarn;
  int64_t max_position_embeddings = 0;
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t n_activated_experts = 0;  // num_experts_per_tok
  int64_t moe_inter_dim = 0;        // moe_intermediate_size
  int64_t n_hash_layers = 0;        // num_hash_layers
  double route_scale = 1.0;         // routed_scaling_factor
  double swiglu_limit = 0.0;        // 0 = no clamp
  int64_t hc_mult = 0;
  int64_t hc_sinkhorn_iters = 0;
  double hc_eps = 1e-6;
  double norm_eps = 1e-6;    // rms_norm_eps
  int64_t n_mtp_layers = 0;  // num_nextn_predict_layers
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;

  int64_t nope_head_dim() const { return head_dim - rope_head_dim; }
  int64_t compress_ratio(int64_t layer) const { return compress_ratios.at(layer); }
  int64_t mtp_compress_ratio(int64_t k) const { return compress_ratios.at(n_layers + k); }
  int64_t mix_hc() const { return (2 + hc_mult) * hc_mult; }
};

// Parses a config.json text. Every error is InvalidArgument and names the offending field
// ("config.json: field 'q_lora_rank' = 100 must be a multiple of 128 (FP8 GEMM K dimension)").
// Checks: required fields present with the right JSON type; positive sizes;
// architectures/model_type DeepSeek-V4; scoring_func "sqrtsoftplus"; hidden_act "silu";
// quantization_config fp8/e4m3/ue8m0 with block [128,128] when present; expert_dtype "fp4" when
// present; compress_ratios has n_layers + num_nextn_predict_layers entries, each 0, 4 or 128
// (MTP entries 0); the spec §9.2 constraints: dim, q_lora_rank, o_groups*o_lora_rank and
// moe_inter_dim multiples of 128; n_heads*head_dim/o_groups a multiple of 128; n_heads
// divisible by o_groups; head_dim - rope_head_dim a positive multiple of 64; rope_head_dim
// even; index_head_dim a power of two, a multiple of 32 and >= rope_head_dim;
// n_activated_experts <= n_routed_experts; n_hash_layers <= n_layers; n_shared_experts == 1;
// num_key_value_heads == 1 when present.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& label = "config.json");
// Reads and parses `<dir>/config.json`.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace ss
