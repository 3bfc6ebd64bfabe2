// The host sampler (gpu_worker/sampler.h) on one row of DeepSeek-V4's 129,280 logits, per
// sampling setting: SampleToken against the plain rule (tests/gpu_worker/sampler_reference.h:
// the whole vocabulary sorted where a cut needs the order) in the same run, and that both draw
// the same token. (top_k and logprobs are left out: the rule sorts where the sampler selects
// the few it needs, so the ratio would say nothing.) Logits: normal with standard deviation 3 (a
// synthetic row; a model's rows are more peaked, which only shortens top_p's candidates).
// Then 8 rows at temperature 1 (a step of 8 sampled sequences): one after another, and in
// parallel over the rows as the stage runner draws them (OpenMP, this process's threads).
//   build/bin/sampler_bench [repeats, default 20]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gpu_worker/sampler.h"
#include "tests/gpu_worker/sampler_reference.h"

namespace {

using ss::gpu::SamplingConfig;

template <class F>
double BestMicros(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f(r);
    best = std::min(
        best,
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  constexpr int64_t kVocab = 129280;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(kVocab);
  for (float& v : logits) v = nd(rng);
  struct Setting {
    const char* name;
    float temperature, top_p;
  };
  const Setting settings[] = {{"greedy", 0.0f, 1.0f},
                              {"temperature 1", 1.0f, 1.0f},
                              {"temperature 0.6, top_p 0.95", 0.6f, 0.95f},
                              {"temperature 1, top_p 0.5", 1.0f, 0.5f},
                              {"temperature 1, top_p 0.95", 1.0f, 0.95f}};
  std::printf("sampler_bench: vocabulary %ld, best of %d calls\n", static_cast<long>(kVocab),
              repeats);
  std::printf("%-36s %12s %12s %8s %s\n", "setting", "rule us", "sampler us", "speed-up",
              "same token");
  int status = 0;
  for (const Setting& s : settings) {
    SamplingConfig c;
    c.temperature = s.temperature;
    c.top_p = s.top_p;
    c.seed = 11;
    std::vector<int32_t> want(repeats), got(repeats, -1);
    const double rule = BestMicros(
        repeats, [&](int r) { want[r] = ss::gpu::testing_util::ReferenceDraw(logits, c, r); });
    const double fast = BestMicros(repeats, [&](int r) {
      auto t = ss::gpu::SampleToken(logits.data(), kVocab, c, r);
      if (t.ok()) got[r] = t->token;
    });
    const bool same = want == got;
    std::printf("%-36s %12.1f %12.1f %7.1fx %s\n", s.name, rule, fast, rule / fast,
                same ? "yes" : "NO");
    if (!same) status = 1;
  }
  constexpr int kRows = 8;
  SamplingConfig c;
  c.temperature = 1.0f;
  c.seed = 11;
  std::vector<int32_t> serial(kRows), parallel(kRows, -1);
  const double one_by_one = BestMicros(repeats, [&](int) {
    for (int i = 0; i < kRows; ++i) {
      auto t = ss::gpu::SampleToken(logits.data(), kVocab, c, i);
      serial[i] = t.ok() ? t->token : -1;
    }
  });
  const double rows = BestMicros(repeats, [&](int) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < kRows; ++i) {
      auto t = ss::gpu::SampleToken(logits.data(), kVocab, c, i);
      parallel[i] = t.ok() ? t->token : -1;
    }
  });
  std::printf(
      "%d rows, temperature 1: one after another %.1f us, over the rows on %d threads "
      "%.1f us (%.1fx), same tokens %s\n",
      kRows, one_by_one, omp_get_max_threads(), rows, one_by_one / rows,
      serial == parallel ? "yes" : "NO");
  if (serial != parallel) status = 1;
  return status;
}
