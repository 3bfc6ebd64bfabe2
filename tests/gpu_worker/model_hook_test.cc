// The routed-experts hook of the reference model (common/model: RoutedExperts, the RunBlock
// overload, RoutedSum): a provider that returns the reference's routed sum gives bit-identical
// blocks and logits; what the provider sees; errors pass through; timings are filled.
#include <cstring>
#include <memory>
#include <vector>

#include "common/bf16.h"
#include "common/model/model.h"
#include "common/model/moe.h"
#include "gtest/gtest.h"

namespace ss::model {
namespace {

constexpr char kTinyA[] = "tests/data/tiny-a";

// The reference's routed sum, computed "elsewhere", with a record of what it was given.
class ReferenceExperts : public RoutedExperts {
 public:
  explicit ReferenceExperts(const Model& m) : m_(m) {}
  absl::Status Compute(int64_t layer, int64_t T, const float* x, const int32_t* ids,
                       const float* weights, int top_k, float* out) const override {
    const ModelConfig& c = m_.config();
    ++calls;
    rows += T;
    EXPECT_EQ(top_k, c.n_activated_experts);
    for (int64_t i = 0; i < T * c.dim; ++i) {
      if (RoundBf16(x[i]) != x[i]) ++non_bf16;
    }
    if (fail_layer == layer) return absl::UnavailableError("expert worker gone");
    RouterResult r;
    r.indices.assign(ids, ids + T * top_k);
    r.weights.assign(weights, weights + T * top_k);
    const MoeWeights& w = layer < c.n_layers ? m_.weights().blocks[layer].moe
                                             : m_.weights().mtp[layer - c.n_layers].block.moe;
    std::fill_n(out, T * c.dim, 12345.0f);  // overwritten by RoutedSum
    RoutedSum(w, c, x, r, T, out);
    return absl::OkStatus();
  }
  mutable int calls = 0;
  mutable int64_t rows = 0, non_bf16 = 0;
  int64_t fail_layer = -1;

 private:
  const Model& m_;
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ModelHook : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = Model::Load(kTinyA);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  std::unique_ptr<Model> model_;
};

TEST_F(ModelHook, ProviderGivesBitIdenticalBlocksAndLogits) {
  const Model& m = *model_;
  const ModelConfig& c = m.config();
  const int64_t width = c.hc_mult * c.dim;
  ReferenceExperts experts(m);
  // Two sequences: a prefill of 9 and 5 tokens, then three one-token decode steps.
  std::vector<std::vector<int64_t>> steps_a = {
      {3, 17, 99, 250, 7, 8, 1000, 42, 5}, {77}, {78}, {79}};
  std::vector<std::vector<int64_t>> steps_b = {{11, 12, 13, 14, 15}, {600}, {601}, {602}};
  SequenceState ra = m.NewSequence(), rb = m.NewSequence();  // local experts
  SequenceState pa = m.NewSequence(), pb = m.NewSequence();  // through the provider
  for (size_t s = 0; s < steps_a.size(); ++s) {
    const int64_t na = static_cast<int64_t>(steps_a[s].size()),
                  nb = static_cast<int64_t>(steps_b[s].size());
    std::vector<ChunkRef> ref = {{&ra, steps_a[s].data(), na, ra.next_pos},
                                 {&rb, steps_b[s].data(), nb, rb.next_pos}};
    std::vector<ChunkRef> via = {{&pa, steps_a[s].data(), na, pa.next_pos},
                                 {&pb, steps_b[s].data(), nb, pb.next_pos}};
    const int64_t T = na + nb;
    std::vector<float> h(T * width), h2(T * width), g(T * width), g2(T * width);
    m.EmbedStreams(steps_a[s].data(), na, h.data());
    m.EmbedStreams(steps_b[s].data(), nb, h.data() + na * width);
    g = h;
    BlockTimings timings;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      m.RunBlock(l, ref, h.data(), h2.data(), nullptr);
      const absl::Status st = m.RunBlock(l, via, g.data(), g2.data(), &experts, &timings);
      ASSERT_TRUE(st.ok()) << st;
      h.swap(h2);
      g.swap(g2);
      ASSERT_TRUE(SameBits(h, g)) << "step " << s << ", layer " << l;
    }
    EXPECT_GT(timings.attention, 0.0);
    EXPECT_GT(timings.moe, 0.0);
    EXPECT_GT(timings.moe_cpu, 0.0);
    std::vector<float> la(c.vocab_size), lb(c.vocab_size);
    m.Logits(h.data() + (T - 1) * width, la.data());
    m.Logits(g.data() + (T - 1) * width, lb.data());
    EXPECT_TRUE(SameBits(la, lb)) << "step " << s;
    ra.next_pos += na;
    rb.next_pos += nb;
    pa.next_pos += na;
    pb.next_pos += nb;
  }
  EXPECT_EQ(experts.calls, 4 * c.n_layers);
  EXPECT_EQ(experts.rows, (14 + 2 + 2 + 2) * c.n_layers);
  EXPECT_EQ(experts.non_bf16, 0);  // the MoE input is bf16-valued, as the wire format needs
}

TEST_F(ModelHook, NullProviderIsTheLocalMoeAndMatchesForward) {
  const Model& m = *model_;
  const ModelConfig& c = m.config();
  const int64_t width = c.hc_mult * c.dim;
  std::vector<int64_t> tokens = {5, 6, 7, 8};
  SequenceState a = m.NewSequence(), b = m.NewSequence();
  std::vector<ChunkRef> fa = {{&a, tokens.data(), 4, 0}};
  auto logits = m.Forward(fa);
  ASSERT_TRUE(logits.ok()) << logits.status();
  std::vector<ChunkRef> fb = {{&b, tokens.data(), 4, 0}};
  std::vector<float> h(4 * width), h2(4 * width);
  m.EmbedStreams(tokens.data(), 4, h.data());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    ASSERT_TRUE(m.RunBlock(l, fb, h.data(), h2.data(), nullptr, nullptr).ok());
    h.swap(h2);
  }
  std::vector<float> got(c.vocab_size);
  m.Logits(h.data() + 3 * width, got.data());
  EXPECT_TRUE(SameBits(got, (*logits)[0]));
}

TEST_F(ModelHook, ProviderErrorsPassThrough) {
  const Model& m = *model_;
  const ModelConfig& c = m.config();
  const int64_t width = c.hc_mult * c.dim;
  ReferenceExperts experts(m);
  experts.fail_layer = 2;
  std::vector<int64_t> tokens = {1, 2, 3};
  SequenceState s = m.NewSequence();
  std::vector<ChunkRef> ch = {{&s, tokens.data(), 3, 0}};
  std::vector<float> h(3 * width), h2(3 * width);
  m.EmbedStreams(tokens.data(), 3, h.data());
  absl::Status st;
  for (int64_t l = 0; l < c.n_layers && st.ok(); ++l) {
    st = m.RunBlock(l, ch, h.data(), h2.data(), &experts, nullptr);
    h.swap(h2);
  }
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), "expert worker gone");
  EXPECT_EQ(experts.calls, 3);
}

TEST_F(ModelHook, MoeForwardOverloadsAgree) {
  const Model& m = *model_;
  const ModelConfig& c = m.config();
  const int64_t T = 6;
  std::vector<float> x(T * c.dim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = RoundBf16(std::sin(0.37f * i));
  std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6};
  ReferenceExperts experts(m);
  for (const int64_t layer : {0, 4}) {  // a hash layer and a learned one
    const MoeWeights& w = m.weights().blocks[layer].moe;
    std::vector<float> y1(T * c.dim), y2(T * c.dim, -1.0f);
    RouterResult r1, r2;
    MoeForward(w, c, true, x.data(), ids.data(), T, y1.data(), &r1);
    MoeTimings t;
    ASSERT_TRUE(
        MoeForward(w, c, true, layer, x.data(), ids.data(), T, &experts, y2.data(), &r2, &t).ok());
    EXPECT_TRUE(SameBits(y1, y2)) << "layer " << layer;
    EXPECT_EQ(r1.indices, r2.indices);
    EXPECT_GT(t.routed, 0.0);
  }
}

}  // namespace
}  // namespace ss::model
