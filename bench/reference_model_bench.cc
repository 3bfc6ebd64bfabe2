// How long the reference model takes for the tiny-a cases, as a benchmark (not a timed test).
// Prints wall time per case and its ratio to a baseline measured in the same run: one pass
// of 64-bit reads over every byte of the checkpoint's tensors (the machine is shared and noisy,
// so only ratios within one run compare).
//
//   build/bin/reference_model_bench [--model DIR] [--repeats N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/model/model.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

template <typename F>
double Best(int repeats, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, Seconds(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "tests/data/tiny-a";
  int repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::max(1, std::atoi(argv[i + 1]));
  }
  auto loaded = ss::model::Model::Load(dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  const ss::model::Model& m = **loaded;
  const int64_t vocab = m.config().vocab_size;

  volatile uint64_t sink = 0;
  size_t bytes = 0;
  const double base = Best(repeats, [&] {
    uint64_t acc = 0;
    bytes = 0;
    for (const auto& [name, v] : m.weights().checkpoint->tensors()) {
      for (size_t i = 0; i + 8 <= v->nbytes; i += 8) {
        uint64_t x;
        std::memcpy(&x, v->data + i, 8);
        acc += x;
      }
      bytes += v->nbytes;
    }
    sink = sink + acc;
  });
  std::printf("baseline: read %zu checkpoint bytes in %.4f s (%.2f GB/s)\n", bytes, base,
              bytes / base / 1e9);

  auto ids = [&](int64_t n, int64_t seed) {
    std::vector<int64_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = (seed * 7919 + i * 104729) % vocab;
    return v;
  };
  const std::vector<int64_t> p300 = ids(300, 1);
  const double prefill300 = Best(repeats, [&] {
    ss::model::SequenceState st = m.NewSequence();
    ss::model::ChunkRef ch{&st, p300.data(), 300, 0};
    (void)m.Forward({&ch, 1});
  });
  std::printf("prefill_L300 (one forward of 300 tokens): %.3f s = %.1f x baseline\n", prefill300,
              prefill300 / base);

  const std::vector<int64_t> seq = ids(301, 2);
  double decode = 0;
  const double longcase = Best(repeats, [&] {
    ss::model::SequenceState st = m.NewSequence();
    ss::model::ChunkRef ch{&st, seq.data(), 21, 0};
    (void)m.Forward({&ch, 1});
    const auto t0 = Clock::now();
    for (int64_t p = 21; p < 301; ++p) {
      ss::model::ChunkRef d{&st, seq.data() + p, 1, 0};
      (void)m.Forward({&d, 1});
    }
    decode = Seconds(t0) / 280;
  });
  std::printf(
      "long_greedy (prefill 21 + 280 one-token decode steps): %.3f s = %.1f x baseline; "
      "decode %.2f ms/token = %.2f x baseline\n",
      longcase, longcase / base, decode * 1e3, decode / base);
  return sink == 42 ? 1 : 0;
}
