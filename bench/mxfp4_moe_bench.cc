// One Flash-shaped MoE layer's routed experts on the GPU, the streamed path's compute half
// (gpu_worker/kernels/mxfp4_moe.h): MoeBuildRouting + FakeQuantE4m3 + Mxfp4MoeGroup over all 256
// experts (8 groups of 32, every expert's weights on the device) + MoeCombineRoutes, at T = 2048
// and 8192 tokens, top-6, dim 4096, I 2048. Prints ms per layer and TFLOP/s counting
// 2·3·dim·I FLOP per route. Weights are random codes with moderate scales; tokens pick 6
// distinct uniform experts. Usage: mxfp4_moe_bench [--sm86-smem] [T ...]; --sm86-smem limits the
// multiprocessors' shared memory to SM 8.6's 100 KiB (the blocks resident per SM as on a 3090).
//
// mxfp4_moe_bench --decode: the resident experts at decode (mxfp4_moe_decode.h). 64 Flash-shaped
// experts at slots (tile_rows 16, about 12.8 MB each, 0.8 GB: far more than any L2), T = 1 and
// T = 8 tokens with K = 6 distinct random slots each, 32 such routings rotated call after call.
// Times Mxfp4MoeDecode against what it replaces (FakeQuantE4m3 + MoeBuildRouting +
// Mxfp4MoeGroup over the 64 slots) and a device-to-device copy in the same run; prints us per
// call (median of 7 runs of 200 back-to-back calls), GB/s of expert bytes read (distinct experts
// of the call x their bytes), the fraction of the copy's bandwidth and the speed-up.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench/cuda_check.h"
#include "gpu_worker/kernels/mxfp4_moe.h"
#include "gpu_worker/kernels/mxfp4_moe_decode.h"
#include "gpu_worker/kernels/prepare.h"

namespace {

constexpr int64_t kDim = 4096, kInter = 2048;
constexpr int kE = 256, kK = 6, kGroups = 8;

// n standard-normal activations as bf16 bits (truncated).
std::vector<uint16_t> RandomBf16(int64_t n, std::mt19937_64& rng) {
  std::vector<uint16_t> x(n);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (uint16_t& v : x) {
    float f = nd(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
  return x;
}

int Run(int64_t T, const uint8_t* weights, const ss::cuda::Mxfp4ExpertLayout& L) {
  using namespace ss::cuda;
  const int64_t TK = T * kK;
  std::mt19937_64 rng(T);
  std::vector<int32_t> ids(TK);
  std::vector<float> wts(TK);
  std::vector<int32_t> all(kE);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(all.begin(), all.end(), 0);
    for (int k = 0; k < kK; ++k) {
      std::swap(all[k], all[k + rng() % (kE - k)]);
      ids[t * kK + k] = all[k];
      wts[t * kK + k] = 0.3f + static_cast<float>(rng() % 100) / 100.0f;
    }
  }
  const std::vector<uint16_t> x = RandomBf16(T * kDim, rng);
  int32_t *d_ids, *offs, *toffs, *tok, *slot;
  float *d_wts, *rw, *y, *sum;
  uint16_t *d_x, *xq, *h;
  CHECK_CUDA(cudaMalloc(&d_ids, TK * 4));
  CHECK_CUDA(cudaMalloc(&d_wts, TK * 4));
  CHECK_CUDA(cudaMalloc(&offs, (kE + 1) * 4));
  CHECK_CUDA(cudaMalloc(&toffs, (kE + 1) * 4));
  CHECK_CUDA(cudaMalloc(&tok, TK * 4));
  CHECK_CUDA(cudaMalloc(&slot, TK * 4));
  CHECK_CUDA(cudaMalloc(&rw, TK * 4));
  CHECK_CUDA(cudaMalloc(&y, TK * kDim * 4));
  CHECK_CUDA(cudaMalloc(&sum, T * kDim * 4));
  CHECK_CUDA(cudaMalloc(&d_x, T * kDim * 2));
  CHECK_CUDA(cudaMalloc(&xq, T * kDim * 2));
  CHECK_CUDA(cudaMalloc(&h, TK * kInter * 2));
  CHECK_CUDA(cudaMemcpy(d_ids, ids.data(), TK * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_wts, wts.data(), TK * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_x, x.data(), T * kDim * 2, cudaMemcpyHostToDevice));
  MoeRouting routing{offs, toffs, tok, slot, rw, nullptr};
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  const auto groups = [&] {
    for (int g = 0; g < kGroups; ++g) {
      Mxfp4MoeGroupParams p;
      p.routing = routing;
      p.T = T;
      p.K = kK;
      p.expert_begin = g * (kE / kGroups);
      p.expert_end = (g + 1) * (kE / kGroups);
      p.base = weights + p.expert_begin * L.expert_bytes;
      p.layout = L;
      p.xq = AsBf16(xq);
      p.h = AsBf16(h);
      p.y = y;
      CHECK_CUDA(Mxfp4MoeGroup(p, s));
    }
  };
  const auto layer = [&] {
    MoeBuildRoutingParams bp;
    bp.ids = d_ids;
    bp.weights = d_wts;
    bp.T = T;
    bp.K = kK;
    bp.E = kE;
    bp.expert_begin = 0;
    bp.expert_end = kE;
    bp.routing = routing;
    CHECK_CUDA(MoeBuildRouting(bp, s));
    CHECK_CUDA(FakeQuantE4m3(AsBf16(d_x), T, kDim, AsBf16(xq), s));
    groups();
    MoeCombineRoutesParams cp;
    cp.y = y;
    cp.ids = d_ids;
    cp.T = T;
    cp.K = kK;
    cp.dim = kDim;
    cp.expert_begin = 0;
    cp.expert_end = kE;
    cp.sum = sum;
    CHECK_CUDA(MoeCombineRoutes(cp, s));
  };
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  layer();
  CHECK_CUDA(cudaStreamSynchronize(s));
  const int reps = 5;
  float ms_layer = 0, ms_groups = 0;
  CHECK_CUDA(cudaEventRecord(a, s));
  for (int i = 0; i < reps; ++i) layer();
  CHECK_CUDA(cudaEventRecord(b, s));
  CHECK_CUDA(cudaEventSynchronize(b));
  CHECK_CUDA(cudaEventElapsedTime(&ms_layer, a, b));
  CHECK_CUDA(cudaEventRecord(a, s));
  for (int i = 0; i < reps; ++i) groups();
  CHECK_CUDA(cudaEventRecord(b, s));
  CHECK_CUDA(cudaEventSynchronize(b));
  CHECK_CUDA(cudaEventElapsedTime(&ms_groups, a, b));
  ms_layer /= reps;
  ms_groups /= reps;
  const double flop = static_cast<double>(TK) * 2.0 * 3.0 * kDim * kInter;
  std::printf(
      "T=%ld K=%d E=%d dim=%ld I=%ld (%d groups): layer %.2f ms = %.1f TFLOP/s; groups only %.2f "
      "ms = %.1f TFLOP/s\n",
      static_cast<long>(T), kK, kE, static_cast<long>(kDim), static_cast<long>(kInter), kGroups,
      ms_layer, flop / ms_layer * 1e-9, ms_groups, flop / ms_groups * 1e-9);
  std::vector<float> out(16);
  CHECK_CUDA(cudaMemcpy(out.data(), sum, 64, cudaMemcpyDeviceToHost));
  std::printf("  sum[0, 0..3] = %g %g %g %g\n", out[0], out[1], out[2], out[3]);
  for (void* p : std::vector<void*>{d_ids, d_wts, offs, toffs, tok, slot, rw, y, sum, d_x, xq, h}) {
    cudaFree(p);
  }
  cudaStreamDestroy(s);
  return 0;
}

// Microseconds per call of fn(i) (i the call's number): the median over `runs` of the mean of
// `calls` back-to-back calls on stream s.
double MedianMicros(cudaStream_t s, int runs, int calls, const std::function<void(int)>& fn) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < calls; ++i) fn(i);  // warm-up
  std::vector<double> us;
  for (int r = 0; r < runs; ++r) {
    CHECK_CUDA(cudaEventRecord(a, s));
    for (int i = 0; i < calls; ++i) fn(r * calls + i);
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    us.push_back(1000.0 * ms / calls);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

int RunDecode(const uint8_t* weights, const ss::cuda::Mxfp4ExpertLayout& L) {
  using namespace ss::cuda;
  constexpr int kSlots = 64, kRoutings = 32, kRuns = 7, kCalls = 200;
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  // The copy: 1 GiB device to device (read and write counted).
  const int64_t copy_bytes = int64_t{1} << 30;
  uint8_t *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
  CHECK_CUDA(cudaMemset(src, 1, copy_bytes));
  const double copy_us = MedianMicros(s, kRuns, 5, [&](int) {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, s));
  });
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  const double copy_gbs = 2.0 * copy_bytes / copy_us * 1e-3;
  std::printf(
      "decode bench: dim=%ld I=%ld, %d resident experts at slots (tile_rows 16, %.2f MB each), "
      "K=%d distinct random slots per token, %d routings rotated\n",
      static_cast<long>(kDim), static_cast<long>(kInter), kSlots, L.expert_bytes * 1e-6, kK,
      kRoutings);
  std::printf("device-to-device copy: %.0f GB/s (bytes read + written per second, 1 GiB)\n",
              copy_gbs);
  for (int64_t T : {int64_t{1}, int64_t{8}}) {
    const int64_t TK = T * kK;
    std::mt19937_64 rng(100 + T);
    std::vector<int32_t*> slots(kRoutings);
    std::vector<float*> wts(kRoutings);
    double distinct = 0;
    for (int r = 0; r < kRoutings; ++r) {
      std::vector<int32_t> ids(TK);
      std::vector<float> w(TK);
      std::vector<int32_t> all(kSlots);
      std::set<int32_t> used;
      for (int64_t t = 0; t < T; ++t) {
        std::iota(all.begin(), all.end(), 0);
        for (int k = 0; k < kK; ++k) {
          std::swap(all[k], all[k + rng() % (kSlots - k)]);
          ids[t * kK + k] = all[k];
          used.insert(all[k]);
          w[t * kK + k] = 0.3f + static_cast<float>(rng() % 100) / 100.0f;
        }
      }
      distinct += static_cast<double>(used.size()) / kRoutings;
      CHECK_CUDA(cudaMalloc(&slots[r], TK * 4));
      CHECK_CUDA(cudaMalloc(&wts[r], TK * 4));
      CHECK_CUDA(cudaMemcpy(slots[r], ids.data(), TK * 4, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(wts[r], w.data(), TK * 4, cudaMemcpyHostToDevice));
    }
    const std::vector<uint16_t> x = RandomBf16(T * kDim, rng);
    uint16_t *d_x, *xq, *h;
    float *y, *rw;
    int32_t *offs, *toffs, *tok, *slot;
    CHECK_CUDA(cudaMalloc(&d_x, T * kDim * 2));
    CHECK_CUDA(cudaMalloc(&xq, T * kDim * 2));
    CHECK_CUDA(cudaMalloc(&h, TK * kInter * 2));
    CHECK_CUDA(cudaMalloc(&y, TK * kDim * 4));
    CHECK_CUDA(cudaMalloc(&rw, TK * 4));
    CHECK_CUDA(cudaMalloc(&offs, (kSlots + 1) * 4));
    CHECK_CUDA(cudaMalloc(&toffs, (kSlots + 1) * 4));
    CHECK_CUDA(cudaMalloc(&tok, TK * 4));
    CHECK_CUDA(cudaMalloc(&slot, TK * 4));
    CHECK_CUDA(cudaMemcpy(d_x, x.data(), T * kDim * 2, cudaMemcpyHostToDevice));
    const auto decode = [&](int i) {
      Mxfp4MoeDecodeParams p;
      p.x = AsBf16(d_x);
      p.slots = slots[i % kRoutings];
      p.weights = wts[i % kRoutings];
      p.T = T;
      p.K = kK;
      p.n_slots = kSlots;
      p.base = weights;
      p.layout = L;
      p.h = AsBf16(h);
      p.y = y;
      CHECK_CUDA(Mxfp4MoeDecode(p, s));
    };
    MoeRouting routing{offs, toffs, tok, slot, rw, nullptr};
    const auto grouped = [&](int i) {
      CHECK_CUDA(FakeQuantE4m3(AsBf16(d_x), T, kDim, AsBf16(xq), s));
      MoeBuildRoutingParams bp;
      bp.ids = slots[i % kRoutings];
      bp.weights = wts[i % kRoutings];
      bp.T = T;
      bp.K = kK;
      bp.E = kSlots;
      bp.expert_begin = 0;
      bp.expert_end = kSlots;
      bp.routing = routing;
      CHECK_CUDA(MoeBuildRouting(bp, s));
      Mxfp4MoeGroupParams p;
      p.routing = routing;
      p.T = T;
      p.K = kK;
      p.expert_begin = 0;
      p.expert_end = kSlots;
      p.base = weights;
      p.layout = L;
      p.xq = AsBf16(xq);
      p.h = AsBf16(h);
      p.y = y;
      CHECK_CUDA(Mxfp4MoeGroup(p, s));
    };
    const double dec_us = MedianMicros(s, kRuns, kCalls, decode);
    const double grp_us = MedianMicros(s, kRuns, kCalls, grouped);
    const double bytes = distinct * static_cast<double>(L.expert_bytes);
    const double dec_gbs = bytes / dec_us * 1e-3, grp_gbs = bytes / grp_us * 1e-3;
    std::printf(
        "T=%ld K=%d: %.2f distinct experts a call = %.1f MB of weights read\n"
        "  Mxfp4MoeDecode                              %8.1f us = %6.0f GB/s = %.2f of the copy\n"
        "  FakeQuantE4m3+MoeBuildRouting+Mxfp4MoeGroup %8.1f us = %6.0f GB/s = %.2f of the copy\n"
        "  speed-up of the decode path: %.2fx\n",
        static_cast<long>(T), kK, distinct, bytes * 1e-6, dec_us, dec_gbs, dec_gbs / copy_gbs,
        grp_us, grp_gbs, grp_gbs / copy_gbs, grp_us / dec_us);
    for (void* p : std::vector<void*>{d_x, xq, h, y, rw, offs, toffs, tok, slot}) cudaFree(p);
    for (int r = 0; r < kRoutings; ++r) {
      cudaFree(slots[r]);
      cudaFree(wts[r]);
    }
  }
  cudaStreamDestroy(s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ss::cuda;
  const absl::Status st = PrepareKernels();
  if (!st.ok()) {
    std::fprintf(stderr, "PrepareKernels: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  // One expert: w1, w1_scale, w3, w3_scale, w2, w2_scale, tiled by 16 rows (the stores' layout).
  Mxfp4ExpertLayout L;
  L.dim = kDim;
  L.part_inter = kInter;
  L.parts = 1;
  L.tile_rows = 16;
  const int64_t wb = kInter * kDim / 2, sb = kInter * kDim / 32;
  L.w1[0] = 0;
  L.w1_scale[0] = wb;
  L.w3[0] = wb + sb;
  L.w3_scale[0] = 2 * wb + sb;
  L.w2[0] = 2 * wb + 2 * sb;
  L.w2_scale[0] = 3 * wb + 2 * sb;
  L.w2_scale_stride = kInter / 32;
  L.expert_bytes = 3 * wb + 3 * sb;
  const bool decode = argc > 1 && std::string(argv[1]) == "--decode";
  const int experts = decode ? 64 : kE;
  uint8_t* weights = nullptr;
  CHECK_CUDA(cudaMalloc(&weights, L.expert_bytes * experts));
  {
    std::vector<uint8_t> chunk(L.expert_bytes);
    std::mt19937_64 rng(7);
    for (uint8_t& v : chunk) v = static_cast<uint8_t>(rng());
    for (int64_t off : {wb, 2 * wb + sb, 3 * wb + 2 * sb}) {
      for (int64_t i = 0; i < sb; ++i) chunk[off + i] = static_cast<uint8_t>(117 + rng() % 5);
    }
    for (int e = 0; e < experts; ++e) {
      CHECK_CUDA(cudaMemcpy(weights + e * L.expert_bytes, chunk.data(), L.expert_bytes,
                            cudaMemcpyHostToDevice));
    }
  }
  if (decode) {
    const int rc = RunDecode(weights, L);
    cudaFree(weights);
    return rc;
  }
  std::vector<int64_t> Ts;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--sm86-smem") {
      // The grouped GEMMs with at most SM 8.6's 100 KiB of shared memory a multiprocessor (the
      // preferred carveout of the device's maximum): the blocks resident per SM as on an RTX 3090.
      int per_sm = 0;
      CHECK_CUDA(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
      const int pct = (100 * 1024 * 100 + per_sm - 1) / per_sm;
      for (const void* k : {Mxfp4MoeGemmUpKernel(), Mxfp4MoeGemmDownKernel()}) {
        CHECK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, pct));
      }
      std::printf("shared memory carveout %d%% of %d KiB a multiprocessor\n", pct, per_sm / 1024);
      continue;
    }
    Ts.push_back(std::atoll(argv[i]));
  }
  if (Ts.empty()) Ts = {2048, 8192};
  for (int64_t T : Ts) Run(T, weights, L);
  cudaFree(weights);
  return 0;
}
