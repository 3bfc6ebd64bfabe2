// The expert engine over real stores (tiny-a, and a generated checkpoint with I = 256):
//  * with one I-split, and with its default splits, it is bit-identical to one kernel call over
//    the whole slice;
//  * the sum of the two slices of n = 2 is within one bf16 ulp of the n = 1 unrounded result
//    for >= 99% of outputs;
//  * outputs are bit-identical on 1, 2, 3 and 4 threads, in two passes and in one (passes = 1),
//    and from run to run;
//  * malformed requests get clear errors, leave `out` untouched, and the engine keeps serving;
//  * concurrent callers are serialised.
#include "cpu_expert_worker/expert_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/model/moe.h"
#include "cpu_expert_worker/kernels/dispatch.h"
#include "tests/cpu_expert_worker/expert_test_util.h"

namespace ss::expert {
namespace {

using testing_util::AllLayers;
using testing_util::I256Checkpoint;
using testing_util::kTinyA;

struct Request {
  int64_t T = 0;
  int k = 0;
  std::vector<uint16_t> x;
  std::vector<int32_t> ids;
  std::vector<float> w;
};

// Uniform: ids drawn with replacement (a token may repeat an id); skewed: every token on
// experts {2, 5} (so k = 3 repeats one), which puts > 64 rows on one expert for T > 64.
Request MakeRequest(int64_t T, int k, int64_t E, int64_t dim, bool skewed, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(E - 1));
  std::uniform_real_distribution<float> wd(0.1f, 1.0f);
  Request r;
  r.T = T;
  r.k = k;
  r.x.resize(T * dim);
  for (auto& v : r.x) v = FloatToBf16(nd(rng));
  r.ids.resize(T * k);
  r.w.resize(T * k);
  for (int64_t i = 0; i < T * k; ++i) {
    r.ids[i] = skewed ? (i % 2 == 0 ? 2 : 5) : id(rng);
    r.w[i] = wd(rng);
  }
  return r;
}

std::unique_ptr<ThreadPool> Pool(int n) {
  ThreadPoolOptions o;
  o.num_threads = n;
  o.spin_us = 50;
  return *ThreadPool::Create(o);
}

std::unique_ptr<ExpertStore> Store(const std::string& dir, int i, int n) {
  auto cfg = LoadModelConfig(dir);
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  ExpertStoreOptions o;
  o.source.model_dir = dir;
  o.layers = AllLayers(*cfg);
  o.slice_index = i;
  o.slice_count = n;
  auto s = ExpertStore::Load(o, nullptr);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// min_split_cols 128 (the default, made explicit): I = 256 then splits in two.
std::unique_ptr<ExpertEngine> Engine(const ExpertStore& s, ThreadPool& pool, Isa isa,
                                     int64_t max_splits = 0, int64_t max_tokens = 256,
                                     int passes = 1) {
  ExpertEngineOptions o;
  o.isa = isa;
  o.passes = passes;
  o.min_split_cols = 128;
  o.max_splits = max_splits;
  o.max_tokens = max_tokens;
  auto e = ExpertEngine::Create(s, pool, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

std::vector<float> RunEngine(ExpertEngine& e, const ExpertStore& s, int layer, const Request& r) {
  std::vector<float> out(r.T * s.dim(), -7.0f);
  const absl::Status st =
      e.Compute(layer, r.T, r.x.data(), r.ids.data(), r.w.data(), r.k, out.data());
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// One kernel call over the store's whole slice: the definition the engine splits. The engine
// rounds each expert's output to bf16 when it holds whole experts (slice 0/1); `round` < 0
// follows that rule, 0 / 1 force it.
std::vector<float> KernelCall(const ExpertStore& s, Isa isa, int layer, const Request& r,
                              int round = -1) {
  ExpertCall c;
  c.num_tokens = r.T;
  c.dim = s.dim();
  c.top_k = r.k;
  c.inter_slice = s.inter_slice();
  c.x = r.x.data();
  c.expert_ids = r.ids.data();
  c.expert_weights = r.w.data();
  c.experts = s.layer_views(layer);
  c.num_experts = s.num_experts();
  c.swiglu_limit = static_cast<float>(s.config().swiglu_limit);
  c.round_expert_outputs = round < 0 ? s.slice_count() == 1 : round == 1;
  std::vector<float> out(r.T * s.dim());
  c.out = out.data();
  std::vector<uint8_t> ws(ExpertWorkspaceBytes(c));
  const absl::Status st = (*KernelFor(isa))->run(c, ws.data(), ws.size());
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

int64_t Bf16Ulps(float a, float b) {
  auto ord = [](float f) {
    const int32_t u = FloatToBf16(f);
    return (u & 0x8000) ? -(u & 0x7fff) : u;
  };
  return std::abs(static_cast<int64_t>(ord(a)) - ord(b));
}

double FractionWithinOneUlp(const std::vector<float>& got, const std::vector<float>& want) {
  int64_t ok = 0;
  for (size_t i = 0; i < got.size(); ++i) ok += Bf16Ulps(got[i], want[i]) <= 1;
  return static_cast<double>(ok) / got.size();
}

int64_t BitsDiffer(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

// The scalar definition and every SIMD variant this CPU runs.
std::vector<Isa> Isas() {
  std::vector<Isa> v{Isa::kScalar};
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (IsaSupported(isa)) v.push_back(isa);
  }
  return v;
}

TEST(ExpertEngine, OneSplitIsBitIdenticalToOneKernelCall) {
  auto pool = Pool(2);
  for (const char* dir : {kTinyA, I256Checkpoint().c_str()}) {
    auto store = Store(dir, 0, 1);
    ASSERT_NE(store, nullptr);
    const int k = static_cast<int>(store->config().n_activated_experts);
    for (Isa isa : Isas()) {
      for (int passes : {2, 1}) {
        auto engine = Engine(*store, *pool, isa, /*max_splits=*/1, 256, passes);
        ASSERT_NE(engine, nullptr);
        uint32_t seed = 1;
        for (int64_t T : {1, 3, 70, 200}) {
          for (bool skewed : {false, true}) {
            const Request r = MakeRequest(T, k, store->num_experts(), store->dim(), skewed, seed++);
            const int layer = static_cast<int>(seed % store->layers().size());
            EXPECT_EQ(
                BitsDiffer(RunEngine(*engine, *store, layer, r), KernelCall(*store, isa, layer, r)),
                0)
                << dir << " " << IsaName(isa) << " passes " << passes << " T=" << T
                << " skewed=" << skewed;
            EXPECT_EQ(engine->last_splits(), 1);
          }
        }
      }
    }
  }
}

TEST(ExpertEngine, AnySplitIsBitIdenticalToOneKernelCall) {
  auto pool = Pool(2);
  auto store = Store(I256Checkpoint(), 0, 1);
  ASSERT_NE(store, nullptr);
  for (Isa isa : Isas()) {
    for (int passes : {2, 1}) {
      auto engine = Engine(*store, *pool, isa, 0, 256, passes);
      ASSERT_NE(engine, nullptr);
      for (int64_t T : {1, 7, 100}) {
        for (bool skewed : {false, true}) {
          const Request r = MakeRequest(T, 3, 8, 384, skewed, static_cast<uint32_t>(T));
          const std::vector<float> got = RunEngine(*engine, *store, 2, r);
          if (T == 1) {
            EXPECT_EQ(engine->last_splits(), 2);  // C = 256/128 = 2
          }
          // One pass on 2 threads, guided: 128 (= 384 / 2 capped), 128, 64, 32, 32.
          EXPECT_EQ(engine->last_down_units(), passes == 2 ? 384 / ExpertEngine::kDownRows : 5);
          EXPECT_EQ(BitsDiffer(got, KernelCall(*store, isa, 2, r)), 0)
              << IsaName(isa) << " passes " << passes << " T=" << T << " skewed=" << skewed;
        }
      }
    }
  }
}

// 64-byte aligned floats inside `v` (sized n + 16).
float* Aligned(std::vector<float>& v, size_t n) {
  v.assign(n + 16, 0.0f);
  const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<float*>((p + 63) / 64 * 64);
}

// The engine's prefetch hint (NextRows) on the unit kernels: any valid hint leaves the bits of
// gate_up and down as they are without one; a hint outside the call's columns is refused.
TEST(ExpertEngine, NextRowsHintChangesNoBitsAndIsChecked) {
  auto store = Store(I256Checkpoint(), 0, 1);
  ASSERT_NE(store, nullptr);
  const int64_t dim = store->dim(), I = store->inter_slice();
  const ExpertSliceView* views = store->layer_views(0);
  const Request r = MakeRequest(1, 1, 8, dim, false, 5);
  for (Isa isa : Isas()) {
    const ExpertKernel& k = **KernelFor(isa);
    std::vector<float> xqv, xsv, hqv, hsv, outv;
    float* xq = Aligned(xqv, dim);
    float* xs = Aligned(xsv, dim / 128);
    float* hq = Aligned(hqv, I);
    float* hs = Aligned(hsv, I / 128);
    float* out = Aligned(outv, dim);
    k.quantize_row(r.x.data(), dim, xq, xs);
    const float* xq_rows[1] = {xq};
    const float* xs_rows[1] = {xs};
    float* hq_rows[1] = {hq};
    float* hs_rows[1] = {hs};
    float* out_rows[1] = {out};
    const float weight = 0.75f;
    std::vector<uint8_t> ws(ExpertUnitWorkspaceBytes(dim, I));
    GateUpCall g;
    g.rows = 1;
    g.dim = dim;
    g.inter_slice = I;
    g.col_begin = 0;
    g.col_end = I;
    g.expert = &views[0];
    g.xq_rows = xq_rows;
    g.xs_rows = xs_rows;
    g.weights = &weight;
    g.swiglu_limit = static_cast<float>(store->config().swiglu_limit);
    g.hq_rows = hq_rows;
    g.hs_rows = hs_rows;
    ASSERT_TRUE(k.gate_up(g, ws.data(), ws.size()).ok()) << k.name;
    const std::vector<float> h0(hq, hq + I), s0(hs, hs + I / 128);
    g.next = {&views[3], 128, 256};
    ASSERT_TRUE(k.gate_up(g, ws.data(), ws.size()).ok()) << k.name;
    EXPECT_EQ(BitsDiffer(std::vector<float>(hq, hq + I), h0), 0) << k.name;
    EXPECT_EQ(BitsDiffer(std::vector<float>(hs, hs + I / 128), s0), 0) << k.name;
    for (NextRows bad : {NextRows{&views[3], 128, I + 128}, NextRows{&views[3], 64, 128}}) {
      g.next = bad;
      EXPECT_EQ(k.gate_up(g, ws.data(), ws.size()).code(), absl::StatusCode::kInvalidArgument)
          << k.name << " [" << bad.col_begin << ", " << bad.col_end << ")";
    }

    const ExpertSliceView* groups[1] = {&views[0]};
    const int32_t offsets[2] = {0, 1};
    DownCall d;
    d.dim = dim;
    d.inter_slice = I;
    d.col_begin = 64;
    d.col_end = 128;
    d.num_groups = 1;
    d.experts = groups;
    d.group_offsets = offsets;
    d.hq_rows = hq_rows;
    d.hs_rows = hs_rows;
    d.out_rows = out_rows;
    ASSERT_TRUE(k.down(d, ws.data(), ws.size()).ok()) << k.name;
    const std::vector<float> o0(out, out + dim);
    std::fill(out, out + dim, 0.0f);
    d.next = {&views[5], 128, 192};
    ASSERT_TRUE(k.down(d, ws.data(), ws.size()).ok()) << k.name;
    EXPECT_EQ(BitsDiffer(std::vector<float>(out, out + dim), o0), 0) << k.name;
    d.next = {&views[5], 128, dim + 16};
    EXPECT_EQ(k.down(d, ws.data(), ws.size()).code(), absl::StatusCode::kInvalidArgument) << k.name;
  }
}

TEST(ExpertEngine, TwoSlicesSumToTheWholeExpert) {
  auto pool = Pool(2);
  auto whole = Store(I256Checkpoint(), 0, 1);
  auto s0 = Store(I256Checkpoint(), 0, 2);
  auto s1 = Store(I256Checkpoint(), 1, 2);
  ASSERT_TRUE(whole && s0 && s1);
  EXPECT_EQ(s0->inter_slice(), 128);
  for (Isa isa : Isas()) {
    auto e0 = Engine(*s0, *pool, isa);
    auto e1 = Engine(*s1, *pool, isa);
    ASSERT_TRUE(e0 && e1);
    uint32_t seed = 100;
    for (int64_t T : {1, 2, 7, 64, 150}) {
      for (bool skewed : {false, true}) {
        const Request r = MakeRequest(T, 3, 8, 384, skewed, seed++);
        for (int layer : {0, 4, 5}) {  // 5: the MTP block
          const std::vector<float> a = RunEngine(*e0, *s0, layer, r),
                                   b = RunEngine(*e1, *s1, layer, r);
          // Unrounded whole experts: the sum the two unrounded partials approximate.
          const std::vector<float> want = KernelCall(*whole, isa, layer, r, /*round=*/0);
          std::vector<float> sum(a.size());
          for (size_t i = 0; i < a.size(); ++i) sum[i] = RoundBf16(a[i] + b[i]);
          std::vector<float> want_bf16(want.size());
          for (size_t i = 0; i < want.size(); ++i) want_bf16[i] = RoundBf16(want[i]);
          const double frac = FractionWithinOneUlp(sum, want_bf16);
          EXPECT_GE(frac, 0.99) << IsaName(isa) << " T=" << T << " layer " << layer;
          if (T == 64 && !skewed && layer == 0) {
            std::printf("[%s] n=2 sum vs n=1 (T=64): %.4f of outputs within 1 bf16 ulp\n",
                        IsaName(isa), frac);
          }
        }
      }
    }
  }
}

// The early-wake hook runs once per computed call, in both modes, and never for a refused one.
TEST(ExpertEngine, OnTailRunsOncePerCall) {
  auto store = Store(I256Checkpoint(), 0, 1);
  ASSERT_NE(store, nullptr);
  auto pool = Pool(2);
  for (int passes : {1, 2}) {
    auto e = Engine(*store, *pool, DetectIsa(), 0, 256, passes);
    ASSERT_NE(e, nullptr);
    std::atomic<int> tails{0};
    const std::function<void()> on_tail = [&] { tails.fetch_add(1); };
    for (int64_t T : {1, 5, 64}) {
      const Request r = MakeRequest(T, 3, 8, 384, false, static_cast<uint32_t>(T));
      std::vector<float> out(r.T * store->dim());
      ASSERT_TRUE(
          e->Compute(1, r.T, r.x.data(), r.ids.data(), r.w.data(), r.k, out.data(), &on_tail).ok());
    }
    EXPECT_EQ(tails.load(), 3) << "passes " << passes;
    const Request r = MakeRequest(1, 3, 8, 384, false, 9);
    std::vector<float> out(store->dim());
    EXPECT_FALSE(
        e->Compute(99, 1, r.x.data(), r.ids.data(), r.w.data(), r.k, out.data(), &on_tail).ok());
    EXPECT_EQ(tails.load(), 3) << "passes " << passes;
  }
}

// Whole experts and a slice (unrounded partials), in two passes and in one: every thread count
// gives the bits of two passes on one thread.
TEST(ExpertEngine, BitIdenticalOnAnyThreadCount) {
  std::vector<Request> requests;
  uint32_t seed = 7;
  for (int64_t T : {1, 5, 64, 200})
    for (bool skewed : {false, true}) requests.push_back(MakeRequest(T, 3, 8, 384, skewed, seed++));
  for (int n : {1, 2}) {
    auto store = Store(I256Checkpoint(), 0, n);
    ASSERT_NE(store, nullptr);
    std::vector<std::vector<float>> reference;
    auto one = Pool(1);
    auto e1 = Engine(*store, *one, DetectIsa(), 0, 256, /*passes=*/2);
    ASSERT_NE(e1, nullptr);
    for (const Request& r : requests) reference.push_back(RunEngine(*e1, *store, 1, r));
    for (int threads : {1, 2, 3, 4}) {
      auto pool = Pool(threads);
      for (int passes : {2, 1}) {
        if (threads == 1 && passes == 2) continue;  // the reference
        auto e = Engine(*store, *pool, DetectIsa(), 0, 256, passes);
        ASSERT_NE(e, nullptr);
        for (int rep = 0; rep < 5; ++rep) {
          for (size_t i = 0; i < requests.size(); ++i) {
            EXPECT_EQ(BitsDiffer(RunEngine(*e, *store, 1, requests[i]), reference[i]), 0)
                << "slices " << n << ", " << threads << " threads, passes " << passes
                << ", request " << i << ", repetition " << rep;
          }
        }
      }
    }
  }
}

TEST(ExpertEngine, SplitPlanDependsOnTheRequestOnly) {
  auto pool = Pool(2);
  auto store = Store(I256Checkpoint(), 0, 1);
  ASSERT_NE(store, nullptr);
  ExpertEngineOptions o;
  o.isa = Isa::kScalar;
  o.split_target = 4;  // P = distinct experts; s = min(C = 2, ceil(4 / P))
  o.min_split_cols = 128;
  auto e = *ExpertEngine::Create(*store, *pool, o);
  Request r = MakeRequest(1, 3, 8, 384, false, 1);
  r.ids = {1, 2, 3};
  RunEngine(*e, *store, 0, r);
  EXPECT_EQ(e->last_splits(), 2);
  EXPECT_EQ(e->last_units(), 6);
  r.ids = {1, 1, 1};  // one expert, three rows in one batch
  RunEngine(*e, *store, 0, r);
  EXPECT_EQ(e->last_splits(), 2);
  EXPECT_EQ(e->last_units(), 2);
  const Request big = MakeRequest(100, 3, 8, 384, true, 2);  // 150 rows on each of 2 experts
  RunEngine(*e, *store, 0, big);
  EXPECT_EQ(e->last_splits(), 1);  // P = 2 experts x 3 row batches = 6 >= split_target
  EXPECT_EQ(e->last_units(), 6);
  // A narrowest sub-range of 256 columns leaves I = 256 whole.
  o.min_split_cols = 256;
  auto whole = *ExpertEngine::Create(*store, *pool, o);
  r.ids = {1, 2, 3};
  RunEngine(*whole, *store, 0, r);
  EXPECT_EQ(whole->last_splits(), 1);
  o.min_split_cols = 192;
  EXPECT_EQ(ExpertEngine::Create(*store, *pool, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A skipped choice (model::kSkippedExpert) adds exactly nothing: the same values as the choice
// with routing weight 0 (an expert output of ±0), on whole experts and on slices; a token whose
// every choice is skipped gets 0, and the skipped experts are not planned.
TEST(ExpertEngine, SkippedChoicesAddNothing) {
  auto pool = Pool(2);
  for (int n : {1, 2}) {
    auto store = Store(I256Checkpoint(), 0, n);
    ASSERT_NE(store, nullptr);
    for (Isa isa : Isas()) {
      for (int passes : {2, 1}) {
        auto e = Engine(*store, *pool, isa, 0, 256, passes);
        Request skipped = MakeRequest(9, 3, 8, 384, false, 21);
        Request zero = skipped;
        for (int64_t i = 0; i < skipped.T * skipped.k; ++i) {
          if (i % 4 == 1 || i / skipped.k == 5) {  // token 5: every choice
            skipped.ids[i] = model::kSkippedExpert;
            zero.w[i] = 0.0f;
          }
        }
        const std::vector<float> got = RunEngine(*e, *store, 0, skipped);
        const std::vector<float> want = RunEngine(*e, *store, 0, zero);
        int64_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
        EXPECT_EQ(differ, 0) << "slices " << n << " isa " << IsaName(isa);
        for (int64_t d = 0; d < store->dim(); ++d) ASSERT_EQ(got[5 * store->dim() + d], 0.0f);
        Request none = skipped;
        std::fill(none.ids.begin(), none.ids.end(), model::kSkippedExpert);
        const std::vector<float> zeros = RunEngine(*e, *store, 0, none);
        EXPECT_EQ(e->last_units(), 0);
        for (float v : zeros) ASSERT_EQ(v, 0.0f);
      }
    }
  }
}

class EngineErrors : public testing::Test {
 protected:
  void SetUp() override {
    pool_ = Pool(2);
    ExpertStoreOptions o;
    o.source.model_dir = I256Checkpoint();
    o.layers = {0, 2};
    auto s = ExpertStore::Load(o, pool_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    engine_ = Engine(*store_, *pool_, DetectIsa(), 0, /*max_tokens=*/16);
    ASSERT_NE(engine_, nullptr);
    req_ = MakeRequest(4, 3, 8, 384, false, 9);
    good_ = RunEngine(*engine_, *store_, 2, req_);
  }
  absl::Status Call(int layer, int64_t T, const uint16_t* x, const int32_t* ids, const float* w,
                    int k) {
    out_.assign(16 * 384, 42.0f);
    return engine_->Compute(layer, T, x, ids, w, k, out_.data());
  }
  absl::Status Call(const Request& r, int layer = 2) {
    return Call(layer, r.T, r.x.data(), r.ids.data(), r.w.data(), r.k);
  }
  bool OutUntouched() const {
    for (float v : out_)
      if (v != 42.0f) return false;
    return true;
  }
  void ExpectStillServing() {
    EXPECT_EQ(BitsDiffer(RunEngine(*engine_, *store_, 2, req_), good_), 0);
  }
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<ExpertStore> store_;
  std::unique_ptr<ExpertEngine> engine_;
  Request req_;
  std::vector<float> good_;
  std::vector<float> out_;
};

TEST_F(EngineErrors, UnknownLayer) {
  for (int layer : {1, 5, 6, -1, 1000}) {
    const absl::Status st = Call(req_, layer);
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
    EXPECT_NE(st.message().find(absl::StrCat("layer ", layer)), std::string::npos) << st;
    EXPECT_TRUE(OutUntouched());
  }
  ExpectStillServing();
}

TEST_F(EngineErrors, ExpertIdOutOfRange) {
  for (int32_t bad : {8, -2, 1 << 30}) {  // -1 is model::kSkippedExpert
    Request r = req_;
    r.ids[2 * 3 + 1] = bad;
    const absl::Status st = Call(r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(absl::StrCat("expert id ", bad, " (token 2, choice 1)")),
              std::string::npos)
        << st;
    EXPECT_TRUE(OutUntouched());
  }
  ExpectStillServing();
}

TEST_F(EngineErrors, TooManyTokensForTheWorkspace) {
  const Request big = MakeRequest(17, 3, 8, 384, false, 3);
  std::vector<float> out(17 * 384, 42.0f);
  const absl::Status st =
      engine_->Compute(2, 17, big.x.data(), big.ids.data(), big.w.data(), 3, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("T = 17"), std::string::npos) << st;
  EXPECT_NE(st.message().find("max_tokens 16"), std::string::npos) << st;
  for (float v : out) ASSERT_EQ(v, 42.0f);
  ExpectStillServing();
}

TEST_F(EngineErrors, BadSizesPointersAndValues) {
  EXPECT_EQ(Call(2, -1, req_.x.data(), req_.ids.data(), req_.w.data(), 3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Call(2, 4, req_.x.data(), req_.ids.data(), req_.w.data(), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Call(2, 4, req_.x.data(), req_.ids.data(), req_.w.data(), 4).code(),
            absl::StatusCode::kInvalidArgument);  // top_k above the model's 3
  EXPECT_EQ(Call(2, 4, nullptr, req_.ids.data(), req_.w.data(), 3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Call(2, 4, req_.x.data(), nullptr, req_.w.data(), 3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Call(2, 4, req_.x.data(), req_.ids.data(), nullptr, 3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      engine_->Compute(2, 4, req_.x.data(), req_.ids.data(), req_.w.data(), 3, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  Request r = req_;
  r.w[5] = std::nanf("");
  absl::Status st = Call(r);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("token 1, choice 2"), std::string::npos) << st;
  r = req_;
  r.x[3 * 384 + 10] = 0x7f80;  // +inf
  st = Call(r);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("x[3, 10]"), std::string::npos) << st;
  EXPECT_TRUE(OutUntouched());
  // T = 0 is a no-op that touches nothing, even with null pointers.
  EXPECT_TRUE(Call(2, 0, nullptr, nullptr, nullptr, 3).ok());
  EXPECT_TRUE(OutUntouched());
  ExpectStillServing();
}

TEST_F(EngineErrors, ConcurrentCallersAreSerialised) {
  std::vector<std::thread> callers;
  std::atomic<int> mismatches{0};
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 30; ++i) {
        std::vector<float> out(4 * 384);
        const absl::Status st =
            engine_->Compute(2, 4, req_.x.data(), req_.ids.data(), req_.w.data(), 3, out.data());
        if (!st.ok() || BitsDiffer(out, good_) != 0) mismatches++;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(ExpertEngineCreate, RejectsBadOptions) {
  auto pool = Pool(1);
  auto store = Store(kTinyA, 0, 1);
  ASSERT_NE(store, nullptr);
  ExpertEngineOptions o;
  o.max_tokens = 0;
  EXPECT_EQ(ExpertEngine::Create(*store, *pool, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = {};
  o.split_target = 0;
  EXPECT_EQ(ExpertEngine::Create(*store, *pool, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (int passes : {0, 3}) {
    o = {};
    o.passes = passes;
    EXPECT_EQ(ExpertEngine::Create(*store, *pool, o).status().code(),
              absl::StatusCode::kInvalidArgument)
        << passes;
  }
  o = {};
  o.isa = static_cast<Isa>(9);
  EXPECT_FALSE(ExpertEngine::Create(*store, *pool, o).ok());
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    o = {};
    o.isa = isa;
    auto e = ExpertEngine::Create(*store, *pool, o);
    if (IsaSupported(isa)) {
      ASSERT_TRUE(e.ok()) << e.status();
      EXPECT_STREQ((*e)->isa_name(), IsaName(isa));
    } else {
      EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
    }
  }
}

}  // namespace
}  // namespace ss::expert
