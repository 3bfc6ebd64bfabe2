#include "common/checkpoint_schema.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "tests/tools/test_configs.h"

namespace ss {
namespace {

namespace fs = std::filesystem;
constexpr const char* kTinyDir = "tests/data/tiny-a";

std::map<std::string, int> DTypeCounts(const std::vector<ExpectedTensor>& ts) {
  std::map<std::string, int> counts;
  for (const ExpectedTensor& t : ts) ++counts[std::string(DTypeName(t.dtype))];
  return counts;
}

TEST(CheckpointSchemaTest, TinyAMatchesExactly) {
  auto c = LoadModelConfig(kTinyDir);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<ExpectedTensor> expected = ExpectedTensors(*c);
  EXPECT_EQ(expected.size(), 1057u);
  EXPECT_EQ(
      DTypeCounts(expected),
      (std::map<std::string, int>{
          {"BF16", 73}, {"F32", 75}, {"F8_E4M3", 69}, {"F8_E8M0", 453}, {"I64", 3}, {"I8", 384}}));
  std::set<std::string> names;
  for (const ExpectedTensor& t : expected) EXPECT_TRUE(names.insert(t.name).second) << t.name;

  auto ckpt = Checkpoint::Open(kTinyDir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->tensors().size(), 1057u);
  std::vector<std::string> unexpected = {"keep-me"};
  absl::Status s = ValidateCheckpoint(**ckpt, *c, &unexpected);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(unexpected, std::vector<std::string>{"keep-me"}) << "appends only";
  EXPECT_TRUE(ValidateCheckpoint(**ckpt, *c, nullptr).ok());
}

TEST(CheckpointSchemaTest, SpotShapes) {
  auto c = LoadModelConfig(kTinyDir);
  ASSERT_TRUE(c.ok()) << c.status();
  std::map<std::string, ExpectedTensor> by_name;
  for (ExpectedTensor& t : ExpectedTensors(*c)) by_name.emplace(t.name, t);
  auto shape = [&](const std::string& n) {
    auto it = by_name.find(n);
    return it == by_name.end() ? std::vector<int64_t>{-1} : it->second.shape;
  };
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape("layers.0.ffn.gate.tid2eid"), (S{1024, 4}));
  EXPECT_EQ(shape("layers.3.ffn.gate.bias"), (S{16}));
  EXPECT_EQ(shape("layers.2.attn.compressor.ape"), (S{4, 256}));
  EXPECT_EQ(shape("layers.3.attn.compressor.ape"), (S{128, 128}));
  EXPECT_EQ(shape("layers.2.attn.indexer.compressor.wkv.weight"), (S{256, 256}));
  EXPECT_EQ(shape("layers.6.ffn.experts.15.w2.weight"), (S{256, 64}));
  EXPECT_EQ(shape("layers.6.ffn.experts.15.w2.scale"), (S{256, 4}));
  EXPECT_EQ(shape("mtp.0.hc_head_fn"), (S{4, 1024}));
  EXPECT_EQ(by_name.count("layers.3.attn.indexer.wq_b.weight"), 0u) << "HCA has no indexer";
  EXPECT_EQ(by_name.count("mtp.0.ffn.gate.tid2eid"), 0u) << "MTP routes with a bias";
  EXPECT_EQ(by_name.count("mtp.0.attn.compressor.ape"), 0u) << "MTP is SWA-only";
}

// The real Flash inventory (spec §0.1, [VAL]): 69,187 tensors, 159,609,485,896 bytes.
TEST(CheckpointSchemaTest, FlashInventoryMatchesTheHub) {
  auto c = ParseModelConfig(testing_util::kFlashConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<ExpectedTensor> expected = ExpectedTensors(*c);
  EXPECT_EQ(expected.size(), 69187u);
  EXPECT_EQ(DTypeCounts(expected), (std::map<std::string, int>{{"BF16", 433},
                                                               {"F32", 417},
                                                               {"F8_E4M3", 375},
                                                               {"F8_E8M0", 34167},
                                                               {"I64", 3},
                                                               {"I8", 33792}}));
  int64_t bytes = 0;
  for (const ExpectedTensor& t : expected) {
    int64_t n = static_cast<int64_t>(DTypeSize(t.dtype));
    for (int64_t d : t.shape) n *= d;
    bytes += n;
  }
  EXPECT_EQ(bytes, 159609485896);
}

// Re-writes tiny-a with one edit into a temp dir and validates the copy.
class CheckpointSchemaCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = LoadModelConfig(kTinyDir);
    ASSERT_TRUE(c.ok()) << c.status();
    config_ = *c;
    auto ckpt = Checkpoint::Open(kTinyDir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    for (const auto& [name, v] : (*ckpt)->tensors()) {
      tensors_.push_back({name, v->dtype, v->shape, {v->data, v->data + v->nbytes}});
    }
  }
  TensorToWrite& Tensor(const std::string& name) {
    for (TensorToWrite& t : tensors_) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no tensor " << name;
    return tensors_.front();
  }
  absl::Status Validate(std::vector<std::string>* unexpected) {
    absl::Status w = WriteSafetensors(dir_ + "/model.safetensors", tensors_);
    if (!w.ok()) return w;
    auto ckpt = Checkpoint::Open(dir_);
    if (!ckpt.ok()) return ckpt.status();
    return ValidateCheckpoint(**ckpt, config_, unexpected);
  }
  std::string file() const { return dir_ + "/model.safetensors"; }

  ModelConfig config_;
  std::vector<TensorToWrite> tensors_;
  testing_util::TempDir tmp_{"ss_schema"};
  const std::string dir_ = tmp_.path();
};

TEST_F(CheckpointSchemaCopyTest, UnmodifiedCopyValidates) {
  std::vector<std::string> unexpected;
  EXPECT_TRUE(Validate(&unexpected).ok());
  EXPECT_TRUE(unexpected.empty());
}

TEST_F(CheckpointSchemaCopyTest, MissingTensor) {
  std::erase_if(tensors_,
                [](const TensorToWrite& t) { return t.name == "layers.3.ffn.gate.bias"; });
  absl::Status s = Validate(nullptr);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(s.message(), dir_ + ": missing tensor 'layers.3.ffn.gate.bias' (expected F32 [16])");
}

TEST_F(CheckpointSchemaCopyTest, WrongDtype) {
  Tensor("layers.0.attn.attn_sink").dtype = DType::kI32;  // same byte size
  absl::Status s = Validate(nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "layers.0.attn.attn_sink in " + file() + ": dtype I32, expected F32");
}

TEST_F(CheckpointSchemaCopyTest, WrongShape) {
  Tensor("norm.weight").shape = {16, 16};
  absl::Status s = Validate(nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "norm.weight in " + file() + ": shape [16, 16], expected [256]");
}

TEST_F(CheckpointSchemaCopyTest, ExtraTensorsAreReportedNotFatal) {
  tensors_.push_back({"mtp.0.main_norm.weight", DType::kBF16, {256}, std::vector<uint8_t>(512)});
  tensors_.push_back({"extra", DType::kU8, {1}, {7}});
  std::vector<std::string> unexpected;
  absl::Status s = Validate(&unexpected);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(unexpected, (std::vector<std::string>{"extra", "mtp.0.main_norm.weight"}));
}

}  // namespace
}  // namespace ss
