// The golden runner on golden sets of shapes other than tiny-a's, written by the reference model
// itself: a random checkpoint (GenerateCheckpoint) -> WriteGoldenSet -> RunGolden. The set is
// self-consistent, so every check must pass, and the teacher-forced per-block checks (which
// replay exactly the calls the writer made) must be bit-exact. Two configs:
//   * "wide": dim 384, 6 heads in 3 output groups, hc_mult 4, window 8, 8 experts top-3, an
//     indexer of 2 x 64, layers SWA / CSA / HCA / CSA / SWA + MTP; sharded into 3 files.
//   * "narrow": dim 128, 4 heads of head_dim 96 (rope 32) in one group, hc_mult 3, window 6,
//     6 experts top-2, an indexer of 1 x 32, layers CSA / HCA / SWA / CSA, no MTP; single file.
#include "tests/tools/golden_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "common/golden/golden.h"
#include "common/model/model.h"
#include "common/model_config.h"
#include "common/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/tools/checkpoint_generator.h"

namespace ss::golden {
namespace {

constexpr char kCommon[] = R"(
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "num_key_value_heads": 1, "n_shared_experts": 1,
  "compress_rope_theta": 160000, "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 512,
  "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": true,
  "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hidden_act": "silu",
  "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                          "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
  "expert_dtype": "fp4", "tie_word_embeddings": false,
  "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16")";

constexpr char kWide[] = R"(
  "vocab_size": 640, "hidden_size": 384, "num_hidden_layers": 5,
  "num_attention_heads": 6, "head_dim": 128, "qk_rope_head_dim": 64,
  "q_lora_rank": 256, "o_groups": 3, "o_lora_rank": 128, "sliding_window": 8,
  "compress_ratios": [0, 4, 128, 4, 0, 0], "num_nextn_predict_layers": 1,
  "index_n_heads": 2, "index_head_dim": 64, "index_topk": 4,
  "n_routed_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 256,
  "num_hash_layers": 1, "hc_mult": 4,)";

constexpr char kNarrow[] = R"(
  "vocab_size": 500, "hidden_size": 128, "num_hidden_layers": 4,
  "num_attention_heads": 4, "head_dim": 96, "qk_rope_head_dim": 32,
  "q_lora_rank": 128, "o_groups": 1, "o_lora_rank": 128, "sliding_window": 6,
  "compress_ratios": [4, 128, 0, 4], "num_nextn_predict_layers": 0,
  "index_n_heads": 1, "index_head_dim": 32, "index_topk": 3,
  "n_routed_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
  "num_hash_layers": 2, "hc_mult": 3,)";

struct Case {
  const char* name;
  const char* fields;
  int shards;
  uint64_t weight_seed, prompt_seed;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class GoldenWriterTest : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(testing::TempDir()) /
            ("ss_golden_writer_test_" + std::to_string(getpid()) + "_" + GetParam().name);
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::filesystem::path root_;
};

bool HasPrefix(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

TEST_P(GoldenWriterTest, RunnerPassesEveryCheckOnTheWrittenSet) {
  const Case& tc = GetParam();
  const std::string config_text = std::string("{") + tc.fields + kCommon + "\n}";
  auto cfg = ParseModelConfig(config_text, tc.name);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const std::string ckpt_dir = (root_ / tc.name).string(), golden_dir = (root_ / "golden").string();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(GenerateCheckpoint(*cfg, config_text, ckpt_dir, tc.weight_seed, tc.shards).ok());
  auto ckpt = Checkpoint::Open(ckpt_dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->num_files(), static_cast<size_t>(tc.shards));

  auto m = model::Model::Load(ckpt_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const absl::Status written = WriteGoldenSet(**m, golden_dir, tc.prompt_seed);
  ASSERT_TRUE(written.ok()) << written;
  const auto t1 = std::chrono::steady_clock::now();

  // The set covers what the plan promises for this config.
  const GoldenPlan plan = PlanGoldenSet(*cfg);
  std::ifstream in(golden_dir + "/cases.json");
  const nlohmann::json cases = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(cases.is_discarded());
  EXPECT_EQ(cases["checkpoint"]["sharded"].get<bool>(), tc.shards > 1);
  auto blocks = Checkpoint::OpenFiles({golden_dir + "/golden_blocks.safetensors"});
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  const TensorView* long_streams = (*blocks)->Find("long.hc_after_block");
  ASSERT_NE(long_streams, nullptr);
  EXPECT_EQ(long_streams->shape,
            (std::vector<int64_t>{cfg->n_layers, plan.long_total, cfg->hc_mult, cfg->dim}));
  EXPECT_GE(plan.long_total, 131);  // both configs have a ratio-128 layer
  EXPECT_NE((*blocks)->Find("blocks160.compressed_kv.L" +
                            std::to_string(cfg->compress_ratios[1] == 128 ? 1 : 2)),
            nullptr);  // the HCA block completes

  GoldenOptions o;
  o.model_dir = ckpt_dir;
  o.golden_dir = golden_dir;
  auto results = RunGolden(o);
  ASSERT_TRUE(results.ok()) << results.status();
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_GE(results->size(), 30u);
  int block_checks = 0, mtp_checks = 0;
  for (const CheckResult& r : *results) {
    std::printf("%s %-34s %s\n", r.pass ? "PASS" : "FAIL", r.name.c_str(), r.figures.c_str());
    EXPECT_TRUE(r.pass) << r.name << ": " << r.figures;
    // The runner replays the writer's own calls, so these are bit-exact.
    if (HasPrefix(r.name, "block_prefill") || HasPrefix(r.name, "block_decode")) {
      ++block_checks;
      EXPECT_NE(r.figures.find("bit_identical=1.000"), std::string::npos) << r.name;
    }
    if (HasPrefix(r.name, "model.") || HasPrefix(r.name, "variant.") || HasPrefix(r.name, "mtp")) {
      mtp_checks += HasPrefix(r.name, "mtp");
      EXPECT_NE(r.figures.find("rms_rel=0.0000"), std::string::npos) << r.name;
    }
  }
  EXPECT_EQ(block_checks, 3 * cfg->n_layers);  // blocks160, inter, long decode
  EXPECT_EQ(mtp_checks, cfg->n_mtp_layers > 0 ? 2 : 0);
  std::printf("%s: %zu checks; generate+write %.1f s, runner %.1f s\n", tc.name, results->size(),
              std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count());
}

INSTANTIATE_TEST_SUITE_P(Configs, GoldenWriterTest,
                         testing::Values(Case{"wide", kWide, 3, 11, 5},
                                         Case{"narrow", kNarrow, 1, 12, 6}),
                         [](const testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace ss::golden
