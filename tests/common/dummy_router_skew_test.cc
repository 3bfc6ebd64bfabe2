// The dummy weights' router skew (common/dummy_weights.h, --dummy-router-skew S): the rankings
// are per-layer permutations independent of the seed; the skew changes the learned layers'
// gate.bias by exactly -S ln(1 + rank) and nothing else (hash tables, gate weights); and the
// router (model::Route) run on unit-RMS inputs sends the hottest quarter of each layer's experts
// well above a quarter of its choices for S > 0 and about a quarter for S = 0, at tiny-a's shapes
// with 64 experts (on unit-RMS inputs, and on the hidden states of the dummy model's own forward)
// and at Flash's (dim 4096, 64 and 256 experts, top-6). The shares are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/dummy_weights.h"
#include "common/model/model.h"
#include "common/model/moe.h"
#include "common/weight_source.h"

namespace ss {
namespace {

constexpr char kTinyA[] = "tests/data/tiny-a";
constexpr char kFlashDir[] = "models/flash";
constexpr int kTokens = 300;

// `n` inputs [n, dim] of unit RMS (the router's input is the RMS-normed hidden state, times the
// ffn_norm weight `norm` when given).
std::vector<float> UnitRmsInputs(int64_t n, int64_t dim, const std::vector<float>* norm,
                                 uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n * dim);
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) {
      x[t * dim + i] = g(rng);
      ss += x[t * dim + i] * x[t * dim + i];
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim));
    for (int64_t i = 0; i < dim; ++i) {
      x[t * dim + i] *= inv * (norm != nullptr ? (*norm)[i] : 1.0f);
    }
  }
  return x;
}

// The share of the router's choices for x [n, dim] that fall in ranking[0 .. E/4).
double HottestQuarterShare(const model::MoeWeights& w, const ModelConfig& c,
                           const std::vector<int32_t>& ranking, const std::vector<float>& x,
                           int64_t n) {
  const int64_t E = c.n_routed_experts;
  std::vector<bool> hot(E, false);
  for (int64_t r = 0; r < E / 4; ++r) hot[ranking[r]] = true;
  const model::RouterResult rr = model::Route(w, c, x.data(), nullptr, n);
  int64_t in_hot = 0;
  for (int32_t e : rr.indices) in_hot += hot[e] ? 1 : 0;
  return static_cast<double>(in_hot) / static_cast<double>(rr.indices.size());
}

WeightSource TinyA64(double skew) {
  WeightSource s;
  s.model_dir = kTinyA;
  s.load_format = LoadFormat::kDummy;
  s.hf_overrides = R"({"n_routed_experts": 64})";
  s.seed = 3;
  s.router_skew = skew;
  return s;
}

// Only the router's tensors and the norms are generated (the rest reads as zeros).
bool RouterTensors(std::string_view name) {
  return name.find("ffn.gate.") != name.npos || name.find("ffn_norm") != name.npos;
}

TEST(DummyRouterSkew, RankingsArePerLayerPermutations) {
  const std::vector<int32_t> a = DummyRouterRanking("layers.3.ffn.gate.bias", 64);
  const std::vector<int32_t> b = DummyRouterRanking("layers.4.ffn.gate.bias", 64);
  const std::vector<int32_t> m = DummyRouterRanking("mtp.0.ffn.gate.bias", 64);
  ASSERT_EQ(a.size(), 64u);
  EXPECT_EQ(std::set<int32_t>(a.begin(), a.end()).size(), 64u);
  EXPECT_EQ(*std::min_element(a.begin(), a.end()), 0);
  EXPECT_EQ(*std::max_element(a.begin(), a.end()), 63);
  EXPECT_EQ(a, DummyRouterRanking("layers.3.ffn.gate.bias", 64)) << "not deterministic";
  EXPECT_NE(a, b);
  EXPECT_NE(a, m);
  // Different hot quarters, not just a different order.
  EXPECT_NE(std::set<int32_t>(a.begin(), a.begin() + 16),
            std::set<int32_t>(b.begin(), b.begin() + 16));
  EXPECT_TRUE(DummyRouterRanking("layers.3.ffn.gate.bias", 0).empty());
}

TEST(DummyRouterSkew, InvalidSkewIsRefused) {
  EXPECT_TRUE(ValidateDummyRouterSkew(0).ok());
  EXPECT_TRUE(ValidateDummyRouterSkew(0.2).ok());
  for (double bad : {-0.1, std::nan(""), HUGE_VAL}) {
    const absl::Status st = ValidateDummyRouterSkew(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("--dummy-router-skew"), std::string_view::npos) << st;
  }
  const ModelConfig c = *LoadModelConfig(TinyA64(0));
  std::vector<uint8_t> out(4 * c.n_routed_experts);
  EXPECT_EQ(FillDummyTensor(c, {"layers.3.ffn.gate.bias", DType::kF32, {c.n_routed_experts}}, 1,
                            out.data(), out.size(), -1.0)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeDummyCheckpoint(c, 1, RouterTensors, nullptr, std::nan("")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DummyRouterSkew, TinyModelHottestQuarterTakesMostChoices) {
  const double kSkew = 0.2;
  auto plain = model::Model::Load(TinyA64(0), {}, RouterTensors);
  auto skewed = model::Model::Load(TinyA64(kSkew), {}, RouterTensors);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(skewed.ok()) << skewed.status();
  const ModelConfig& c = (*skewed)->config();
  ASSERT_EQ(c.n_routed_experts, 64);
  ASSERT_GT(c.n_layers, c.n_hash_layers);
  const model::ModelWeights& p = (*plain)->weights();
  const model::ModelWeights& s = (*skewed)->weights();
  const int64_t E = c.n_routed_experts, dim = c.dim;

  // Every block, the MTP ones too: hash layers and gate weights unchanged, learned biases moved
  // by exactly -S ln(1 + rank).
  std::vector<const model::BlockWeights*> pb, sb;
  std::vector<std::string> names;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    pb.push_back(&p.blocks[l]);
    sb.push_back(&s.blocks[l]);
    names.push_back("layers." + std::to_string(l) + ".ffn.gate.bias");
  }
  for (size_t k = 0; k < s.mtp.size(); ++k) {
    pb.push_back(&p.mtp[k].block);
    sb.push_back(&s.mtp[k].block);
    names.push_back("mtp." + std::to_string(k) + ".ffn.gate.bias");
  }
  ASSERT_GT(sb.size(), static_cast<size_t>(c.n_layers - c.n_hash_layers));
  int learned = 0;
  for (size_t i = 0; i < sb.size(); ++i) {
    const model::MoeWeights& a = pb[i]->moe;
    const model::MoeWeights& b = sb[i]->moe;
    ASSERT_EQ(a.hash, b.hash) << names[i];
    EXPECT_EQ(std::memcmp(a.gate.data, b.gate.data, 2 * E * dim), 0) << names[i];
    if (b.hash) {
      EXPECT_EQ(a.tid2eid, b.tid2eid) << names[i];
      continue;
    }
    ++learned;
    const std::vector<int32_t> ranking = DummyRouterRanking(names[i], E);
    for (int64_t r = 0; r < E; ++r) {
      const int32_t e = ranking[r];
      EXPECT_FLOAT_EQ(b.bias[e], a.bias[e] + static_cast<float>(-kSkew * std::log1p(r)))
          << names[i] << " rank " << r;
    }
    const std::vector<float> x = UnitRmsInputs(kTokens, dim, &sb[i]->ffn_norm, 100 + i);
    const double share_skewed = HottestQuarterShare(b, c, ranking, x, kTokens);
    const double share_plain = HottestQuarterShare(a, c, ranking, x, kTokens);
    std::printf("tiny-a E=%lld top-%lld %s: hottest quarter's share %.3f (S=%.2f), %.3f (S=0)\n",
                static_cast<long long>(E), static_cast<long long>(c.n_activated_experts),
                names[i].c_str(), share_skewed, kSkew, share_plain);
    EXPECT_GT(share_skewed, 0.45) << names[i];
    EXPECT_LT(share_plain, 0.35) << names[i];
    EXPECT_GT(share_plain, 0.15) << names[i];
  }
  EXPECT_EQ(learned, static_cast<int>(sb.size()) - static_cast<int>(c.n_hash_layers));
}

// The same through the whole dummy model: the router's inputs are the hidden states of random
// prompts after each block (not the unit-RMS stand-ins above), the choices the blocks' own.
TEST(DummyRouterSkew, ForwardOfTheTinyModelPrefersTheHotQuarter) {
  const double kSkew = 0.2;
  for (double skew : {0.0, kSkew}) {
    auto m = model::Model::Load(TinyA64(skew));
    ASSERT_TRUE(m.ok()) << m.status();
    const model::Model& model = **m;
    const ModelConfig& c = model.config();
    const int64_t E = c.n_routed_experts, n = 128, width = c.hc_mult * c.dim;
    std::mt19937 rng(11);
    std::vector<int64_t> hot_choices(c.n_layers, 0), choices(c.n_layers, 0);
    for (int prompt = 0; prompt < 3; ++prompt) {
      std::vector<int64_t> tokens(n);
      for (int64_t& t : tokens) t = static_cast<int64_t>(rng() % c.vocab_size);
      model::SequenceState st = model.NewSequence();
      const model::ChunkRef chunk{&st, tokens.data(), n, 0};
      std::vector<float> h(n * width), next(n * width);
      model.EmbedStreams(tokens.data(), n, h.data());
      for (int64_t l = 0; l < c.n_layers; ++l) {
        model::BlockTrace trace;
        model.RunBlock(l, {&chunk, 1}, h.data(), next.data(), &trace);
        h.swap(next);
        const std::vector<int32_t> ranking =
            DummyRouterRanking("layers." + std::to_string(l) + ".ffn.gate.bias", E);
        std::vector<bool> hot(E, false);
        for (int64_t r = 0; r < E / 4; ++r) hot[ranking[r]] = true;
        for (int32_t e : trace.router.indices) hot_choices[l] += hot[e] ? 1 : 0;
        choices[l] += static_cast<int64_t>(trace.router.indices.size());
      }
    }
    for (int64_t l = c.n_hash_layers; l < c.n_layers; ++l) {
      const double share = static_cast<double>(hot_choices[l]) / static_cast<double>(choices[l]);
      std::printf("tiny-a E=%lld forward, layer %lld, S=%.2f: hottest quarter's share %.3f\n",
                  static_cast<long long>(E), static_cast<long long>(l), skew, share);
      if (skew > 0) {
        EXPECT_GT(share, 0.45) << "layer " << l;
      } else {
        EXPECT_LT(share, 0.4) << "layer " << l;
      }
    }
  }
}

// Flash's router shapes (dim 4096, top-6) with 64 and 256 experts, one layer, the gate and bias
// generated by FillDummyTensor as every process generates them.
TEST(DummyRouterSkew, FlashShapesShares) {
  WeightSource flash_source;
  flash_source.model_dir = kFlashDir;
  auto flash = LoadModelConfig(flash_source);
  ASSERT_TRUE(flash.ok()) << flash.status();
  const std::string layer = "layers.7.ffn.gate";
  for (int64_t E : {64, 256}) {
    ModelConfig c = *flash;
    c.n_routed_experts = E;
    const int64_t dim = c.dim;
    std::vector<uint8_t> gate(2 * E * dim);
    ASSERT_TRUE(
        FillDummyTensor(c, {layer + ".weight", DType::kBF16, {E, dim}}, 1, gate.data(), gate.size())
            .ok());
    model::MoeWeights w;
    w.gate = {gate.data(), E, dim};
    const std::vector<int32_t> ranking = DummyRouterRanking(layer + ".bias", E);
    const std::vector<float> x = UnitRmsInputs(kTokens, dim, nullptr, 7);
    double last = 0;
    for (double skew : {0.0, 0.1, 0.2, 0.3}) {
      w.bias.assign(E, 0.0f);
      ASSERT_TRUE(FillDummyTensor(c, {layer + ".bias", DType::kF32, {E}}, 1,
                                  reinterpret_cast<uint8_t*>(w.bias.data()), 4 * E, skew)
                      .ok());
      const double share = HottestQuarterShare(w, c, ranking, x, kTokens);
      std::printf("Flash dim %lld E=%lld top-%lld S=%.2f: hottest quarter's share %.3f\n",
                  static_cast<long long>(dim), static_cast<long long>(E),
                  static_cast<long long>(c.n_activated_experts), skew, share);
      if (skew == 0) {
        EXPECT_LT(share, 0.35) << E;
        EXPECT_GT(share, 0.15) << E;
      } else {
        EXPECT_GT(share, last) << E << " S " << skew;
      }
      if (skew == 0.2) {
        EXPECT_GT(share, 0.5) << E;
      }
      last = share;
    }
  }
}

}  // namespace
}  // namespace ss
