// Invariants of the reference model on the tiny-a checkpoint that need no golden data
// (spec §3.14, §4.1): decode, multi-token decode and chunked prefill agree with one prefill;
// sequences in a batch do not interact; a new sequence starts clean; bad input is an error;
// the two revision switches act where they should.
//
// Block-level comparisons run one block at a time with fresh states, on the SAME input streams
// for both schedules, because the model is chaotic end to end (tiny-a README, "Numerical
// conditioning"). The input of block L is the one-prefill output of block L-1 (block 0: the
// embeddings), i.e. realistic activations for every block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/codecs.h"
#include "common/golden/golden.h"
#include "common/model/model.h"

namespace ss::model {
namespace {

using golden::Closeness;
using golden::Compare;

constexpr char kTinyA[] = "tests/data/tiny-a";

// Deterministic token ids in [0, vocab) (splitmix64, independent of the standard library).
std::vector<int64_t> Tokens(int64_t n, uint64_t seed, int64_t vocab) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    ids[i] = static_cast<int64_t>((z ^ (z >> 31)) % static_cast<uint64_t>(vocab));
  }
  return ids;
}

std::unique_ptr<Model> LoadOrDie(ModelOptions options = {}) {
  auto m = Model::Load(kTinyA, options);
  if (!m.ok()) {
    ADD_FAILURE() << m.status();
    return nullptr;
  }
  return std::move(*m);
}

class ModelInvariants : public testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = LoadOrDie().release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(model_, nullptr) << "tiny-a did not load"; }

  static const Model& M() { return *model_; }
  static const ModelConfig& C() { return model_->config(); }
  static int64_t HcDim() { return C().hc_mult * C().dim; }

  static inline const Model* model_ = nullptr;
};

// One block over one sequence, fed as consecutive chunks of the given sizes on a fresh state.
struct BlockRun {
  std::vector<float> out;   // [T, hc, dim]
  std::vector<float> attn;  // [T, dim]
  LayerState state;         // the layer's state afterwards
};

BlockRun RunSchedule(const Model& m, int64_t layer, const std::vector<int64_t>& ids,
                     const std::vector<float>& h_in, const std::vector<int64_t>& chunks) {
  const int64_t hcd = m.config().hc_mult * m.config().dim, dim = m.config().dim;
  const int64_t T = static_cast<int64_t>(ids.size());
  SequenceState st = m.NewSequence();
  BlockRun r;
  r.out.resize(T * hcd);
  r.attn.resize(T * dim);
  int64_t start = 0;
  for (int64_t n : chunks) {
    ChunkRef ch{&st, ids.data() + start, n, start};
    BlockTrace trace;
    m.RunBlock(layer, {&ch, 1}, h_in.data() + start * hcd, r.out.data() + start * hcd, &trace);
    std::copy(trace.attn_out.begin(), trace.attn_out.end(), r.attn.begin() + start * dim);
    start += n;
  }
  EXPECT_EQ(start, T) << "chunk sizes do not cover the sequence";
  r.state = std::move(st.layers[layer]);
  return r;
}

// Fraction of equal elements, where equal infinities (empty compressor slots) count as equal.
double FractionEqual(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0.0;
  if (a.empty()) return 1.0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / a.size();
}

// Measured on tiny-a: every comparison below is bit-identical (rms_rel 0, bit_identical 1, states
// equal), as it should be: each op is row-independent and, with a 16-slot window and top-8
// selection, every candidate list fits one 64-entry softmax chunk, so a schedule cannot change
// the summation order. The limits still leave room for a few one-ulp flips.
//
// rms_rel alone cannot catch a bug at block level: the block output is dominated by the
// residual streams. Injected bugs (decode-only ring slot or compressor slot, missing overlap
// hand-off, HCA / indexer causal mask, chunk-relative rope position) gave block-output
// rms_rel of only 0.006-0.03 but bit_identical 0.21-0.86, attention-output rms_rel 0.06-0.46,
// or compressed entries 0.61-0.97 equal. One wrong position among 20 decoded ones is
// bit_identical <= 0.95, hence 0.97.
struct ScheduleLimits {
  double max_rms_rel = 0.02;        // block output and attention output
  double min_bit_identical = 0.97;  // block output and attention output
  double min_state_equal = 0.99;    // window ring, compressed entries, indexer keys, slots
};

// Runs every block under `schedule` and under one prefill of the whole sequence, on the same
// inputs, and compares block outputs and attention outputs on positions from `schedule[0]` on,
// plus the layer states afterwards (window ring, compressed entries, indexer keys, compressor
// slots).
void CheckScheduleAgainstPrefill(const Model& m, const std::string& what,
                                 const std::vector<int64_t>& ids,
                                 const std::vector<int64_t>& schedule, ScheduleLimits lim) {
  const ModelConfig& c = m.config();
  const int64_t T = static_cast<int64_t>(ids.size()), hcd = c.hc_mult * c.dim, dim = c.dim;
  const int64_t from = schedule.front();
  std::vector<float> h(T * hcd);
  m.EmbedStreams(ids.data(), T, h.data());
  for (int64_t L = 0; L < c.n_layers; ++L) {
    const BlockRun ref = RunSchedule(m, L, ids, h, {T});
    const BlockRun got = RunSchedule(m, L, ids, h, schedule);
    const Closeness out =
        Compare(got.out.data() + from * hcd, ref.out.data() + from * hcd, (T - from) * hcd);
    const Closeness attn =
        Compare(got.attn.data() + from * dim, ref.attn.data() + from * dim, (T - from) * dim);
    const double win = FractionEqual(got.state.window, ref.state.window);
    const double cmp = FractionEqual(got.state.compressed, ref.state.compressed);
    const double idx = FractionEqual(got.state.index_keys, ref.state.index_keys);
    const double slots = std::min(
        {FractionEqual(got.state.compressor.kv, ref.state.compressor.kv),
         FractionEqual(got.state.compressor.score, ref.state.compressor.score),
         FractionEqual(got.state.index_compressor.kv, ref.state.index_compressor.kv),
         FractionEqual(got.state.index_compressor.score, ref.state.index_compressor.score)});
    std::printf(
        "%s L%lld (ratio %lld): out rms_rel=%.5f max_rel=%.4f bit_identical=%.4f | attn_out "
        "rms_rel=%.5f bit_identical=%.4f | state equal: window=%.4f compressed=%.4f (%zu vs "
        "%zu) index_keys=%.4f compressor=%.4f\n",
        what.c_str(), static_cast<long long>(L), static_cast<long long>(c.compress_ratios[L]),
        out.rms_rel, out.max_rel, out.bit_identical, attn.rms_rel, attn.bit_identical, win, cmp,
        got.state.compressed.size(), ref.state.compressed.size(), idx, slots);
    EXPECT_LE(out.rms_rel, lim.max_rms_rel) << what << " block " << L;
    EXPECT_GE(out.bit_identical, lim.min_bit_identical) << what << " block " << L;
    EXPECT_LE(attn.rms_rel, lim.max_rms_rel) << what << " block " << L << " attn_out";
    EXPECT_GE(attn.bit_identical, lim.min_bit_identical) << what << " block " << L << " attn_out";
    // The states hold the same positions' entries; a wrong ring slot, a lost compressor slot
    // or a block emitted twice makes them differ wholesale.
    EXPECT_EQ(got.state.compressed.size(), ref.state.compressed.size()) << what << " block " << L;
    EXPECT_EQ(got.state.index_keys.size(), ref.state.index_keys.size()) << what << " block " << L;
    EXPECT_GE(win, lim.min_state_equal) << what << " block " << L << " window";
    EXPECT_GE(cmp, lim.min_state_equal) << what << " block " << L << " compressed";
    EXPECT_GE(idx, lim.min_state_equal) << what << " block " << L << " index_keys";
    EXPECT_GE(slots, lim.min_state_equal) << what << " block " << L << " compressor slots";
    h = ref.out;
  }
}

std::vector<int64_t> PrefillThenDecode(int64_t n, int64_t k) {
  std::vector<int64_t> s = {n};
  s.insert(s.end(), k, 1);
  return s;
}

// (a) Prefill N, then one token at a time, vs prefill N+k.
// N=21, k=20: the 16-slot window wraps and ratio-4 blocks complete during decode.
TEST_F(ModelInvariants, DecodeMatchesPrefillAcrossWindowWrap) {
  CheckScheduleAgainstPrefill(M(), "decode 21+20x1", Tokens(41, 11, C().vocab_size),
                              PrefillThenDecode(21, 20), {});
}

// N=126, k=6: the first ratio-128 block completes at position 127, during decode.
TEST_F(ModelInvariants, DecodeMatchesPrefillAcrossRatio128Block) {
  CheckScheduleAgainstPrefill(M(), "decode 126+6x1", Tokens(132, 12, C().vocab_size),
                              PrefillThenDecode(126, 6), {});
}

// (b) Prefill N, then ONE chunk of k tokens (multi-token decode / speculative verification).
TEST_F(ModelInvariants, MultiTokenDecodeMatchesPrefill) {
  CheckScheduleAgainstPrefill(M(), "decode 21+20", Tokens(41, 11, C().vocab_size), {21, 20}, {});
  CheckScheduleAgainstPrefill(M(), "decode 125+7", Tokens(132, 12, C().vocab_size), {125, 7}, {});
}

// (c) Chunked prefill: 13 + 20 + 27 vs one chunk of 60.
TEST_F(ModelInvariants, ChunkedPrefillMatchesPrefill) {
  CheckScheduleAgainstPrefill(M(), "chunks 13+20+27", Tokens(60, 13, C().vocab_size), {13, 20, 27},
                              {});
}

// (d) Two different sequences in one Forward call give bit-identical logits to each alone, in
// either order, through prefill (different lengths) and three decode steps.
TEST_F(ModelInvariants, BatchedSequencesDoNotInteract) {
  const std::vector<int64_t> a = Tokens(40, 21, C().vocab_size);  // 37 prompt + 3 decode
  const std::vector<int64_t> b = Tokens(28, 22, C().vocab_size);  // 25 prompt + 3 decode
  const int64_t na = 37, nb = 25;
  auto run_alone = [&](const std::vector<int64_t>& ids, int64_t prompt) {
    std::vector<std::vector<float>> logits;
    SequenceState st = M().NewSequence();
    ChunkRef ch{&st, ids.data(), prompt, 0};
    auto r = M().Forward({&ch, 1});
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) logits.push_back((*r)[0]);
    for (int64_t p = prompt; p < static_cast<int64_t>(ids.size()); ++p) {
      ChunkRef d{&st, ids.data() + p, 1, 0};
      auto rr = M().Forward({&d, 1});
      EXPECT_TRUE(rr.ok()) << rr.status();
      if (rr.ok()) logits.push_back((*rr)[0]);
    }
    return logits;
  };
  const auto alone_a = run_alone(a, na), alone_b = run_alone(b, nb);
  ASSERT_EQ(alone_a.size(), 4u);
  ASSERT_EQ(alone_b.size(), 4u);
  for (bool a_first : {true, false}) {
    SequenceState sa = M().NewSequence(), sb = M().NewSequence();
    for (int step = 0; step < 4; ++step) {
      const int64_t pa = step == 0 ? 0 : na + step - 1, pb = step == 0 ? 0 : nb + step - 1;
      ChunkRef ca{&sa, a.data() + pa, step == 0 ? na : 1, 0};
      ChunkRef cb{&sb, b.data() + pb, step == 0 ? nb : 1, 0};
      const ChunkRef chunks[2] = {a_first ? ca : cb, a_first ? cb : ca};
      auto r = M().Forward(chunks);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->size(), 2u);
      const std::vector<float>& la = (*r)[a_first ? 0 : 1];
      const std::vector<float>& lb = (*r)[a_first ? 1 : 0];
      EXPECT_TRUE(la == alone_a[step])
          << "sequence A, step " << step << ", a_first=" << a_first << ": rms_rel "
          << Compare(la.data(), alone_a[step].data(), la.size()).rms_rel;
      EXPECT_TRUE(lb == alone_b[step])
          << "sequence B, step " << step << ", a_first=" << a_first << ": rms_rel "
          << Compare(lb.data(), alone_b[step].data(), lb.size()).rms_rel;
    }
    EXPECT_EQ(sa.next_pos, static_cast<int64_t>(a.size()));
    EXPECT_EQ(sb.next_pos, static_cast<int64_t>(b.size()));
  }
}

void ExpectLayerStatesEqual(const SequenceState& x, const SequenceState& y) {
  ASSERT_EQ(x.layers.size(), y.layers.size());
  EXPECT_EQ(x.next_pos, y.next_pos);
  for (size_t l = 0; l < x.layers.size(); ++l) {
    const LayerState &a = x.layers[l], &b = y.layers[l];
    EXPECT_TRUE(a.window == b.window) << "layer " << l;
    EXPECT_TRUE(a.compressed == b.compressed) << "layer " << l;
    EXPECT_TRUE(a.index_keys == b.index_keys) << "layer " << l;
    // -inf == -inf, so empty slots compare equal.
    EXPECT_TRUE(a.compressor.kv == b.compressor.kv) << "layer " << l;
    EXPECT_TRUE(a.compressor.score == b.compressor.score) << "layer " << l;
    EXPECT_TRUE(a.index_compressor.kv == b.index_compressor.kv) << "layer " << l;
    EXPECT_TRUE(a.index_compressor.score == b.index_compressor.score) << "layer " << l;
  }
}

// A small call of several chunks runs contiguous groups of them on the model's pool. Three
// groups (more than this machine may have cores) against one: the same logits and states, bit
// for bit, for a ragged prefill (33 rows in 5 chunks) and then batched decode steps.
TEST_F(ModelInvariants, RowGroupsGiveTheSameBitsAsOneGroup) {
  ModelOptions one, three;
  one.row_group_threads = 1;
  three.row_group_threads = 3;
  const std::unique_ptr<Model> m1 = LoadOrDie(one), m3 = LoadOrDie(three);
  ASSERT_NE(m1, nullptr);
  ASSERT_NE(m3, nullptr);
  const std::vector<int64_t> prompt = {3, 9, 1, 14, 6};
  const int64_t decode_steps = 3;
  std::vector<std::vector<int64_t>> ids;
  for (size_t i = 0; i < prompt.size(); ++i) {
    ids.push_back(Tokens(prompt[i] + decode_steps, 40 + i, C().vocab_size));
  }
  std::vector<SequenceState> s1, s3;
  for (size_t i = 0; i < prompt.size(); ++i) {
    s1.push_back(m1->NewSequence());
    s3.push_back(m3->NewSequence());
  }
  for (int64_t step = 0; step <= decode_steps; ++step) {
    std::vector<ChunkRef> c1, c3;
    for (size_t i = 0; i < prompt.size(); ++i) {
      const int64_t p = step == 0 ? 0 : prompt[i] + step - 1, n = step == 0 ? prompt[i] : 1;
      c1.push_back({&s1[i], ids[i].data() + p, n, 0});
      c3.push_back({&s3[i], ids[i].data() + p, n, 0});
    }
    auto r1 = m1->Forward(c1);
    auto r3 = m3->Forward(c3);
    ASSERT_TRUE(r1.ok()) << r1.status();
    ASSERT_TRUE(r3.ok()) << r3.status();
    ASSERT_EQ(r1->size(), prompt.size());
    for (size_t i = 0; i < prompt.size(); ++i) {
      EXPECT_TRUE((*r1)[i] == (*r3)[i]) << "sequence " << i << ", step " << step;
    }
  }
  for (size_t i = 0; i < prompt.size(); ++i) ExpectLayerStatesEqual(s1[i], s3[i]);
}

// (e) A sequence run after another one, on a new state, gives exactly what it gives as the
// first sequence of a freshly loaded model.
TEST_F(ModelInvariants, NewSequenceStartsClean) {
  const std::vector<int64_t> a = Tokens(34, 31, C().vocab_size);
  const std::vector<int64_t> b = Tokens(23, 32, C().vocab_size);
  auto run = [](const Model& m, SequenceState& st, const std::vector<int64_t>& ids,
                int64_t prompt) {
    std::vector<std::vector<float>> logits;
    for (int64_t p = 0; p < static_cast<int64_t>(ids.size());) {
      const int64_t n = p == 0 ? prompt : 1;
      ChunkRef ch{&st, ids.data() + p, n, 0};
      auto r = m.Forward({&ch, 1});
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) logits.push_back((*r)[0]);
      p += n;
    }
    return logits;
  };
  ExpectLayerStatesEqual(M().NewSequence(), M().NewSequence());
  SequenceState sa = M().NewSequence();
  run(M(), sa, a, 31);
  SequenceState sb1 = M().NewSequence();
  const auto after_a = run(M(), sb1, b, 20);
  SequenceState sb2 = M().NewSequence();
  const auto again = run(M(), sb2, b, 20);
  std::unique_ptr<Model> fresh = LoadOrDie();
  ASSERT_NE(fresh, nullptr);
  SequenceState sb3 = fresh->NewSequence();
  const auto first_use = run(*fresh, sb3, b, 20);
  ASSERT_EQ(after_a.size(), 4u);
  EXPECT_TRUE(after_a == first_use) << "B after A differs from B on a fresh model";
  EXPECT_TRUE(again == first_use) << "B run twice on new states differs";
  ExpectLayerStatesEqual(sb1, sb3);
  ExpectLayerStatesEqual(sb2, sb3);
}

// (f) Malformed chunks are errors, not crashes, and change no state.
TEST_F(ModelInvariants, BadInputIsAnErrorAndLeavesStateUntouched) {
  const int64_t V = C().vocab_size;
  std::vector<int64_t> ids = Tokens(6, 41, V);
  SequenceState st = M().NewSequence();
  auto expect_error = [&](ChunkRef ch, const std::string& what) {
    auto r = M().Forward({&ch, 1});
    EXPECT_FALSE(r.ok()) << what;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
          << what << ": " << r.status();
    }
  };
  for (int64_t bad : {V, int64_t{-1}, V + 1000}) {
    std::vector<int64_t> t = ids;
    t[3] = bad;
    expect_error({&st, t.data(), 6, 0}, "token id " + std::to_string(bad));
  }
  expect_error({&st, ids.data(), 0, 0}, "n = 0");
  expect_error({&st, ids.data(), -2, 0}, "n < 0");
  expect_error({nullptr, ids.data(), 6, 0}, "null state");
  expect_error({&st, nullptr, 6, 0}, "null tokens");
  {  // One bad chunk fails the whole call; the good chunk's state does not advance either.
    SequenceState other = M().NewSequence();
    std::vector<int64_t> t = ids;
    t[0] = -1;
    const ChunkRef chunks[2] = {{&other, ids.data(), 6, 0}, {&st, t.data(), 6, 0}};
    EXPECT_FALSE(M().Forward(chunks).ok());
    EXPECT_EQ(other.next_pos, 0);
  }
  {
    ChunkRef ch{&st, ids.data(), 6, 0};
    std::vector<float> h(6 * HcDim(), 0.0f);
    EXPECT_FALSE(M().MtpForward(C().n_mtp_layers, {&ch, 1}, h.data()).ok());
    EXPECT_FALSE(M().MtpForward(-1, {&ch, 1}, h.data()).ok());
    ChunkRef null_state{nullptr, ids.data(), 6, 0};
    EXPECT_FALSE(M().MtpForward(0, {&null_state, 1}, h.data()).ok());
  }
  EXPECT_EQ(st.next_pos, 0);
  ExpectLayerStatesEqual(st, M().NewSequence());
  // The state still works and gives a fresh state's result.
  ChunkRef ch{&st, ids.data(), 6, 0};
  auto r = M().Forward({&ch, 1});
  ASSERT_TRUE(r.ok()) << r.status();
  SequenceState clean = M().NewSequence();
  ChunkRef ch2{&clean, ids.data(), 6, 0};
  auto r2 = M().Forward({&ch2, 1});
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_TRUE(*r == *r2);
}

// Fraction of the nope dims of `entries` ([n, head_dim]) whose values are on the e4m3 grid
// times their 64-block's power-of-two scale (what FP8sim with e4m3 rounding leaves behind).
// Entries that are all zero (unused ring slots) are skipped.
double FractionOnFp8Grid(const std::vector<float>& entries, int64_t head_dim, int64_t nope,
                         int64_t* checked) {
  int64_t on = 0, total = 0;
  for (size_t e = 0; e + head_dim <= entries.size(); e += head_dim) {
    for (int64_t b0 = 0; b0 < nope; b0 += 64) {
      const float* v = entries.data() + e + b0;
      float amax = 0.0f;
      for (int64_t i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(v[i]));
      if (amax == 0.0f) continue;
      const float s = Pow2Scale(amax, kFp8AmaxFloor, kE4m3Max);
      for (int64_t i = 0; i < 64; ++i) {
        on += RoundE4m3(v[i] / s) == v[i] / s;
        ++total;
      }
    }
  }
  *checked = total;
  return total ? static_cast<double>(on) / total : 0.0;
}

// (g) The revision switches.
TEST_F(ModelInvariants, SharedExpertClampSwitchChangesLogits) {
  std::unique_ptr<Model> off = LoadOrDie({.shared_expert_clamp = false});
  ASSERT_NE(off, nullptr);
  const std::vector<int64_t> ids = Tokens(33, 51, C().vocab_size);
  SequenceState s1 = M().NewSequence(), s2 = off->NewSequence();
  ChunkRef c1{&s1, ids.data(), 33, 0}, c2{&s2, ids.data(), 33, 0};
  auto on_logits = M().Forward({&c1, 1});
  auto off_logits = off->Forward({&c2, 1});
  ASSERT_TRUE(on_logits.ok() && off_logits.ok());
  const Closeness d = Compare((*off_logits)[0].data(), (*on_logits)[0].data(), C().vocab_size);
  std::printf("shared_expert_clamp off vs on, 33 tokens: rms_rel=%.4f bit_identical=%.4f\n",
              d.rms_rel, d.bit_identical);
  // The clamp fires on ~10% of the shared-expert elements of tiny-a (README: 0.70-0.87 apart).
  EXPECT_GT(d.rms_rel, 0.1);
}

TEST_F(ModelInvariants, KvFp8SimRoundsSwitchPutsKvOnTheE4m3Grid) {
  std::unique_ptr<Model> off = LoadOrDie({.kv_fp8_sim_rounds = false});
  ASSERT_NE(off, nullptr);
  const std::vector<int64_t> ids = Tokens(33, 52, C().vocab_size);
  const int64_t hd = C().head_dim, nope = C().nope_head_dim();
  for (const Model* m : {&M(), static_cast<const Model*>(off.get())}) {
    const bool rounds = m->options().kv_fp8_sim_rounds;
    SequenceState st = m->NewSequence();
    ChunkRef ch{&st, ids.data(), 33, 0};
    ASSERT_TRUE(m->Forward({&ch, 1}).ok());
    for (int64_t L = 0; L < C().n_layers; ++L) {
      int64_t nw = 0, nc = 0;
      const double win = FractionOnFp8Grid(st.layers[L].window, hd, nope, &nw);
      const double cmp = FractionOnFp8Grid(st.layers[L].compressed, hd, nope, &nc);
      std::printf(
          "kv_fp8_sim_rounds=%d L%lld: on-grid window %.4f of %lld, compressed %.4f of %lld\n",
          rounds, static_cast<long long>(L), win, static_cast<long long>(nw), cmp,
          static_cast<long long>(nc));
      ASSERT_GT(nw, 0) << "layer " << L;
      if (rounds) {
        EXPECT_EQ(win, 1.0) << "layer " << L << " window";
        if (nc) {
          EXPECT_EQ(cmp, 1.0) << "layer " << L << " compressed";
        }
      } else {
        // Without e4m3 rounding the values are plain bf16: mostly off the 3-bit-mantissa grid.
        EXPECT_LT(win, 0.5) << "layer " << L << " window";
        if (nc) {
          EXPECT_LT(cmp, 0.5) << "layer " << L << " compressed";
        }
      }
    }
  }
}

}  // namespace
}  // namespace ss::model
