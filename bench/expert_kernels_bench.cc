// Decode throughput of the routed-expert kernels (one thread): T tokens (default 1), top-6 of
// synthetic Flash-shaped experts (dim 4096, I 2048, MXFP4), one slice = whole experts. Prints
// the GB/s of weight bytes streamed (packed nibbles + scales of w1, w3, w2 of the 6 experts)
// per ISA, and its ratio to a baseline measured in the same run: a plain sequential read of
// the same number of bytes (a sum over uint64 words of the same experts).
//
// The bench owns more experts than one call touches and rotates the top-6 set between calls,
// so every call streams from RAM rather than from the last-level cache. The figures the issue
// asks for (cache-resident rate, the worker's decode loop, transports) are in
// splitserve-bench-experts (bench_experts_main.cc).
//
//   build/bin/expert_kernels_bench [--tokens T] [--repeats N] [--experts E] [--isa NAME]
//                                  [--inter I_SLICE]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/expert_bench_lib.h"
#include "cpu_expert_worker/kernels/dispatch.h"

int main(int argc, char** argv) {
  constexpr int64_t kDim = 4096, kTopK = 6;
  int64_t tokens = 1, num_experts = 24, inter = 2048;
  int repeats = 10;
  const char* only = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--isa")) only = argv[i + 1];
    if (!std::strcmp(argv[i], "--inter"))
      inter = std::max<int64_t>(128, std::atoi(argv[i + 1]) / 128 * 128);
    if (!std::strcmp(argv[i], "--experts"))
      num_experts = std::max<int64_t>(kTopK, std::atoi(argv[i + 1]));
  }
  const std::vector<ss::bench::SyntheticExpert> experts =
      ss::bench::MakeExperts(num_experts, kDim, inter, 1);
  // Call c uses experts [6c, 6c + 6) mod E for every token: the decode pattern of one layer.
  std::vector<std::vector<int32_t>> id_sets;
  for (int64_t set = 0; set < num_experts / kTopK; ++set) {
    std::vector<int32_t> ids(tokens * kTopK);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < kTopK; ++j)
        ids[t * kTopK + j] = static_cast<int32_t>(set * kTopK + j);
    id_sets.push_back(ids);
  }
  const size_t bytes_per_call = experts[0].Bytes() * kTopK;

  // Baseline: the same experts' bytes, read in the same rotation.
  double base = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = ss::bench::Clock::now();
    for (int32_t id : id_sets[r % id_sets.size()]) {
      const ss::bench::SyntheticExpert& e = experts[id];
      for (const auto* v : {&e.w1, &e.w1s, &e.w3, &e.w3s, &e.w2, &e.w2s})
        ss::bench::StreamReadGbps(nullptr, v->data(), v->size(), 1);
    }
    base = std::min(base, ss::bench::SecondsSince(t0));
  }
  const double base_gbs = bytes_per_call / base / 1e9;
  std::printf(
      "experts: dim %ld, I %ld, MXFP4; %ld tokens x top-%ld; %.1f MB of weights per call"
      " (%ld experts allocated)\n",
      kDim, inter, tokens, kTopK, bytes_per_call / 1e6, num_experts);
  std::printf("baseline: sequential uint64 read of %.1f MB in %.3f ms = %.2f GB/s\n",
              bytes_per_call / 1e6, base * 1e3, base_gbs);

  for (ss::expert::Isa isa : {ss::expert::Isa::kScalar, ss::expert::Isa::kAvx2,
                              ss::expert::Isa::kAvx512, ss::expert::Isa::kAmx}) {
    if (only && std::strcmp(only, ss::expert::IsaName(isa)) != 0) continue;
    const auto kernel = ss::expert::KernelFor(isa);
    if (!kernel.ok()) {
      std::printf("%-7s skipped: %s\n", ss::expert::IsaName(isa),
                  std::string(kernel.status().message()).c_str());
      continue;
    }
    const int reps = isa == ss::expert::Isa::kScalar ? std::min(repeats, 2) : repeats;
    const auto run = ss::bench::TimeKernel(**kernel, experts, kDim, tokens, kTopK, reps, id_sets);
    if (!run.ok()) {
      std::fprintf(stderr, "%s\n", std::string(run.status().message()).c_str());
      return 1;
    }
    const double best = *std::min_element(run->seconds.begin(), run->seconds.end());
    const double gbs = bytes_per_call / best / 1e9;
    std::printf("%-7s %8.3f ms  %6.2f GB/s  ratio to baseline %.3f\n", (*kernel)->name, best * 1e3,
                gbs, gbs / base_gbs);
  }
  return 0;
}
