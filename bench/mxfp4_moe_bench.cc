// One Flash-shaped MoE layer's routed experts on the GPU, the streamed path's compute half
// (gpu_worker/kernels/mxfp4_moe.h): MoeBuildRouting + FakeQuantE4m3 + Mxfp4MoeGroup over all 256
// experts (8 groups of 32, every expert's weights on the device) + MoeCombineRoutes, at T = 2048
// and 8192 tokens, top-6, dim 4096, I 2048. Prints ms per layer and TFLOP/s counting
// 2·3·dim·I FLOP per route. Weights are random codes with moderate scales; tokens pick 6
// distinct uniform experts. Usage: mxfp4_moe_bench [T ...]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_worker/kernels/mxfp4_moe.h"
#include "gpu_worker/kernels/prepare.h"

namespace {

#define CHECK_CUDA(expr)                                                                         \
  do {                                                                                           \
    const cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

constexpr int64_t kDim = 4096, kInter = 2048;
constexpr int kE = 256, kK = 6, kGroups = 8;

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
  std::vector<uint16_t> x(T * kDim);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (uint16_t& v : x) {
    float f = nd(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
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
  uint8_t* weights = nullptr;
  CHECK_CUDA(cudaMalloc(&weights, L.expert_bytes * kE));
  {
    std::vector<uint8_t> chunk(L.expert_bytes);
    std::mt19937_64 rng(7);
    for (uint8_t& v : chunk) v = static_cast<uint8_t>(rng());
    for (int64_t off : {wb, 2 * wb + sb, 3 * wb + 2 * sb}) {
      for (int64_t i = 0; i < sb; ++i) chunk[off + i] = static_cast<uint8_t>(117 + rng() % 5);
    }
    for (int e = 0; e < kE; ++e) {
      CHECK_CUDA(cudaMemcpy(weights + e * L.expert_bytes, chunk.data(), L.expert_bytes,
                            cudaMemcpyHostToDevice));
    }
  }
  std::vector<int64_t> Ts;
  for (int i = 1; i < argc; ++i) Ts.push_back(std::atoll(argv[i]));
  if (Ts.empty()) Ts = {2048, 8192};
  for (int64_t T : Ts) Run(T, weights, L);
  cudaFree(weights);
  return 0;
}
