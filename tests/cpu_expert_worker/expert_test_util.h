// Shared by the store, engine and worker tests: a generated checkpoint whose experts can be cut
// in two (moe_intermediate_size 256; tiny-a's 128 cannot), and small helpers.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "gtest/gtest.h"
#include "tests/tools/checkpoint_generator.h"

namespace ss::expert::testing_util {

inline constexpr char kTinyA[] = "tests/data/tiny-a";

// generator_test.cc's config (dim 384, 8 experts top-3, 5 layers + 1 MTP block, I = 256).
inline constexpr char kI256Config[] = R"({
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

// The I = 256 checkpoint, generated once per test binary (2 shards) and removed at exit.
inline const std::string& I256Checkpoint() {
  struct Dir {
    std::string path;
    Dir() {
      path = (std::filesystem::path(::testing::TempDir()) /
              ("ss_expert_i256_" + std::to_string(::getpid())))
                 .string();
      auto cfg = ParseModelConfig(kI256Config, "I256 config");
      EXPECT_TRUE(cfg.ok()) << cfg.status();
      const absl::Status st = GenerateCheckpoint(*cfg, kI256Config, path, /*seed=*/5, /*shards=*/2);
      EXPECT_TRUE(st.ok()) << st;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

inline std::vector<int> AllLayers(const ModelConfig& c) {
  std::vector<int> l;
  for (int i = 0; i < c.n_layers + c.n_mtp_layers; ++i) l.push_back(i);
  return l;
}

}  // namespace ss::expert::testing_util
