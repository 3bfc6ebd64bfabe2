// How long the reference model takes for the tiny-a cases, as a benchmark (not a timed test).
// Prints wall time per case and its ratio to a baseline measured in the same run: one pass
// of 64-bit reads over every byte of the checkpoint's tensors (the machine is shared and noisy,
// so only ratios within one run compare).
//
//   build/bin/reference_model_bench [--model DIR] [--repeats N] [--decode-only] [--batch 1|8]
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
  bool decode_only = false;  // --decode-only: just the batched decode cases (for profiling)
  int64_t only_batch = 0;    // --batch N: only that batch size's decode case (implies the above)
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--decode-only")) {
      decode_only = true;
    } else if (!std::strcmp(argv[i], "--model") && has_value) {
      dir = argv[++i];
    } else if (!std::strcmp(argv[i], "--repeats") && has_value) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--batch") && has_value) {
      only_batch = std::max(1, std::atoi(argv[++i]));
      decode_only = true;
    } else {
      std::fprintf(stderr, "unknown or incomplete flag %s\n", argv[i]);
      return 2;
    }
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
  if (!decode_only) {
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
  }
  // Batched decode: B independent sequences (prefill 8 tokens each), then 48 steps of one
  // token per sequence in one Forward call. What continuous batching gets from the model.
  double one_seq_step = 0;
  for (const int64_t batch : {int64_t{1}, int64_t{8}}) {
    if (only_batch && batch != only_batch) continue;
    double step = 0;
    (void)Best(repeats, [&] {
      std::vector<ss::model::SequenceState> st;
      std::vector<std::vector<int64_t>> toks;
      for (int64_t b = 0; b < batch; ++b) {
        st.push_back(m.NewSequence());
        toks.push_back(ids(56, 10 + b));
      }
      std::vector<ss::model::ChunkRef> ch;
      for (int64_t b = 0; b < batch; ++b) ch.push_back({&st[b], toks[b].data(), 8, 0});
      (void)m.Forward(ch);
      const auto t0 = Clock::now();
      for (int64_t p = 8; p < 56; ++p) {
        ch.clear();
        for (int64_t b = 0; b < batch; ++b) ch.push_back({&st[b], toks[b].data() + p, 1, 0});
        (void)m.Forward(ch);
      }
      step = Seconds(t0) / 48;
    });
    if (batch == 1) one_seq_step = step;
    std::printf("decode_batch%lld: %.3f ms/step, %.0f tokens/s", static_cast<long long>(batch),
                step * 1e3, batch / step);
    if (one_seq_step > 0) std::printf(" = %.2f x one sequence", batch / step * one_seq_step);
    std::printf("\n");
  }
  return sink == 42 ? 1 : 0;
}
