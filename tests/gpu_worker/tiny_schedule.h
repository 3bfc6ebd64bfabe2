// The tiny-a schedule the cuda backend tests share (cuda_backend_test.cc at TP = 1,
// cuda_tp_test.cc at TP = 2), its reference run, and the backend options of a stage.
//
// Two sequences, A (150 prompt tokens: past the 16-token window, 37 ratio-4 blocks and one
// ratio-128 block) and B (23 tokens). Step 0 prefills A[0:100) and B; step 1 the rest of A (a chunk
// starting mid-sequence) with B's first decode token; steps 2..9 decode both, so each sequence
// decodes >= 8 greedy tokens. The tokens fed are the reference's greedy choices (teacher forcing),
// so every backend sees the same inputs at every step.
//
// The reference is model::Model::RunBlock with the routed experts computed locally, i.e. exactly
// what the cpu backend runs (cpu_backend.cc) without an expert worker.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::gpu::testing_util {

using cuda::testing_util::kTinyA;

struct Feed {
  uint64_t seq = 0;
  int64_t start = 0;
  std::vector<int32_t> tokens;
  bool samples = false;
};

struct RefRun {
  std::vector<std::vector<Feed>> steps;
  std::vector<std::vector<std::vector<float>>> streams;  // [step][l]: input of block l; [n] final
  std::vector<std::vector<std::vector<float>>> logits;   // [step][sampling chunk]
};

inline constexpr int kSteps = 10;

inline std::shared_ptr<const model::Model> TinyModel() {
  static const std::shared_ptr<const model::Model> m = [] {
    auto r = model::Model::Load(kTinyA);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::shared_ptr<const model::Model>(std::move(*r)) : nullptr;
  }();
  return m;
}

inline int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

inline float Top2Margin(const std::vector<float>& v) {
  std::vector<float> s = v;
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  return s[0] - s[1];
}

// The reference run of the schedule (computed once).
inline const RefRun& Reference() {
  static const RefRun run = [] {
    RefRun r;
    const model::Model& m = *TinyModel();
    const ModelConfig& c = m.config();
    const int64_t width = c.hc_mult * c.dim;
    std::vector<int32_t> prompt_a(150), prompt_b(23);
    for (size_t i = 0; i < prompt_a.size(); ++i) prompt_a[i] = 2 + (i * 37 + 11) % 1000;
    for (size_t i = 0; i < prompt_b.size(); ++i) prompt_b[i] = 2 + (i * 91 + 5) % 1000;
    std::vector<model::SequenceState> states = {m.NewSequence(), m.NewSequence()};
    std::vector<int32_t> next(2, -1);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<Feed> feeds;
      if (step == 0) {
        feeds.push_back({0, 0, {prompt_a.begin(), prompt_a.begin() + 100}, false});
        feeds.push_back({1, 0, prompt_b, true});
      } else if (step == 1) {
        feeds.push_back({0, 100, {prompt_a.begin() + 100, prompt_a.end()}, true});
        feeds.push_back({1, 23, {next[1]}, true});
      } else {
        for (uint64_t s = 0; s < 2; ++s) {
          feeds.push_back({s, states[s].next_pos, {next[s]}, true});
        }
      }
      std::vector<std::vector<int64_t>> ids(feeds.size());
      std::vector<model::ChunkRef> refs;
      int64_t T = 0;
      for (size_t i = 0; i < feeds.size(); ++i) {
        ids[i].assign(feeds[i].tokens.begin(), feeds[i].tokens.end());
        refs.push_back({&states[feeds[i].seq], ids[i].data(), static_cast<int64_t>(ids[i].size()),
                        feeds[i].start});
        T += refs.back().n;
      }
      std::vector<std::vector<float>> hs(1, std::vector<float>(T * width));
      int64_t row = 0;
      for (const model::ChunkRef& ch : refs) {
        m.EmbedStreams(ch.tokens, ch.n, hs[0].data() + row * width);
        row += ch.n;
      }
      for (int64_t l = 0; l < c.n_layers; ++l) {
        hs.emplace_back(T * width);
        m.RunBlock(l, refs, hs[l].data(), hs[l + 1].data(), nullptr);
      }
      std::vector<std::vector<float>> lg;
      row = 0;
      for (size_t i = 0; i < feeds.size(); ++i) {
        row += refs[i].n;
        states[feeds[i].seq].next_pos += refs[i].n;
        if (!feeds[i].samples) continue;
        lg.emplace_back(c.vocab_size);
        m.Logits(hs.back().data() + (row - 1) * width, lg.back().data());
        next[feeds[i].seq] = Argmax(lg.back());
      }
      r.steps.push_back(std::move(feeds));
      r.streams.push_back(std::move(hs));
      r.logits.push_back(std::move(lg));
    }
    return r;
  }();
  return run;
}

// Stage `stage` of `num_stages` on tiny-a, layers [first, end), with room for kv_tokens.
inline CudaBackendOptions StageOptions(int stage, int num_stages, int first, int end,
                                       int64_t kv_tokens = 4096) {
  CudaBackendOptions o;
  o.stage = stage;
  o.num_stages = num_stages;
  o.first_layer = first;
  o.end_layer = end;
  o.kv_tokens = kv_tokens;
  return o;
}

// The whole model (7 layers) on one stage.
inline CudaBackendOptions WholeModelOptions(int64_t kv_tokens = 4096) {
  return StageOptions(0, 1, 0, 7, kv_tokens);
}

inline std::vector<StageChunk> Chunks(const std::vector<Feed>& feeds) {
  std::vector<StageChunk> b;
  for (const Feed& f : feeds) b.push_back({f.seq, f.start, f.tokens, f.samples, {}, {}, 0});
  return b;
}

}  // namespace ss::gpu::testing_util
