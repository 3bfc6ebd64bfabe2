// The decode path of the resident routed experts (gpu_worker/kernels/mxfp4_moe_decode.h) against
// the grouped path it replaces at decode (FakeQuantE4m3 + MoeBuildRouting + Mxfp4MoeGroup on the
// same slots, experts and inputs) row by row of y, and, through MoeCombineRoutes, against the CPU
// reference's routed sum (model::RoutedSum): small shapes at every weight layout, parts and
// output rounding, Flash shapes (dim 4096, I 2048, 16 slots), token counts 1..8 and T·K = 64,
// slots that are −1, out of range or repeated (within a token's choices and across tokens).
// Each comparison prints rms_rel, max_rel and the bit-identical fraction. Rows of skipped choices
// must keep the sentinel they were filled with. Also: graph capture and replay with other slots,
// repeatability, compute_86 PTX, and the argument checks (these run anywhere). Without a CUDA
// device every GPU test skips with a message.
#include "gpu_worker/kernels/mxfp4_moe_decode.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/golden/golden.h"
#include "common/model/moe.h"
#include "gpu_worker/kernels/mxfp4_moe.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"
#include "tests/gpu_worker/mxfp4_moe_test_util.h"

namespace ss::cuda {
namespace {

using namespace testing_util;  // NOLINT: the shared GPU test helpers

constexpr float kSentinel = -12345.5f;

// T·K slots in [-1, n_slots + 2]: about 1 in 8 is −1, 1 in 16 out of range (n_slots or above),
// the rest uniform in [0, n_slots) (repeats within a token allowed); weights in [0.2, 1.7).
// `same`: every choice is slot 1 (one expert with all T·K routes).
model::RouterResult RandomSlots(int64_t T, int K, int n_slots, uint64_t seed, bool same = false) {
  std::mt19937_64 rng(seed);
  model::RouterResult r;
  for (int64_t i = 0; i < T * K; ++i) {
    const uint64_t u = rng() % 16;
    int32_t s = static_cast<int32_t>(rng() % n_slots);
    if (u < 2) s = -1;
    if (u == 2) s = n_slots + static_cast<int32_t>(rng() % 3);
    r.indices.push_back(same ? 1 : s);
    r.weights.push_back(0.2f + 1.5f * static_cast<float>(rng() % 1000) / 1000.0f);
  }
  return r;
}

// The device buffers of one case: x, slots, weights, and the experts at slots [0, n_slots).
struct DecodeCase {
  int64_t T = 0;
  int K = 0;
  int n_slots = 0;
  const DeviceStore* store = nullptr;
  std::vector<float> x;
  model::RouterResult r;
  float limit = 10.0f;
  bool round_output = true;
};

struct Buffers {
  explicit Buffers(const DecodeCase& c)
      : xd(ToBf16(c.x)),
        xq(c.x.size()),
        slots(c.r.indices),
        wts(c.r.weights),
        weights(c.store->bytes),
        h(std::max<int64_t>(c.T * c.K * c.store->layout.parts * c.store->layout.part_inter, 1)),
        y(std::max<int64_t>(c.T * c.K * c.store->layout.dim, 1)) {}
  DeviceBuffer<uint16_t> xd, xq;
  DeviceBuffer<int32_t> slots;
  DeviceBuffer<float> wts;
  DeviceBuffer<uint8_t> weights;
  DeviceBuffer<uint16_t> h;
  DeviceBuffer<float> y;
};

Mxfp4MoeDecodeParams DecodeParams(const DecodeCase& c, Buffers& b) {
  Mxfp4MoeDecodeParams p;
  p.x = AsBf16(b.xd.get());
  p.slots = b.slots.get();
  p.weights = b.wts.get();
  p.T = c.T;
  p.K = c.K;
  p.n_slots = c.n_slots;
  p.base = b.weights.get();
  p.layout = c.store->layout;
  p.h = AsBf16(b.h.get());
  p.y = b.y.get();
  p.limit = c.limit;
  p.round_output_bf16 = c.round_output;
  return p;
}

std::vector<float> Sentinels(const DecodeCase& c) {
  return std::vector<float>(c.T * c.K * c.store->layout.dim, kSentinel);
}

// y [T·K, dim] of the decode path (y filled with the sentinel first).
std::vector<float> RunDecode(const DecodeCase& c) {
  Buffers b(c);
  b.y.Put(Sentinels(c));
  EXPECT_EQ(Mxfp4MoeDecode(DecodeParams(c, b), nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return b.y.Get();
}

// y [T·K, dim] of the grouped path: FakeQuantE4m3(x), MoeBuildRouting(ids = slots, E = n_slots),
// Mxfp4MoeGroup over experts [0, n_slots) (y filled with the sentinel first).
std::vector<float> RunGrouped(const DecodeCase& c) {
  Buffers b(c);
  b.y.Put(Sentinels(c));
  const int64_t TK = c.T * c.K;
  const int E = c.n_slots;
  DeviceBuffer<int32_t> offsets(E + 1), tile_offsets(E + 1), tok(TK), slot(TK);
  DeviceBuffer<float> rw(TK);
  MoeRouting routing{offsets.get(), tile_offsets.get(), tok.get(), slot.get(), rw.get(), nullptr};
  MoeBuildRoutingParams bp;
  bp.ids = b.slots.get();
  bp.weights = b.wts.get();
  bp.T = c.T;
  bp.K = c.K;
  bp.E = E;
  bp.expert_begin = 0;
  bp.expert_end = E;
  bp.routing = routing;
  EXPECT_EQ(MoeBuildRouting(bp, nullptr), cudaSuccess);
  EXPECT_EQ(
      FakeQuantE4m3(AsBf16(b.xd.get()), c.T, c.store->layout.dim, AsBf16(b.xq.get()), nullptr),
      cudaSuccess);
  Mxfp4MoeGroupParams p;
  p.routing = routing;
  p.T = c.T;
  p.K = c.K;
  p.expert_begin = 0;
  p.expert_end = E;
  p.base = b.weights.get();
  p.layout = c.store->layout;
  p.xq = AsBf16(b.xq.get());
  p.h = AsBf16(b.h.get());
  p.y = b.y.get();
  p.limit = c.limit;
  p.round_output_bf16 = c.round_output;
  EXPECT_EQ(Mxfp4MoeGroup(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return b.y.Get();
}

// sum [T, dim] of y's rows through MoeCombineRoutes (the choices with slots in range).
std::vector<float> Combine(const DecodeCase& c, const std::vector<float>& y) {
  const int64_t dim = c.store->layout.dim;
  DeviceBuffer<float> yd(y), sum(c.T * dim);
  DeviceBuffer<int32_t> ids(c.r.indices);
  MoeCombineRoutesParams cp;
  cp.y = yd.get();
  cp.ids = ids.get();
  cp.T = c.T;
  cp.K = c.K;
  cp.dim = dim;
  cp.expert_begin = 0;
  cp.expert_end = c.n_slots;
  cp.sum = sum.get();
  EXPECT_EQ(MoeCombineRoutes(cp, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return sum.Get();
}

// Decode vs grouped on the routed rows (printed, rms_rel <= 1e-3, bit-identical >= 0.99), the
// sentinel kept in both on the other rows; returns the decode path's y.
std::vector<float> ExpectMatchesGrouped(const std::string& what, const DecodeCase& c) {
  const std::vector<float> got = RunDecode(c);
  const std::vector<float> ref = RunGrouped(c);
  const int64_t dim = c.store->layout.dim;
  std::vector<float> g, f;
  int64_t routed = 0, untouched_bad = 0;
  for (int64_t i = 0; i < c.T * c.K; ++i) {
    const int32_t s = c.r.indices[i];
    const float* gr = got.data() + i * dim;
    const float* fr = ref.data() + i * dim;
    if (s >= 0 && s < c.n_slots) {
      ++routed;
      g.insert(g.end(), gr, gr + dim);
      f.insert(f.end(), fr, fr + dim);
    } else {
      for (int64_t j = 0; j < dim; ++j) untouched_bad += gr[j] != kSentinel || fr[j] != kSentinel;
    }
  }
  EXPECT_EQ(untouched_bad, 0) << what << ": rows of skipped choices were written";
  if (routed == 0) return got;
  const golden::Closeness cl =
      Report(what + " (" + std::to_string(routed) + " routed rows) vs grouped", g, f);
  EXPECT_LE(cl.rms_rel, 1e-3) << what;
  EXPECT_GE(cl.bit_identical, 0.99) << what;
  return got;
}

class Mxfp4MoeDecodeTest : public GpuTest {};

TEST_F(Mxfp4MoeDecodeTest, KernelsRunFromCompute86Ptx) {
  ExpectCompute86Ptx({{"Mxfp4MoeDecodeUp", Mxfp4MoeDecodeUpKernel()},
                      {"Mxfp4MoeDecodeDown", Mxfp4MoeDecodeDownKernel()}});
}

// Small shapes: (dim, I) in {(256, 128), (512, 256)}, parts 1 and 2, every tiling, output rounded
// or fp32, T in {1, 2, 5, 8} and K in {2, 6}, plus T·K = 64 (T = 8, K = 8) and 64 routes to one
// expert; the rounded whole experts also against the CPU reference.
TEST_F(Mxfp4MoeDecodeTest, SmallShapesMatchTheGroupedPathAndTheReference) {
  struct Shape {
    int64_t dim, inter;
  };
  struct StoreKind {
    int parts;
    int64_t tile_rows, pad;
    bool round_output;
  };
  const int n_slots = 8;
  for (const Shape sh : {Shape{256, 128}, Shape{512, 256}}) {
    const HostExperts hx = RandomExperts(sh.dim, sh.inter, n_slots, 11 + sh.dim);
    for (const StoreKind k :
         {StoreKind{1, 0, 0, true}, StoreKind{1, 8, 4, false}, StoreKind{1, 16, 0, true},
          StoreKind{2, 16, 4, true}, StoreKind{2, 0, 0, false}, StoreKind{2, 8, 0, true}}) {
      if (sh.inter / k.parts % 128 != 0) continue;
      const DeviceStore store =
          BuildStore(hx, 0, n_slots, 0, sh.inter / k.parts, k.parts, k.tile_rows, k.pad);
      struct TK {
        int64_t T;
        int K;
        bool same;
      };
      for (const TK tk :
           {TK{1, 2, false}, TK{1, 6, false}, TK{2, 2, false}, TK{2, 6, false}, TK{5, 2, false},
            TK{5, 6, false}, TK{8, 2, false}, TK{8, 6, false}, TK{8, 8, false}, TK{8, 8, true}}) {
        DecodeCase c;
        c.T = tk.T;
        c.K = tk.K;
        c.n_slots = n_slots;
        c.store = &store;
        c.x = RandomBf16(tk.T * sh.dim, 1.0f, 100 + tk.T * tk.K + sh.dim);
        c.r = RandomSlots(tk.T, tk.K, n_slots, 200 + tk.T * tk.K + k.tile_rows, tk.same);
        c.round_output = k.round_output;
        const std::string what =
            "dim=" + std::to_string(sh.dim) + " I=" + std::to_string(sh.inter) +
            " parts=" + std::to_string(k.parts) + " tile_rows=" + std::to_string(k.tile_rows) +
            (k.round_output ? " bf16" : " fp32") + " T=" + std::to_string(tk.T) +
            " K=" + std::to_string(tk.K) + (tk.same ? " one-slot" : "");
        const std::vector<float> y = ExpectMatchesGrouped(what, c);
        const bool any_routed = std::any_of(c.r.indices.begin(), c.r.indices.end(),
                                            [&](int32_t s) { return s >= 0 && s < n_slots; });
        if (k.round_output && k.tile_rows == 16 && !tk.same && any_routed) {
          const std::vector<float> ref = Reference(hx, c.x, c.r, c.T, c.K, 0, n_slots, c.limit);
          const golden::Closeness cl = Report(what + " sum vs CPU reference", Combine(c, y), ref);
          EXPECT_LE(cl.rms_rel, 5e-3) << what;
        }
      }
    }
  }
}

// Flash shapes: dim 4096, I 2048, 16 slots tiled by 16, T in {1, 2, 5, 8}, K = 6 (and T = 8 with
// K = 2); T = 8 also against the CPU reference.
TEST_F(Mxfp4MoeDecodeTest, FlashShapesMatchTheGroupedPathAndTheReference) {
  const int64_t dim = 4096, inter = 2048;
  const int n_slots = 16;
  const HostExperts hx = RandomExperts(dim, inter, n_slots, 41);
  const DeviceStore store = BuildStore(hx, 0, n_slots, 0, inter, 1, 16, 0);
  for (const auto& [T, K] :
       std::vector<std::pair<int64_t, int>>{{1, 6}, {2, 6}, {5, 6}, {8, 6}, {8, 2}}) {
    DecodeCase c;
    c.T = T;
    c.K = K;
    c.n_slots = n_slots;
    c.store = &store;
    c.x = RandomBf16(T * dim, 1.0f, 42 + T);
    c.r = RandomSlots(T, K, n_slots, 43 + T * K);
    const std::string what =
        "Flash dim=4096 I=2048 T=" + std::to_string(T) + " K=" + std::to_string(K);
    const std::vector<float> y = ExpectMatchesGrouped(what, c);
    if (T == 8 && K == 6) {
      const std::vector<float> ref = Reference(hx, c.x, c.r, T, K, 0, n_slots, c.limit);
      const golden::Closeness cl = Report(what + " sum vs CPU reference", Combine(c, y), ref);
      EXPECT_LE(cl.rms_rel, 5e-3);
    }
  }
}

// One call captured in a graph and replayed with other slots (and so another number of distinct
// experts) gives the bits of a direct launch with those slots; a second direct launch repeats
// them.
TEST_F(Mxfp4MoeDecodeTest, GraphReplayWithOtherSlotsAndRepeatability) {
  const int64_t dim = 512, inter = 256, T = 5;
  const int K = 6, n_slots = 8;
  const HostExperts hx = RandomExperts(dim, inter, n_slots, 51);
  const DeviceStore store = BuildStore(hx, 0, n_slots, 0, inter, 1, 16, 0);
  DecodeCase c;
  c.T = T;
  c.K = K;
  c.n_slots = n_slots;
  c.store = &store;
  c.x = RandomBf16(T * dim, 1.0f, 52);
  c.r = RandomSlots(T, K, n_slots, 53);
  DecodeCase c2 = c;
  c2.r = RandomSlots(T, K, n_slots, 54);
  c2.r.indices[0] = 3;  // at least one routed choice
  const std::vector<float> direct = RunDecode(c2);
  EXPECT_TRUE(BitIdentical(direct, RunDecode(c2))) << "a second launch differs";

  Buffers b(c);
  b.y.Put(Sentinels(c));
  cudaStream_t s;
  CUDA_ASSERT_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_ASSERT_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launch = Mxfp4MoeDecode(DecodeParams(c, b), s);
  CUDA_ASSERT_OK(cudaStreamEndCapture(s, &graph));
  ASSERT_EQ(launch, cudaSuccess);
  cudaGraphExec_t exec;
  CUDA_ASSERT_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_ASSERT_OK(cudaGraphLaunch(exec, s));
  CUDA_ASSERT_OK(cudaStreamSynchronize(s));
  EXPECT_TRUE(BitIdentical(b.y.Get(), RunDecode(c))) << "the graph's first replay differs";
  b.slots.Put(c2.r.indices);
  b.wts.Put(c2.r.weights);
  b.y.Put(Sentinels(c2));
  CUDA_ASSERT_OK(cudaGraphLaunch(exec, s));
  CUDA_ASSERT_OK(cudaStreamSynchronize(s));
  EXPECT_TRUE(BitIdentical(b.y.Get(), direct)) << "the replay with other slots differs";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// Arguments outside the stated limits are refused before anything is launched (runs anywhere).
TEST(Mxfp4MoeDecodeArgsTest, OutOfLimitArgumentsAreRefused) {
  alignas(16) static uint8_t buf[256];
  Mxfp4MoeDecodeParams p;
  p.x = reinterpret_cast<const bf16_t*>(buf);
  p.h = reinterpret_cast<bf16_t*>(buf);
  p.y = reinterpret_cast<float*>(buf);
  p.base = buf;
  p.T = 8;
  p.K = 8;
  p.n_slots = 0;  // nothing to launch when accepted
  p.layout.dim = 256;
  p.layout.part_inter = 256;
  p.layout.w2_scale_stride = 8;
  EXPECT_EQ(Mxfp4MoeDecode(p, nullptr), cudaSuccess);
  Mxfp4MoeDecodeParams bad = p;
  bad.T = 9;  // T·K = 72 > kMxfp4MoeDecodeMaxRoutes
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.K = 0;
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.T = 1;
  bad.K = kMxfp4MoeMaxTopK + 1;
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.n_slots = kMxfp4MoeMaxExperts + 1;
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.layout.dim = 200;
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.layout.tile_rows = 4;
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.layout.w1[0] = 8;
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.x = reinterpret_cast<const bf16_t*>(buf + 8);
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.h = reinterpret_cast<bf16_t*>(buf + 2);
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.base = buf + 4;
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.y = reinterpret_cast<float*>(buf + 2);
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.layout.dim = 1 << 20;  // the activation rows would not fit in shared memory
  bad.n_slots = 1;
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.T = 0;  // nothing to do
  bad.n_slots = 4;
  EXPECT_EQ(Mxfp4MoeDecode(bad, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace ss::cuda
