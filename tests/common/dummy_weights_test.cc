// Dummy weights (common/dummy_weights.h): the same bytes for any thread count, filter and call;
// valid codes in every native format; a checkpoint that passes the schema; tid2eid rows of
// distinct ids; Flash-shaped tensors with the init rules' std; a 43-layer model with Flash's
// layer pattern (small dims) whose logits stay finite; Model::Load of a dummy source binding
// through the same code as a real load, with rejected tensors reading as zeros.
#include "common/dummy_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/checkpoint_schema.h"
#include "common/codecs.h"
#include "common/model/model.h"
#include "common/thread_pool.h"
#include "common/weight_source.h"
#include "nlohmann/json.hpp"

namespace ss {
namespace {

constexpr char kTinyA[] = "tests/data/tiny-a";
constexpr char kFlash[] = "models/flash/config.json";

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ModelConfig TinyA() {
  auto c = LoadModelConfig(std::string(kTinyA));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::unique_ptr<ThreadPool> Pool(int n) {
  ThreadPoolOptions o;
  o.num_threads = n;
  o.spin_us = 0;
  return *ThreadPool::Create(o);
}

std::unique_ptr<Checkpoint> Make(const ModelConfig& c, uint64_t seed, const TensorFilter& f,
                                 ThreadPool* pool) {
  auto ck = MakeDummyCheckpoint(c, seed, f, pool);
  EXPECT_TRUE(ck.ok()) << ck.status();
  return ck.ok() ? std::move(*ck) : nullptr;
}

bool AllZero(const TensorView& v) {
  for (size_t i = 0; i < v.nbytes; ++i) {
    if (v.data[i] != 0) return false;
  }
  return true;
}

TEST(DummyWeights, SameBytesForAnyThreadCountFilterAndCall) {
  const ModelConfig c = TinyA();
  auto pool = Pool(2);
  auto one = Make(c, 7, nullptr, nullptr);
  auto two = Make(c, 7, nullptr, pool.get());
  auto again = Make(c, 7, nullptr, pool.get());
  const TensorFilter stage = StageTensors(c, 2, 4, false, true, false, false);
  auto filtered = Make(c, 7, stage, pool.get());
  auto other_seed = Make(c, 8, nullptr, nullptr);
  ASSERT_TRUE(one && two && again && filtered && other_seed);
  size_t kept = 0, zeroed = 0, differ = 0;
  for (const auto& [name, v] : one->tensors()) {
    const TensorView* b = two->Find(name);
    const TensorView* a = again->Find(name);
    const TensorView* f = filtered->Find(name);
    ASSERT_TRUE(b && a && f) << name;
    ASSERT_EQ(v->nbytes, b->nbytes);
    EXPECT_EQ(std::memcmp(v->data, b->data, v->nbytes), 0) << name << ": 1 vs 2 threads";
    EXPECT_EQ(std::memcmp(v->data, a->data, v->nbytes), 0) << name << ": second call";
    if (stage(name)) {
      EXPECT_EQ(std::memcmp(v->data, f->data, v->nbytes), 0) << name << ": filtered";
      ++kept;
    } else {
      EXPECT_TRUE(AllZero(*f)) << name << " is rejected by the filter but not zero";
      ++zeroed;
    }
    const TensorView* o = other_seed->Find(name);
    if (v->nbytes > 64 && std::memcmp(v->data, o->data, v->nbytes) != 0) ++differ;
  }
  EXPECT_GT(kept, 50u);
  EXPECT_GT(zeroed, 500u);
  EXPECT_GT(differ, 100u) << "another seed should change the tensors";
}

TEST(DummyWeights, StageTensorsSelectsTheStagesTensors) {
  const ModelConfig c = TinyA();
  const TensorFilter f = StageTensors(c, 2, 4, true, false, true, false);
  EXPECT_TRUE(f("embed.weight"));
  EXPECT_FALSE(f("head.weight"));
  EXPECT_FALSE(f("norm.weight"));
  EXPECT_FALSE(f("hc_head_fn"));
  EXPECT_FALSE(f("layers.1.attn.wq_a.weight"));
  EXPECT_TRUE(f("layers.2.attn.wq_a.weight"));
  EXPECT_TRUE(f("layers.3.ffn.shared_experts.w1.scale"));
  EXPECT_FALSE(f("layers.3.ffn.experts.0.w1.weight"));
  EXPECT_FALSE(f("layers.4.attn_norm.weight"));
  EXPECT_FALSE(f("layers.12.attn_norm.weight"));
  EXPECT_TRUE(f("mtp.0.e_proj.weight"));
  EXPECT_FALSE(f("mtp.0.ffn.experts.3.w2.scale"));
  const TensorFilter g = StageTensors(c, 0, 7, false, true, false, true);
  EXPECT_TRUE(g("layers.6.ffn.experts.15.w2.weight"));
  EXPECT_TRUE(g("head.weight"));
  EXPECT_TRUE(g("hc_head_scale"));
  EXPECT_FALSE(g("embed.weight"));
  EXPECT_FALSE(g("mtp.0.hc_head_fn"));
}

TEST(DummyWeights, ValidCodesAndSchema) {
  const ModelConfig c = TinyA();
  auto pool = Pool(2);
  auto ck = Make(c, 3, nullptr, pool.get());
  ASSERT_TRUE(ck);
  std::vector<std::string> unexpected;
  ASSERT_TRUE(ValidateCheckpoint(*ck, c, &unexpected).ok());
  EXPECT_TRUE(unexpected.empty());
  int tid_tensors = 0;
  for (const auto& [name, v] : ck->tensors()) {
    switch (v->dtype) {
      case DType::kF8E4M3:
        for (size_t i = 0; i < v->nbytes; ++i) {
          ASSERT_NE(v->data[i] & 0x7f, 0x7f) << name << " byte " << i << " is an e4m3 NaN";
        }
        break;
      case DType::kF8E8M0:
        for (size_t i = 0; i < v->nbytes; ++i) ASSERT_NE(v->data[i], 0xff) << name;
        break;
      case DType::kBF16:
        for (size_t i = 0; i < v->nbytes / 2; ++i) {
          uint16_t b;
          std::memcpy(&b, v->data + 2 * i, 2);
          ASSERT_TRUE(std::isfinite(Bf16ToFloat(b))) << name;
        }
        break;
      case DType::kF32:
        for (size_t i = 0; i < v->nbytes / 4; ++i) {
          float f;
          std::memcpy(&f, v->data + 4 * i, 4);
          ASSERT_TRUE(std::isfinite(f)) << name;
        }
        break;
      case DType::kI64: {
        ++tid_tensors;
        const int64_t rows = v->shape[0], k = v->shape[1];
        for (int64_t r = 0; r < rows; ++r) {
          std::set<int64_t> ids;
          for (int64_t j = 0; j < k; ++j) {
            int64_t e;
            std::memcpy(&e, v->data + 8 * (r * k + j), 8);
            ASSERT_GE(e, 0) << name;
            ASSERT_LT(e, c.n_routed_experts) << name;
            ids.insert(e);
          }
          ASSERT_EQ(static_cast<int64_t>(ids.size()), k) << name << " row " << r;
        }
        break;
      }
      default:
        break;
    }
  }
  EXPECT_EQ(tid_tensors, c.n_hash_layers);
}

TEST(CheckpointFromMemory, IndexesViewsAndRejectsBadOnes) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(64, 7);
  auto view = [&](std::string name, std::vector<int64_t> shape, size_t nbytes) {
    TensorView v;
    v.name = std::move(name);
    v.dtype = DType::kBF16;
    v.shape = std::move(shape);
    v.data = bytes->data();
    v.nbytes = nbytes;
    return v;
  };
  auto ok = Checkpoint::FromMemory("mem", {view("a", {4, 2}, 16), view("b", {32}, 64)}, bytes);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_NE((*ok)->Find("b"), nullptr);
  EXPECT_EQ((*ok)->Find("b")->file, "mem");
  EXPECT_TRUE((*ok)->Get("a", DType::kBF16, {4, 2}).ok());
  EXPECT_TRUE(absl::IsNotFound((*ok)->Get("c", DType::kBF16, {1}).status()));
  auto twice = Checkpoint::FromMemory("mem", {view("a", {8}, 16), view("a", {8}, 16)}, bytes);
  EXPECT_NE(twice.status().message().find("twice"), std::string_view::npos) << twice.status();
  auto short_view = Checkpoint::FromMemory("mem", {view("a", {9}, 16)}, bytes);
  EXPECT_TRUE(absl::IsInvalidArgument(short_view.status()));
}

uint64_t Fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

// The bytes are pinned: every process of a cluster (and every ISA path of the generator: the
// vectorised code lookup must give the scalar loop's bytes) generates exactly these.
TEST(DummyWeights, KnownBytes) {
  const ModelConfig c = TinyA();
  const std::pair<ExpectedTensor, uint64_t> cases[] = {
      {{"layers.3.attn.wq_a.weight", DType::kF8E4M3, {128, 256}}, 0x70623cb316a623f9},
      {{"layers.3.ffn.experts.2.w1.weight", DType::kI8, {128, 128}}, 0x81fcc3d46777ddd4},
      {{"layers.3.ffn.experts.2.w2.weight", DType::kI8, {256, 40}},
       0x1286914bedca61c1},  // 40: a short tail
      {{"layers.3.ffn.gate.weight", DType::kBF16, {16, 256}}, 0xee12f1cdc9d88fa2},
      {{"layers.0.ffn.gate.tid2eid", DType::kI64, {1024, 4}}, 0x4f03c674f59644c9},
  };
  for (const auto& [t, want] : cases) {
    size_t n = DTypeSize(t.dtype);
    for (int64_t d : t.shape) n *= d;
    std::vector<uint8_t> out(n);
    ASSERT_TRUE(FillDummyTensor(c, t, 11, out.data(), n).ok()) << t.name;
    EXPECT_EQ(Fnv1a(out), want) << t.name;
  }
}

TEST(DummyWeights, FillRejectsSizeMismatchAndUnknownTensors) {
  const ModelConfig c = TinyA();
  std::vector<uint8_t> buf(64);
  const ExpectedTensor t{"layers.0.attn.attn_sink", DType::kF32, {c.n_heads}};
  EXPECT_TRUE(absl::IsInvalidArgument(FillDummyTensor(c, t, 1, buf.data(), 3)));
  const ExpectedTensor odd{"layers.0.mystery", DType::kF32, {4}};
  EXPECT_TRUE(absl::IsInternal(FillDummyTensor(c, odd, 1, buf.data(), 16)));
}

// Mean and std of decoded values.
struct Stats {
  double mean = 0, std = 0;
};
Stats Moments(const std::vector<double>& v) {
  double s = 0, ss = 0;
  for (double x : v) s += x;
  const double mean = s / v.size();
  for (double x : v) ss += (x - mean) * (x - mean);
  return {mean, std::sqrt(ss / v.size())};
}

ModelConfig Flash() {
  auto c = ParseModelConfig(ReadText(kFlash), kFlash);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<uint8_t> Fill(const ModelConfig& c, const ExpectedTensor& t) {
  size_t n = DTypeSize(t.dtype);
  for (int64_t d : t.shape) n *= d;
  std::vector<uint8_t> out(n);
  const absl::Status st = FillDummyTensor(c, t, 11, out.data(), n);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// An MXFP4 expert matrix decoded with its scales.
Stats Fp4Stats(const ModelConfig& c, const std::string& p, int64_t out, int64_t in) {
  const auto w = Fill(c, {p + ".weight", DType::kI8, {out, in / 2}});
  const auto s = Fill(c, {p + ".scale", DType::kF8E8M0, {out, in / 32}});
  std::vector<double> v(out * in);
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t j = 0; j < in; ++j) {
      const uint8_t b = w[(r * in + j) / 2];
      v[r * in + j] =
          E2m1ToFloat(j % 2 == 0 ? b & 15 : b >> 4) * Ue8m0ToFloat(s[r * (in / 32) + j / 32]);
    }
  }
  return Moments(v);
}

Stats Fp8Stats(const ModelConfig& c, const std::string& p, int64_t out, int64_t in) {
  const auto w = Fill(c, {p + ".weight", DType::kF8E4M3, {out, in}});
  const auto s = Fill(c, {p + ".scale", DType::kF8E8M0, {(out + 127) / 128, (in + 127) / 128}});
  std::vector<double> v(out * in);
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t j = 0; j < in; ++j) {
      v[r * in + j] =
          E4m3ToFloat(w[r * in + j]) * Ue8m0ToFloat(s[r / 128 * ((in + 127) / 128) + j / 128]);
    }
  }
  return Moments(v);
}

TEST(DummyWeights, FlashShapedTensorsHaveTheRulesStd) {
  const ModelConfig c = Flash();
  const int64_t d = c.dim, I = c.moe_inter_dim;
  auto near = [](double got, double want) { return std::fabs(got / want - 1) < 0.1; };
  const Stats w1 = Fp4Stats(c, "layers.7.ffn.experts.200.w1", I, d);
  EXPECT_TRUE(near(w1.std, 8 / std::sqrt(d))) << w1.std;
  EXPECT_LT(std::fabs(w1.mean), 0.02 * w1.std);
  const Stats w2 = Fp4Stats(c, "layers.7.ffn.experts.200.w2", d, I);
  EXPECT_TRUE(near(w2.std, 0.25 / std::sqrt(I))) << w2.std;
  const Stats wq_a = Fp8Stats(c, "layers.7.attn.wq_a", c.q_lora_rank, d);
  EXPECT_TRUE(near(wq_a.std, 1 / std::sqrt(d))) << wq_a.std;
  EXPECT_LT(std::fabs(wq_a.mean), 0.02 * wq_a.std);
  const Stats sh1 = Fp8Stats(c, "layers.7.ffn.shared_experts.w1", I, d);
  EXPECT_TRUE(near(sh1.std, 8 / std::sqrt(d))) << sh1.std;
  const Stats sh2 = Fp8Stats(c, "layers.7.ffn.shared_experts.w2", d, I);
  EXPECT_TRUE(near(sh2.std, 0.25 / std::sqrt(I))) << sh2.std;

  const auto gate = Fill(c, {"layers.7.ffn.gate.weight", DType::kBF16, {c.n_routed_experts, d}});
  std::vector<double> g(gate.size() / 2);
  for (size_t i = 0; i < g.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, gate.data() + 2 * i, 2);
    g[i] = Bf16ToFloat(b);
  }
  EXPECT_TRUE(near(Moments(g).std, 1 / std::sqrt(d))) << Moments(g).std;
  const auto norm = Fill(c, {"layers.7.attn_norm.weight", DType::kBF16, {d}});
  std::vector<double> n(d);
  for (int64_t i = 0; i < d; ++i) {
    uint16_t b;
    std::memcpy(&b, norm.data() + 2 * i, 2);
    n[i] = Bf16ToFloat(b);
  }
  EXPECT_NEAR(Moments(n).mean, 1.0, 0.01);
  EXPECT_TRUE(near(Moments(n).std, 0.1)) << Moments(n).std;
}

// Flash's config with small dims and the 43-layer pattern kept (compress ratios, hash layers,
// top-6 routing, hc_mult 4, the MTP block).
std::string SmallFlashJson() {
  nlohmann::json j = nlohmann::json::parse(ReadText(kFlash));
  j["vocab_size"] = 512;
  j["hidden_size"] = 256;
  j["num_attention_heads"] = 4;
  j["head_dim"] = 128;
  j["q_lora_rank"] = 128;
  j["o_groups"] = 2;
  j["o_lora_rank"] = 128;
  j["sliding_window"] = 16;
  j["index_n_heads"] = 4;
  j["index_head_dim"] = 64;
  j["index_topk"] = 8;
  j["n_routed_experts"] = 16;
  j["moe_intermediate_size"] = 128;
  j["max_position_embeddings"] = 4096;
  return j.dump();
}

TEST(DummyWeights, FortyThreeLayerModelHasFiniteLogits) {
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) /
                                    ("ss_dummy_flash43_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "config.json") << SmallFlashJson(); }
  WeightSource src;
  src.model_dir = dir.string();
  src.load_format = LoadFormat::kDummy;
  src.seed = 1;
  auto m = model::Model::Load(src);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const model::Model& model = **m;
  ASSERT_EQ(model.config().n_layers, 43);
  model::SequenceState st = model.NewSequence();
  std::vector<int64_t> tokens(24);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 37 + 5) % 512;
  for (int step = 0; step < 2; ++step) {  // a prefill, then one decode step
    const int64_t start = step == 0 ? 0 : 20, n = step == 0 ? 20 : 4;
    const model::ChunkRef chunk{&st, tokens.data() + start, n, start};
    auto logits = model.Forward({&chunk, 1});
    ASSERT_TRUE(logits.ok()) << logits.status();
    const std::vector<float>& l = (*logits)[0];
    ASSERT_EQ(static_cast<int64_t>(l.size()), 512);
    std::vector<double> v(l.begin(), l.end());
    for (double x : v) ASSERT_TRUE(std::isfinite(x)) << "step " << step;
    const Stats s = Moments(v);
    EXPECT_GT(s.std, 1e-3) << "constant logits at step " << step;
    EXPECT_LT(s.std, 1e3) << "logits blew up at step " << step;
  }
}

TEST(DummyWeights, ModelLoadBindsDummyWeightsLikeARealLoad) {
  WeightSource src;
  src.model_dir = kTinyA;
  src.load_format = LoadFormat::kDummy;
  src.seed = 5;
  const ModelConfig c = TinyA();
  auto m = model::Model::Load(src, {}, StageTensors(c, 0, 3, true, false, false, false));
  ASSERT_TRUE(m.ok()) << m.status();
  const model::ModelWeights& w = (*m)->weights();
  auto full = Make(c, 5, nullptr, nullptr);
  ASSERT_TRUE(full);
  const TensorView* wq = full->Find("layers.1.attn.wq_a.weight");
  ASSERT_EQ(std::memcmp(w.blocks[1].attn.wq_a.w, wq->data, wq->nbytes), 0);
  const TensorView* embed = full->Find("embed.weight");
  EXPECT_EQ(std::memcmp(w.embed.data, embed->data, embed->nbytes), 0);
  // Rejected: the head and layer 5 read as zeros, the routed experts too.
  EXPECT_EQ(w.head.data[0] | w.head.data[w.head.rows * w.head.cols * 2 - 1], 0);
  EXPECT_EQ(w.blocks[5].attn.wq_a.w[0], 0);
  EXPECT_EQ(w.blocks[1].moe.experts[3].w1.w[7], 0);
  EXPECT_EQ(w.blocks[5].attn_norm, std::vector<float>(c.dim, 0.0f));

  // The same source read as safetensors is tiny-a itself.
  src.load_format = LoadFormat::kSafetensors;
  auto real = model::Model::Load(src);
  ASSERT_TRUE(real.ok()) << real.status();
  auto ref = Checkpoint::Open(kTinyA);
  ASSERT_TRUE(ref.ok());
  const TensorView* r = (*ref)->Find("layers.1.attn.wq_a.weight");
  EXPECT_EQ(std::memcmp((*real)->weights().blocks[1].attn.wq_a.w, r->data, r->nbytes), 0);
}

}  // namespace
}  // namespace ss
