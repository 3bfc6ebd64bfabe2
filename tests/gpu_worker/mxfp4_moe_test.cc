// The streamed-expert kernels (gpu_worker/kernels/mxfp4_moe.h) against the CPU reference's routed
// sum (model::RoutedSum on the same MXFP4 experts, inputs and routing): small shapes at every
// weight layout (row-major, tiled 8 and 16) and top-k, intermediate-dimension parts, expert-range
// masking, groups, repeatability, and Flash shapes (dim 4096, I 2048) with rms_rel and the
// bit-identical fraction printed. Without a CUDA device every GPU test skips with a message; the
// argument checks run anywhere.
#include "gpu_worker/kernels/mxfp4_moe.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/golden/golden.h"
#include "common/model/moe.h"
#include "common/model/weights.h"
#include "common/model_config.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"
#include "tests/gpu_worker/mxfp4_moe_test_util.h"

namespace ss::cuda {
namespace {

using namespace testing_util;  // NOLINT: the shared GPU test helpers

// One group of the layer: experts [e0, e1) stored as `store`.
struct GroupRun {
  int e0, e1;
  const DeviceStore* store;
};

// The streamed path on the device for inputs x [T, dim] and routing r: routing, the input's
// quantisation, each group, the combine of the routes to [eb, ee); returns sum [T, dim].
std::vector<float> RunDevice(const std::vector<float>& x, const model::RouterResult& r, int64_t T,
                             int K, int E, int eb, int ee, const std::vector<GroupRun>& groups,
                             float limit, bool round_output) {
  const int64_t dim = groups.at(0).store->layout.dim;
  const int64_t hw = groups[0].store->layout.parts * groups[0].store->layout.part_inter;
  const int64_t TK = T * K;
  DeviceBuffer<uint16_t> xd(ToBf16(x)), xq(T * dim), h(std::max<int64_t>(TK * hw, 1));
  DeviceBuffer<int32_t> ids(r.indices);
  DeviceBuffer<float> wts(r.weights), y(std::max<int64_t>(TK * dim, 1)), sum(T * dim);
  DeviceBuffer<int32_t> offsets(E + 1), tile_offsets(E + 1), tok(std::max<int64_t>(TK, 1)),
      slot(std::max<int64_t>(TK, 1));
  DeviceBuffer<float> rw(std::max<int64_t>(TK, 1));
  MoeRouting routing{offsets.get(), tile_offsets.get(), tok.get(), slot.get(), rw.get(), nullptr};
  MoeBuildRoutingParams bp;
  bp.ids = ids.get();
  bp.weights = wts.get();
  bp.T = T;
  bp.K = K;
  bp.E = E;
  bp.expert_begin = eb;
  bp.expert_end = ee;
  bp.routing = routing;
  EXPECT_EQ(MoeBuildRouting(bp, nullptr), cudaSuccess);
  EXPECT_EQ(FakeQuantE4m3(AsBf16(xd.get()), T, dim, AsBf16(xq.get()), nullptr), cudaSuccess);
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> stores;
  for (const GroupRun& g : groups) {
    stores.push_back(std::make_unique<DeviceBuffer<uint8_t>>(g.store->bytes));
    Mxfp4MoeGroupParams p;
    p.routing = routing;
    p.T = T;
    p.K = K;
    p.expert_begin = std::max(g.e0, eb);
    p.expert_end = std::min(g.e1, ee);
    if (p.expert_begin >= p.expert_end) continue;
    p.base = stores.back()->get() + (p.expert_begin - g.e0) * g.store->layout.expert_bytes;
    p.layout = g.store->layout;
    p.xq = AsBf16(xq.get());
    p.h = AsBf16(h.get());
    p.y = y.get();
    p.limit = limit;
    p.round_output_bf16 = round_output;
    EXPECT_EQ(Mxfp4MoeGroup(p, nullptr), cudaSuccess);
  }
  MoeCombineRoutesParams cp;
  cp.y = y.get();
  cp.ids = ids.get();
  cp.T = T;
  cp.K = K;
  cp.dim = dim;
  cp.expert_begin = eb;
  cp.expert_end = ee;
  cp.sum = sum.get();
  EXPECT_EQ(MoeCombineRoutes(cp, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return sum.Get();
}

class Mxfp4MoeTest : public GpuTest {};

TEST_F(Mxfp4MoeTest, KernelsRunFromCompute86Ptx) {
  ExpectCompute86Ptx({{"MoeBuildRouting", MoeBuildRoutingKernel()},
                      {"FakeQuantE4m3", FakeQuantE4m3Kernel()},
                      {"Mxfp4MoeGemmUp", Mxfp4MoeGemmUpKernel()},
                      {"Mxfp4MoeGemmDown", Mxfp4MoeGemmDownKernel()},
                      {"MoeCombineRoutes", MoeCombineRoutesKernel()},
                      {"SplitResidentRoutes", SplitResidentRoutesKernel()}});
}

// The resident experts' split of a chunk's routes (each choice's slot, the host's ids with the
// resident ones skipped), and the combine adding to a partial sum already there.
TEST_F(Mxfp4MoeTest, SplitResidentRoutesAndTheAccumulatingCombine) {
  const std::vector<int32_t> slot_of = {-1, 0, -1, 1, -1, -1, 2, -1};  // experts 1, 3, 6
  const std::vector<int32_t> ids = {1, 2, 3, 6, -1, 9, 0, 3};
  DeviceBuffer<int32_t> slots_d(slot_of), ids_d(ids), resident(ids.size()), host(ids.size());
  DeviceBuffer<unsigned long long> counts(std::vector<unsigned long long>{5, 1});
  DeviceBuffer<unsigned long long> by_expert(std::vector<unsigned long long>(8, 1));
  SplitResidentRoutesParams sp{.ids = ids_d.get(),
                               .n = static_cast<int64_t>(ids.size()),
                               .slot_of = slots_d.get(),
                               .E = 8,
                               .resident = resident.get(),
                               .host = host.get(),
                               .counts = counts.get(),
                               .expert_counts = by_expert.get()};
  ASSERT_EQ(SplitResidentRoutes(sp, nullptr), cudaSuccess);
  EXPECT_EQ(resident.Get(), (std::vector<int32_t>{0, -1, 1, 2, -1, -1, -1, 1}));
  EXPECT_EQ(host.Get(), (std::vector<int32_t>{-1, 2, -1, -1, -1, 9, 0, -1}));
  EXPECT_EQ(counts.Get(), (std::vector<unsigned long long>{5 + 6, 1 + 4}));  // added to
  // The resident choices by expert (1 once, 3 twice, 6 once), added to what was there.
  EXPECT_EQ(by_expert.Get(), (std::vector<unsigned long long>{1, 2, 1, 3, 1, 1, 2, 1}));
  sp.E = kMxfp4MoeMaxExperts + 1;
  EXPECT_EQ(SplitResidentRoutes(sp, nullptr), cudaErrorInvalidValue);

  // Two tokens, K = 2, dim 4; small integers, so every sum is exact.
  const int64_t T = 2, dim = 4;
  const int K = 2;
  const std::vector<int32_t> route_ids = {1, 0, -1, 1};
  std::vector<float> y(T * K * dim);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(i + 1);
  const std::vector<float> partial = {100, 200, 300, 400, 500, 600, 700, 800};
  DeviceBuffer<float> y_d(y), sum(partial);
  DeviceBuffer<int32_t> rid(route_ids);
  ASSERT_EQ(MoeCombineRoutes({.y = y_d.get(),
                              .ids = rid.get(),
                              .T = T,
                              .K = K,
                              .dim = dim,
                              .expert_begin = 0,
                              .expert_end = 2,
                              .sum = sum.get(),
                              .accumulate = true},
                             nullptr),
            cudaSuccess);
  // Token 0: routes to 1 (y rows 0) and 0 (row 1); token 1: row 3 only.
  EXPECT_EQ(sum.Get(), (std::vector<float>{100 + 1 + 5, 200 + 2 + 6, 300 + 3 + 7, 400 + 4 + 8,
                                           500 + 13, 600 + 14, 700 + 15, 800 + 16}));
}

// Small shapes: every layout, top-k and token count against the reference.
TEST_F(Mxfp4MoeTest, SmallShapesMatchTheReference) {
  const int64_t dim = 256, inter = 256;
  const int E = 8;
  const float limit = 10.0f;
  const HostExperts hx = RandomExperts(dim, inter, E, 11);
  std::vector<DeviceStore> stores;
  for (int64_t tr : {0, 8, 16}) stores.push_back(BuildStore(hx, 0, E, 0, inter, 1, tr, 0));
  for (int K : {2, 6}) {
    for (int64_t T : {1, 5, 64, 300}) {
      const std::vector<float> x = RandomBf16(T * dim, 1.0f, 100 + T * K);
      const model::RouterResult r = RandomRouting(T, K, E, 200 + T * K);
      const std::vector<float> ref = Reference(hx, x, r, T, K, 0, E, limit);
      for (size_t s = 0; s < stores.size(); ++s) {
        const std::vector<float> got =
            RunDevice(x, r, T, K, E, 0, E, {{0, E, &stores[s]}}, limit, true);
        const golden::Closeness c =
            Report("small T=" + std::to_string(T) + " K=" + std::to_string(K) +
                       " tile_rows=" + std::to_string(stores[s].layout.tile_rows),
                   got, ref);
        EXPECT_LE(c.rms_rel, 5e-3) << "T=" << T << " K=" << K << " store " << s;
        EXPECT_GE(c.bit_identical, 0.8) << "T=" << T << " K=" << K << " store " << s;
        if (s > 0) {
          EXPECT_TRUE(
              BitIdentical(got, RunDevice(x, r, T, K, E, 0, E, {{0, E, &stores[0]}}, limit, true)))
              << "tiled and row-major layouts differ, T=" << T << " K=" << K;
        }
      }
    }
  }
}

// Ids outside [expert_begin, expert_end) are not routed: the sum is the reference's over the
// routes inside; several groups give the bits one group gives; a second run repeats them.
TEST_F(Mxfp4MoeTest, ExpertRangeGroupsAndRepeatability) {
  const int64_t dim = 256, inter = 256, T = 300;
  const int E = 8, K = 4;
  const float limit = 7.0f;
  const HostExperts hx = RandomExperts(dim, inter, E, 21);
  const std::vector<float> x = RandomBf16(T * dim, 1.0f, 22);
  const model::RouterResult r = RandomRouting(T, K, E, 23);
  const DeviceStore all = BuildStore(hx, 0, E, 0, inter, 1, 16, 0);
  const int eb = 2, ee = 7;
  const std::vector<float> ref = Reference(hx, x, r, T, K, eb, ee, limit);
  const std::vector<float> one = RunDevice(x, r, T, K, E, eb, ee, {{0, E, &all}}, limit, true);
  const golden::Closeness c = Report("expert range [2, 7)", one, ref);
  EXPECT_LE(c.rms_rel, 5e-3);
  EXPECT_GE(c.bit_identical, 0.8);
  const DeviceStore g0 = BuildStore(hx, 0, 3, 0, inter, 1, 16, 0);
  const DeviceStore g1 = BuildStore(hx, 3, 4, 0, inter, 1, 16, 0);
  const DeviceStore g2 = BuildStore(hx, 4, 8, 0, inter, 1, 16, 0);
  const std::vector<float> several =
      RunDevice(x, r, T, K, E, eb, ee, {{0, 3, &g0}, {3, 4, &g1}, {4, 8, &g2}}, limit, true);
  EXPECT_TRUE(BitIdentical(one, several)) << "three groups differ from one";
  EXPECT_TRUE(BitIdentical(one, RunDevice(x, r, T, K, E, eb, ee, {{0, E, &all}}, limit, true)))
      << "a second run differs";
  // A token with no route in range sums to 0.
  const std::vector<float> none = RunDevice(x, r, T, K, E, 3, 3, {{0, E, &all}}, limit, true);
  EXPECT_TRUE(std::all_of(none.begin(), none.end(), [](float v) { return v == 0.0f; }));
}

// Parts: the intermediate dimension as two parts in one call gives the whole expert's bits; two
// calls on the halves (fp32 partials, the halves' w2 scales read through w2_scale_col0) sum to
// the whole within the partials' rounding.
TEST_F(Mxfp4MoeTest, PartsOfTheIntermediateDimension) {
  const int64_t dim = 256, inter = 512, T = 64;
  const int E = 4, K = 2;
  const float limit = 10.0f;
  const HostExperts hx = RandomExperts(dim, inter, E, 31);
  const std::vector<float> x = RandomBf16(T * dim, 1.0f, 32);
  const model::RouterResult r = RandomRouting(T, K, E, 33);
  const std::vector<float> ref = Reference(hx, x, r, T, K, 0, E, limit);
  const DeviceStore whole = BuildStore(hx, 0, E, 0, inter, 1, 0, 4);
  const DeviceStore two = BuildStore(hx, 0, E, 0, inter / 2, 2, 8, 4);
  const std::vector<float> w = RunDevice(x, r, T, K, E, 0, E, {{0, E, &whole}}, limit, true);
  Report("parts=1 I=512", w, ref);
  const std::vector<float> p2 = RunDevice(x, r, T, K, E, 0, E, {{0, E, &two}}, limit, true);
  const golden::Closeness c = Report("parts=2 I=512 (one call)", p2, ref);
  EXPECT_LE(c.rms_rel, 5e-3);
  EXPECT_TRUE(BitIdentical(w, p2)) << "two parts in one call differ from the whole";
  const DeviceStore lo = BuildStore(hx, 0, E, 0, inter / 2, 1, 16, 4);
  const DeviceStore hi = BuildStore(hx, 0, E, inter / 2, inter / 2, 1, 0, 0);
  const std::vector<float> wf = RunDevice(x, r, T, K, E, 0, E, {{0, E, &whole}}, limit, false);
  const std::vector<float> a = RunDevice(x, r, T, K, E, 0, E, {{0, E, &lo}}, limit, false);
  const std::vector<float> b = RunDevice(x, r, T, K, E, 0, E, {{0, E, &hi}}, limit, false);
  std::vector<float> halves(a.size());
  for (size_t i = 0; i < a.size(); ++i) halves[i] = a[i] + b[i];
  const golden::Closeness ch = Report("two half slices (fp32 partials) vs whole fp32", halves, wf);
  EXPECT_LE(ch.rms_rel, 1e-5);
  const golden::Closeness cr = Report("two half slices vs reference", halves, ref);
  EXPECT_LE(cr.rms_rel, 5e-3);
}

// Flash shapes: dim 4096, I 2048, 16 experts, top-6 of 512 tokens (about 192 routes each).
TEST_F(Mxfp4MoeTest, FlashShapesMatchTheReference) {
  const int64_t dim = 4096, inter = 2048, T = 512;
  const int E = 16, K = 6;
  const float limit = 10.0f;
  const HostExperts hx = RandomExperts(dim, inter, E, 41);
  const std::vector<float> x = RandomBf16(T * dim, 1.0f, 42);
  const model::RouterResult r = RandomRouting(T, K, E, 43);
  const std::vector<float> ref = Reference(hx, x, r, T, K, 0, E, limit);
  const DeviceStore s = BuildStore(hx, 0, E, 0, inter, 1, 16, 0);
  const std::vector<float> got = RunDevice(x, r, T, K, E, 0, E, {{0, E, &s}}, limit, true);
  const golden::Closeness c = Report("Flash shapes dim=4096 I=2048 E=16 T=512 K=6", got, ref);
  EXPECT_LE(c.rms_rel, 5e-3);
  EXPECT_GE(c.bit_identical, 0.8);
  const DeviceStore rm = BuildStore(hx, 0, E, 0, inter, 1, 0, 0);
  EXPECT_TRUE(BitIdentical(got, RunDevice(x, r, T, K, E, 0, E, {{0, E, &rm}}, limit, true)))
      << "row-major and tiled layouts differ at Flash shapes";
}

// Arguments outside the stated limits are refused before anything is launched (runs anywhere).
TEST(Mxfp4MoeArgsTest, OutOfLimitArgumentsAreRefused) {
  Mxfp4MoeGroupParams p;
  p.T = 4;
  p.K = 2;
  p.expert_begin = 0;
  p.expert_end = 1;
  p.layout.dim = 256;
  p.layout.part_inter = 256;
  p.layout.w2_scale_stride = 8;
  Mxfp4MoeGroupParams empty = p;  // no experts: nothing to launch
  empty.expert_end = empty.expert_begin;
  EXPECT_EQ(Mxfp4MoeGroup(empty, nullptr), cudaSuccess);
  Mxfp4MoeGroupParams bad = p;
  bad.layout.dim = 200;
  EXPECT_EQ(Mxfp4MoeGroup(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.layout.tile_rows = 4;
  EXPECT_EQ(Mxfp4MoeGroup(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.layout.parts = kMxfp4MoeMaxParts + 1;
  EXPECT_EQ(Mxfp4MoeGroup(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.layout.w2_scale_col0 = 2;
  bad.layout.w2_scale_stride = 16;
  EXPECT_EQ(Mxfp4MoeGroup(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.K = kMxfp4MoeMaxTopK + 1;
  EXPECT_EQ(Mxfp4MoeGroup(bad, nullptr), cudaErrorInvalidValue);
  MoeBuildRoutingParams bp;
  bp.T = 1;
  bp.K = 2;
  bp.E = kMxfp4MoeMaxExperts + 1;
  bp.expert_end = 1;
  EXPECT_EQ(MoeBuildRouting(bp, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(FakeQuantE4m3(nullptr, 1, 100, nullptr, nullptr), cudaErrorInvalidValue);
  MoeCombineRoutesParams cp;
  cp.T = 1;
  cp.K = 2;
  cp.dim = 6;
  EXPECT_EQ(MoeCombineRoutes(cp, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ss::cuda
