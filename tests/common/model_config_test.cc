#include "common/model_config.h"

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/tools/test_configs.h"

namespace ss {
namespace {

using nlohmann::json;

using testing_util::kFlashConfig;

std::string TinyText() {
  std::ifstream in("tests/data/tiny-a/config.json");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ModelConfigTest, TinyA) {
  auto c = LoadModelConfig("tests/data/tiny-a");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 1024);
  EXPECT_EQ(c->dim, 256);
  EXPECT_EQ(c->n_layers, 7);
  EXPECT_EQ(c->n_heads, 4);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope_head_dim, 64);
  EXPECT_EQ(c->nope_head_dim(), 64);
  EXPECT_EQ(c->q_lora_rank, 128);
  EXPECT_EQ(c->o_groups, 2);
  EXPECT_EQ(c->o_lora_rank, 128);
  EXPECT_EQ(c->window_size, 16);
  EXPECT_EQ(c->compress_ratios, (std::vector<int64_t>{0, 0, 4, 128, 4, 128, 4, 0}));
  EXPECT_EQ(c->compress_ratio(3), 128);
  EXPECT_EQ(c->mtp_compress_ratio(0), 0);
  EXPECT_EQ(c->rope_theta, 10000);
  EXPECT_EQ(c->compress_rope_theta, 160000);
  EXPECT_TRUE(c->has_yarn);
  EXPECT_EQ(c->yarn.factor, 16);
  EXPECT_EQ(c->yarn.original_seq_len, 65536);
  EXPECT_EQ(c->yarn.beta_fast, 32);
  EXPECT_EQ(c->yarn.beta_slow, 1);
  EXPECT_EQ(c->max_position_embeddings, 1024);
  EXPECT_EQ(c->index_n_heads, 4);
  EXPECT_EQ(c->index_head_dim, 128);
  EXPECT_EQ(c->index_topk, 8);
  EXPECT_EQ(c->n_routed_experts, 16);
  EXPECT_EQ(c->n_shared_experts, 1);
  EXPECT_EQ(c->n_activated_experts, 4);
  EXPECT_EQ(c->moe_inter_dim, 128);
  EXPECT_EQ(c->n_hash_layers, 3);
  EXPECT_EQ(c->route_scale, 1.5);
  EXPECT_EQ(c->swiglu_limit, 10.0);
  EXPECT_EQ(c->hc_mult, 4);
  EXPECT_EQ(c->mix_hc(), 24);
  EXPECT_EQ(c->hc_sinkhorn_iters, 20);
  EXPECT_EQ(c->hc_eps, 1e-6);
  EXPECT_EQ(c->norm_eps, 1e-6);
  EXPECT_EQ(c->n_mtp_layers, 1);
  EXPECT_EQ(c->bos_token_id, 0);
  EXPECT_EQ(c->eos_token_id, 1);
}

TEST(ModelConfigTest, Flash) {
  auto c = ParseModelConfig(kFlashConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 129280);
  EXPECT_EQ(c->dim, 4096);
  EXPECT_EQ(c->n_layers, 43);
  EXPECT_EQ(c->n_heads, 64);
  EXPECT_EQ(c->head_dim, 512);
  EXPECT_EQ(c->nope_head_dim(), 448);
  EXPECT_EQ(c->q_lora_rank, 1024);
  EXPECT_EQ(c->o_groups, 8);
  EXPECT_EQ(c->window_size, 128);
  ASSERT_EQ(c->compress_ratios.size(), 44u);
  EXPECT_EQ(c->compress_ratio(0), 0);
  EXPECT_EQ(c->compress_ratio(2), 4);
  EXPECT_EQ(c->compress_ratio(41), 128);
  EXPECT_EQ(c->compress_ratio(42), 4);
  EXPECT_EQ(c->mtp_compress_ratio(0), 0);
  EXPECT_EQ(c->max_position_embeddings, 1048576);
  EXPECT_EQ(c->index_n_heads, 64);
  EXPECT_EQ(c->index_topk, 512);
  EXPECT_EQ(c->n_routed_experts, 256);
  EXPECT_EQ(c->n_activated_experts, 6);
  EXPECT_EQ(c->moe_inter_dim, 2048);
  EXPECT_EQ(c->route_scale, 1.5);
  EXPECT_EQ(c->swiglu_limit, 10.0);
  EXPECT_TRUE(c->has_yarn);
  EXPECT_EQ(c->yarn.original_seq_len, 65536);
  EXPECT_EQ(c->n_mtp_layers, 1);
}

TEST(ModelConfigTest, OptionalFieldsTakeDefaults) {
  json j = json::parse(TinyText());
  for (const char* f : {"swiglu_limit", "rope_scaling", "quantization_config", "expert_dtype",
                        "num_key_value_heads", "hidden_act", "architectures", "bos_token_id"}) {
    j.erase(f);
  }
  j.erase("num_nextn_predict_layers");
  j["compress_ratios"] = {0, 0, 4, 128, 4, 128, 4};
  j["rope_scaling"] = nullptr;  // null = absent
  auto c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->swiglu_limit, 0.0);
  EXPECT_EQ(c->n_mtp_layers, 0);
  EXPECT_FALSE(c->has_yarn);
  EXPECT_EQ(c->bos_token_id, 0);
}

struct BadConfig {
  const char* what;
  std::function<void(json&)> edit;
  const char* field;    // the message must name this field ...
  const char* message;  // ... and contain this
};

std::vector<BadConfig> BadConfigs() {
  return {
      // spec §9.2 constraints
      {"dim % 128", [](json& j) { j["hidden_size"] = 320; }, "hidden_size", "multiple of 128"},
      {"q_lora_rank % 128", [](json& j) { j["q_lora_rank"] = 100; }, "q_lora_rank",
       "= 100 must be a multiple of 128 (FP8 GEMM K dimension)"},
      {"o_groups * o_lora_rank % 128", [](json& j) { j["o_lora_rank"] = 96; }, "o_lora_rank",
       "o_groups * o_lora_rank = 192"},
      {"moe_inter_dim % 128", [](json& j) { j["moe_intermediate_size"] = 192; },
       "moe_intermediate_size", "multiple of 128"},
      {"n_heads % o_groups",
       [](json& j) {
         j["o_groups"] = 3;
         j["o_lora_rank"] = 128;
       },
       "o_groups", "must divide num_attention_heads"},
      {"n_heads * head_dim / o_groups % 128",
       [](json& j) {
         j["head_dim"] = 160;
         j["qk_rope_head_dim"] = 32;
       },
       "o_groups", "num_attention_heads * head_dim / o_groups = 320"},
      {"nope % 64", [](json& j) { j["qk_rope_head_dim"] = 32; }, "qk_rope_head_dim",
       "positive multiple of 64"},
      {"nope = 0", [](json& j) { j["qk_rope_head_dim"] = 128; }, "qk_rope_head_dim",
       "head_dim - qk_rope_head_dim = 0"},
      {"rope odd",
       [](json& j) {
         j["num_attention_heads"] = 128;
         j["o_groups"] = 1;
         j["o_lora_rank"] = 256;
         j["head_dim"] = 129;
         j["qk_rope_head_dim"] = 65;
       },
       "qk_rope_head_dim", "must be even"},
      {"index_head_dim not a power of two", [](json& j) { j["index_head_dim"] = 96; },
       "index_head_dim", "power of two"},
      {"index_head_dim % 32", [](json& j) { j["index_head_dim"] = 16; }, "index_head_dim",
       "multiple of 32"},
      {"index_head_dim < rope", [](json& j) { j["index_head_dim"] = 32; }, "index_head_dim",
       ">= qk_rope_head_dim"},
      {"top-k > experts", [](json& j) { j["num_experts_per_tok"] = 17; }, "num_experts_per_tok",
       "<= n_routed_experts"},
      {"hash layers > layers", [](json& j) { j["num_hash_layers"] = 8; }, "num_hash_layers",
       "<= num_hidden_layers"},
      {"two shared experts", [](json& j) { j["n_shared_experts"] = 2; }, "n_shared_experts", "= 2"},
      {"kv heads", [](json& j) { j["num_key_value_heads"] = 4; }, "num_key_value_heads", "= 4"},
      // identity and format
      {"model_type", [](json& j) { j["model_type"] = "deepseek_v3"; }, "model_type",
       "must be \"deepseek_v4\""},
      {"architectures", [](json& j) { j["architectures"] = {"DeepseekV3ForCausalLM"}; },
       "architectures", "DeepseekV4ForCausalLM"},
      {"scoring_func", [](json& j) { j["scoring_func"] = "softmax"; }, "scoring_func",
       "sqrtsoftplus"},
      {"hidden_act", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act", "silu"},
      {"expert_dtype", [](json& j) { j["expert_dtype"] = "fp8"; }, "expert_dtype", "fp4"},
      {"quant fmt", [](json& j) { j["quantization_config"]["fmt"] = "e5m2"; },
       "quantization_config.fmt", "e4m3"},
      {"quant method", [](json& j) { j["quantization_config"].erase("quant_method"); },
       "quantization_config.quant_method", "missing"},
      {"quant scale", [](json& j) { j["quantization_config"]["scale_fmt"] = "fp32"; },
       "quantization_config.scale_fmt", "ue8m0"},
      {"quant block",
       [](json& j) {
         j["quantization_config"]["weight_block_size"] = {64, 64};
       },
       "quantization_config.weight_block_size", "[128, 128]"},
      {"quant not object", [](json& j) { j["quantization_config"] = "fp8"; }, "quantization_config",
       "object"},
      // compress ratios
      {"ratios length", [](json& j) { j["compress_ratios"].erase(0); }, "compress_ratios",
       "has 7 entries"},
      {"ratio value", [](json& j) { j["compress_ratios"][3] = 64; }, "compress_ratios[3]",
       "0, 4 or 128"},
      {"MTP ratio", [](json& j) { j["compress_ratios"][7] = 4; }, "compress_ratios[7]",
       "MTP blocks are SWA-only"},
      {"ratio type", [](json& j) { j["compress_ratios"][2] = "4"; }, "compress_ratios[2]",
       "must be an integer"},
      {"ratios not array", [](json& j) { j["compress_ratios"] = 4; }, "compress_ratios",
       "must be an array"},
      // values and types
      {"zero size", [](json& j) { j["vocab_size"] = 0; }, "vocab_size", "must be in [1,"},
      {"negative size", [](json& j) { j["num_hidden_layers"] = -7; }, "num_hidden_layers",
       "must be in [1,"},
      {"huge size", [](json& j) { j["hidden_size"] = 18446744073709551615ull; }, "hidden_size",
       "must be in"},
      {"missing field", [](json& j) { j.erase("hidden_size"); }, "hidden_size", "is missing"},
      {"missing ratios", [](json& j) { j.erase("compress_ratios"); }, "compress_ratios",
       "is missing"},
      {"missing theta", [](json& j) { j.erase("rope_theta"); }, "rope_theta", "is missing"},
      {"string for int", [](json& j) { j["hidden_size"] = "256"; }, "hidden_size",
       "must be an integer, got \"256\""},
      {"float for int", [](json& j) { j["head_dim"] = 128.5; }, "head_dim", "must be an integer"},
      {"bool for int", [](json& j) { j["index_topk"] = true; }, "index_topk", "must be an integer"},
      {"string for number", [](json& j) { j["rope_theta"] = "1e4"; }, "rope_theta",
       "must be a number"},
      {"non-positive eps", [](json& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps", "must be > 0"},
      {"negative swiglu", [](json& j) { j["swiglu_limit"] = -1; }, "swiglu_limit", ">= 0"},
      {"negative route scale", [](json& j) { j["routed_scaling_factor"] = -1.5; },
       "routed_scaling_factor", "> 0"},
      {"rope scaling type", [](json& j) { j["rope_scaling"]["type"] = "linear"; },
       "rope_scaling.type", "only \"yarn\""},
      {"rope scaling factor", [](json& j) { j["rope_scaling"]["factor"] = "16"; },
       "rope_scaling.factor", "must be a number"},
      {"rope scaling orig",
       [](json& j) { j["rope_scaling"].erase("original_max_position_embeddings"); },
       "rope_scaling.original_max_position_embeddings", "is missing"},
      {"rope scaling not object", [](json& j) { j["rope_scaling"] = 16; }, "rope_scaling",
       "object"},
      {"eos list",
       [](json& j) {
         j["eos_token_id"] = {1, 2};
       },
       "eos_token_id", "must be an integer"},
  };
}

TEST(ModelConfigTest, EachViolationNamesTheField) {
  const json tiny = json::parse(TinyText());
  ASSERT_TRUE(ParseModelConfig(tiny.dump()).ok());
  for (const BadConfig& b : BadConfigs()) {
    SCOPED_TRACE(b.what);
    json j = tiny;
    b.edit(j);
    auto c = ParseModelConfig(j.dump(), "tiny/config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
    const std::string msg(c.status().message());
    EXPECT_EQ(msg.rfind("tiny/config.json: field '" + std::string(b.field) + "'", 0), 0u) << msg;
    EXPECT_NE(msg.find(b.message), std::string::npos) << msg;
  }
}

TEST(ModelConfigTest, MalformedJson) {
  for (const char* text : {"", "{", "{\"hidden_size\": 256,}", "[1, 2]", "null", "42"}) {
    auto c = ParseModelConfig(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_TRUE(absl::IsInvalidArgument(c.status()));
    EXPECT_EQ(std::string(c.status().message()).rfind("config.json: ", 0), 0u) << c.status();
  }
}

TEST(ModelConfigTest, MissingFileIsNotFound) {
  auto c = LoadModelConfig("tests/data/no-such-model");
  EXPECT_TRUE(absl::IsNotFound(c.status())) << c.status();
}

}  // namespace
}  // namespace ss
