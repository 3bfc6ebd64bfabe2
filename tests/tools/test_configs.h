// Model configs shared by tests: shapes other than tiny-a's, for checks that nothing depends
// on tiny-a's sizes.
#pragma once

namespace ss::testing_util {

// dim 384, 6 heads x 128, 3 output groups, window 8, ratios [0, 4, 128, 4, 0] + one MTP block,
// 8 experts top-3 with moe_intermediate_size 256 (experts can be cut into two 128-wide slices),
// hc_mult 2, an indexer with 3 heads of 64 and top-4.
inline constexpr char kWideI256Config[] = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 640, "hidden_size": 384, "num_hidden_layers": 5,
  "num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64,
  "q_lora_rank": 256, "o_groups": 3, "o_lora_rank": 128, "sliding_window": 8,
  "compress_ratios": [0, 4, 128, 4, 0, 0],
  "compress_rope_theta": 160000, "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 512,
  "index_n_heads": 3, "index_head_dim": 64, "index_topk": 4,
  "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 3,
  "moe_intermediate_size": 256, "num_hash_layers": 1,
  "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": true,
  "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hidden_act": "silu",
  "hc_mult": 2, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
  "num_nextn_predict_layers": 1,
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                          "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
  "expert_dtype": "fp4", "tie_word_embeddings": false,
  "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16"
})";

// The DeepSeek-V4-Flash root config.json (spec §1.1).
inline constexpr char kFlashConfig[] = R"({
  "architectures": ["DeepseekV4ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                      4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                      4, 128, 4, 128, 4, 128, 4, 0],
  "compress_rope_theta": 160000,
  "eos_token_id": 1,
  "expert_dtype": "fp4",
  "hc_eps": 1e-06,
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "head_dim": 512,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "index_head_dim": 128,
  "index_n_heads": 64,
  "index_topk": 512,
  "initializer_range": 0.02,
  "max_position_embeddings": 1048576,
  "model_type": "deepseek_v4",
  "moe_intermediate_size": 2048,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 64,
  "num_experts_per_tok": 6,
  "num_hash_layers": 3,
  "num_hidden_layers": 43,
  "num_key_value_heads": 1,
  "num_nextn_predict_layers": 1,
  "o_groups": 8,
  "o_lora_rank": 1024,
  "q_lora_rank": 1024,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128]
  },
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 16,
    "original_max_position_embeddings": 65536,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 1.5,
  "scoring_func": "sqrtsoftplus",
  "sliding_window": 128,
  "swiglu_limit": 10.0,
  "tie_word_embeddings": false,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.57.1",
  "use_cache": true,
  "vocab_size": 129280
})";

}  // namespace ss::testing_util
