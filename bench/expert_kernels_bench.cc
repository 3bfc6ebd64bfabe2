// Decode throughput of the routed-expert kernels (one thread): T tokens (default 1), top-6 of
// synthetic Flash-shaped experts (dim 4096, I 2048, MXFP4), one slice = whole experts. Prints
// the GB/s of weight bytes streamed (packed nibbles + scales of w1, w3, w2 of the 6 experts)
// per ISA, and its ratio to a baseline measured in the same run: a plain sequential read of
// the same number of bytes (a sum over uint64 words of the same experts).
//
// The bench owns more experts than one call touches and rotates the top-6 set between calls,
// so every call streams from RAM rather than from the last-level cache.
//
//   build/bin/expert_kernels_bench [--tokens T] [--repeats N] [--experts E] [--isa NAME]
//                                  [--inter I_SLICE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cpu_expert_worker/kernels/dispatch.h"
#include "cpu_expert_worker/kernels/expert_kernels.h"

namespace {

using Clock = std::chrono::steady_clock;
using ss::expert::ExpertCall;
using ss::expert::ExpertSliceView;

constexpr int64_t kDim = 4096, kTopK = 6;
int64_t kInter = 2048;  // --inter: the slice width a worker holds (Flash: 2048 / n)

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

struct Expert {
  std::vector<uint8_t> w1, w1s, w3, w3s, w2, w2s;
  size_t Bytes() const {
    return w1.size() + w1s.size() + w3.size() + w3s.size() + w2.size() + w2s.size();
  }
};

// Random nibbles and scales near 2^-3 (the values do not change the work).
Expert MakeExpert(std::mt19937_64& rng) {
  auto bytes = [&rng](size_t n, bool scale) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t r = rng();
      for (size_t j = 0; j < 8 && i + j < n; ++j) {
        const uint8_t b = static_cast<uint8_t>(r >> (8 * j));
        v[i + j] = scale ? static_cast<uint8_t>(121 + b % 6) : b;
      }
    }
    return v;
  };
  Expert e;
  e.w1 = bytes(kInter * kDim / 2, false);
  e.w1s = bytes(kInter * kDim / 32, true);
  e.w3 = bytes(kInter * kDim / 2, false);
  e.w3s = bytes(kInter * kDim / 32, true);
  e.w2 = bytes(kDim * kInter / 2, false);
  e.w2s = bytes(kDim * kInter / 32, true);
  return e;
}

uint64_t SumWords(const std::vector<uint8_t>& v) {
  uint64_t acc = 0;
  for (size_t i = 0; i + 8 <= v.size(); i += 8) {
    uint64_t x;
    std::memcpy(&x, v.data() + i, 8);
    acc += x;
  }
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 1, num_experts = 24;
  int repeats = 10;
  const char* only = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--isa")) only = argv[i + 1];
    if (!std::strcmp(argv[i], "--inter"))
      kInter = std::max<int64_t>(128, std::atoi(argv[i + 1]) / 128 * 128);
    if (!std::strcmp(argv[i], "--experts"))
      num_experts = std::max<int64_t>(2 * kTopK, std::atoi(argv[i + 1]));
  }
  std::mt19937_64 rng(1);
  std::vector<Expert> experts;
  for (int64_t e = 0; e < num_experts; ++e) experts.push_back(MakeExpert(rng));
  std::vector<ExpertSliceView> views;
  for (const Expert& e : experts) {
    ExpertSliceView v;
    v.w1 = e.w1.data();
    v.w1_scale = e.w1s.data();
    v.w3 = e.w3.data();
    v.w3_scale = e.w3s.data();
    v.w2 = e.w2.data();
    v.w2_scale = e.w2s.data();
    v.w2_stride = kInter / 2;
    v.w2_scale_stride = kInter / 32;
    views.push_back(v);
  }
  // Call c uses experts [6c, 6c + 6) mod E for every token: the decode pattern of one layer.
  const int64_t sets = num_experts / kTopK;
  auto ids_for = [&](int64_t call) {
    std::vector<int32_t> ids(tokens * kTopK);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < kTopK; ++j)
        ids[t * kTopK + j] = static_cast<int32_t>((call % sets) * kTopK + j);
    return ids;
  };
  const size_t bytes_per_call = experts[0].Bytes() * kTopK;

  volatile uint64_t sink = 0;
  double base = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const int64_t set = r % sets;
    const auto t0 = Clock::now();
    uint64_t acc = 0;
    for (int64_t j = 0; j < kTopK; ++j) {
      const Expert& e = experts[set * kTopK + j];
      acc += SumWords(e.w1) + SumWords(e.w1s) + SumWords(e.w3) + SumWords(e.w3s) + SumWords(e.w2) +
             SumWords(e.w2s);
    }
    base = std::min(base, Seconds(t0));
    sink = sink + acc;
  }
  const double base_gbs = bytes_per_call / base / 1e9;
  std::printf(
      "experts: dim %ld, I %ld, MXFP4; %ld tokens x top-%ld; %.1f MB of weights per call"
      " (%ld experts allocated)\n",
      kDim, kInter, tokens, kTopK, bytes_per_call / 1e6, num_experts);
  std::printf("baseline: sequential uint64 read of %.1f MB in %.3f ms = %.2f GB/s\n",
              bytes_per_call / 1e6, base * 1e3, base_gbs);

  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(tokens * kDim);
  for (auto& v : x) {
    const float f = nd(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
  std::vector<float> weights(tokens * kTopK, 0.25f), out(tokens * kDim);
  for (ss::expert::Isa isa :
       {ss::expert::Isa::kScalar, ss::expert::Isa::kAvx2, ss::expert::Isa::kAvx512}) {
    if (only && std::strcmp(only, ss::expert::IsaName(isa)) != 0) continue;
    const auto kernel = ss::expert::KernelFor(isa);
    if (!kernel.ok()) {
      std::printf("%-7s skipped: %s\n", ss::expert::IsaName(isa),
                  std::string(kernel.status().message()).c_str());
      continue;
    }
    ExpertCall call;
    call.num_tokens = tokens;
    call.dim = kDim;
    call.top_k = kTopK;
    call.inter_slice = kInter;
    call.x = x.data();
    call.expert_weights = weights.data();
    call.experts = views.data();
    call.num_experts = num_experts;
    call.swiglu_limit = 10.0f;
    call.out = out.data();
    std::vector<uint8_t> ws(ss::expert::ExpertWorkspaceBytes(call));
    const int reps = isa == ss::expert::Isa::kScalar ? std::min(repeats, 2) : repeats;
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const std::vector<int32_t> ids = ids_for(r);
      call.expert_ids = ids.data();
      const auto t0 = Clock::now();
      const absl::Status st = (*kernel)->run(call, ws.data(), ws.size());
      best = std::min(best, Seconds(t0));
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
        return 1;
      }
    }
    const double gbs = bytes_per_call / best / 1e9;
    std::printf("%-7s %8.3f ms  %6.2f GB/s  ratio to baseline %.3f\n", (*kernel)->name, best * 1e3,
                gbs, gbs / base_gbs);
  }
  return 0;
}
