// WeightSource: --load-format names and --hf-overrides merged into config.json before parsing.
#include "common/weight_source.h"

#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace ss {
namespace {

constexpr char kTinyA[] = "tests/data/tiny-a";

WeightSource TinyA(std::string overrides) {
  WeightSource s;
  s.model_dir = kTinyA;
  s.hf_overrides = std::move(overrides);
  return s;
}

TEST(LoadFormatTest, NamesRoundTripAndUnknownIsRefused) {
  for (LoadFormat f : {LoadFormat::kAuto, LoadFormat::kSafetensors, LoadFormat::kDummy}) {
    auto parsed = ParseLoadFormat(LoadFormatName(f));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, f);
  }
  auto bad = ParseLoadFormat("pt");
  ASSERT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("--load-format 'pt'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("auto, safetensors, dummy"), std::string::npos);
}

TEST(HfOverridesTest, NoneIsTheFileAsIs) {
  auto plain = LoadModelConfig(std::string(kTinyA));
  auto via = LoadModelConfig(TinyA(""));
  ASSERT_TRUE(plain.ok() && via.ok()) << plain.status() << via.status();
  EXPECT_EQ(via->n_routed_experts, plain->n_routed_experts);
  EXPECT_EQ(via->dim, plain->dim);
}

TEST(HfOverridesTest, ChangesAFieldAndKeepsTheOthers) {
  auto c = LoadModelConfig(TinyA(R"({"n_routed_experts": 8, "num_hidden_layers": 3,
                                     "compress_ratios": [0, 4, 128, 0]})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_routed_experts, 8);
  EXPECT_EQ(c->n_layers, 3);
  EXPECT_EQ(c->compress_ratios, (std::vector<int64_t>{0, 4, 128, 0}));
  EXPECT_EQ(c->dim, 256);  // untouched
  EXPECT_EQ(c->n_activated_experts, 4);
}

TEST(HfOverridesTest, NestedObjectsMergeKeyByKey) {
  auto c = LoadModelConfig(TinyA(R"({"rope_scaling": {"factor": 4}})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_yarn);
  EXPECT_EQ(c->yarn.factor, 4);
  EXPECT_EQ(c->yarn.original_seq_len, 65536);  // the file's, kept
  EXPECT_EQ(c->yarn.beta_fast, 32);
}

TEST(HfOverridesTest, MalformedOrNonObjectIsInvalidArgumentNamingTheFlag) {
  for (const char* text : {"{", "{\"hidden_size\": }", "[1, 2]", "42", "\"x\"", "null"}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(absl::IsInvalidArgument(ValidateHfOverrides(text))) << ValidateHfOverrides(text);
    auto c = LoadModelConfig(TinyA(text));
    ASSERT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
    EXPECT_EQ(std::string(c.status().message()).rfind("--hf-overrides: ", 0), 0u) << c.status();
  }
  EXPECT_TRUE(ValidateHfOverrides("").ok());
  EXPECT_TRUE(ValidateHfOverrides(R"({"n_routed_experts": 8})").ok());
}

TEST(HfOverridesTest, StructurallyInvalidResultIsRefusedByTheParser) {
  struct Case {
    const char* overrides;
    const char* field;
    const char* message;
  };
  for (const Case& k : {
           Case{R"({"hidden_size": 100})", "hidden_size", "multiple of 128"},
           Case{R"({"num_hidden_layers": 3})", "compress_ratios", "expected num_hidden_layers"},
           Case{R"({"num_experts_per_tok": 32})", "num_experts_per_tok", "n_routed_experts"},
           Case{R"({"rope_scaling": {"factor": "big"}})", "rope_scaling.factor",
                "must be a number"},
           Case{R"({"vocab_size": null})", "vocab_size", ""},
       }) {
    SCOPED_TRACE(k.overrides);
    auto c = LoadModelConfig(TinyA(k.overrides));
    ASSERT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
    const std::string msg(c.status().message());
    EXPECT_EQ(msg.rfind("tests/data/tiny-a/config.json with --hf-overrides: field '" +
                            std::string(k.field) + "'",
                        0),
              0u)
        << msg;
    EXPECT_NE(msg.find(k.message), std::string::npos) << msg;
  }
}

TEST(HfOverridesTest, MissingConfigIsNotFound) {
  WeightSource s;
  s.model_dir = "tests/data/no-such-model";
  s.hf_overrides = R"({"n_routed_experts": 8})";
  EXPECT_TRUE(absl::IsNotFound(LoadModelConfig(s).status()));
}

}  // namespace
}  // namespace ss
