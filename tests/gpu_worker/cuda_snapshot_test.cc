// Resume snapshots in the cuda backend (gpu_worker/cuda/cuda_backend_kv.h "Resume snapshots";
// prefix caching) on tiny-a (label gpu; every test skips with a message without a CUDA device).
//
// Exactness: block tables as the coordinator builds them (the test hands out the block ids).
// Sequence A runs a prompt of P tokens in chunks [0, N/2), [N/2, N), [N, P), with a snapshot saved
// at N (a multiple of the 128-token block) into blocks of its own, then greedy decode steps; A is
// then released, so that sequence B takes A's compressor-state allocation with A's later state in
// it. B's table shares A's token blocks below N and has its own window blocks and blocks from N
// on; its first chunk is [N, P) resuming from the snapshot, then the same decode tokens. Every
// logit of B's steps must be bit-identical to A's (memcmp): prompts that end inside a ratio-4
// group, inside a ratio-128 group and inside the window after N, with N one and two blocks, on
// one stage [0, 7) and on two stages [0, 5) + [5, 7) (stage 0 streaming into stage 1).
//
// Control: a snapshot mixed from two sequences' (window blocks of one, carried slots of the
// other) gives other logits, so both parts are read.
//
// Validation: SaveSnapshot and Check refuse what backend.h lists (InvalidArgument), and a
// resumed sequence's shared prefix is not counted in kv_usage().
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/cuda/cuda_backend.h"
#include "gpu_worker/cuda/cuda_backend_kv.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"
#include "tests/gpu_worker/tiny_schedule.h"

namespace ss::gpu {
namespace {

using cuda::testing_util::GpuTest;
using namespace testing_util;  // NOLINT: the shared tiny-a model and options

constexpr int64_t kBlockTokens = 128;
constexpr int kDecodeSteps = 6;

// The stages of a pipeline on one GPU, and the coordinator's figures for their tables: the
// fixed (window) blocks a table starts with and the blocks of one snapshot (maxima over stages).
struct Pipeline {
  std::vector<std::unique_ptr<CudaBackend>> stages;
  int64_t fixed_blocks = 0, snapshot_blocks = 0, pool_blocks = 0;
};

Pipeline MakePipeline(const std::vector<int>& bounds) {
  Pipeline p;
  const int n = static_cast<int>(bounds.size()) - 1;
  p.pool_blocks = INT64_MAX;
  for (int s = 0; s < n; ++s) {
    auto b = CudaBackend::Create(TinyModel(), StageOptions(s, n, bounds[s], bounds[s + 1]));
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return {};
    p.stages.push_back(std::move(*b));
    absl::StatusOr<KvLayout> k =
        KvLayout::Create(TinyModel()->config(), bounds[s], bounds[s + 1], kBlockTokens);
    EXPECT_TRUE(k.ok()) << k.status();
    if (!k.ok()) return {};
    p.fixed_blocks = std::max(p.fixed_blocks, k->window_blocks);
    p.snapshot_blocks = std::max(p.snapshot_blocks, k->snapshot_blocks);
    p.pool_blocks = std::min(p.pool_blocks, k->PoolBlocks(4096, 8));
  }
  return p;
}

// Runs a batch through every stage (stage 0's output streams into stage 1, ...); the last
// stage's logits.
absl::Status RunPipeline(Pipeline& p, const std::vector<StageChunk>& batch,
                         std::vector<std::vector<float>>* logits) {
  std::vector<float> streams;
  for (size_t s = 0; s < p.stages.size(); ++s) {
    StageOutput out;
    const absl::Status st =
        p.stages[s]->Run(batch, s == 0 ? nullptr : streams.data(), &out, nullptr);
    if (!st.ok()) return st;
    streams = std::move(out.streams);
    if (s + 1 == p.stages.size()) *logits = std::move(out.logits);
  }
  return absl::OkStatus();
}

class CudaSnapshotTest : public GpuTest {};

// One case: A from 0 with a snapshot at N, B resumed from it; logits compared bit for bit.
void ExpectResumeIsExact(const std::vector<int>& bounds, int64_t N, int64_t P) {
  SCOPED_TRACE(testing::Message() << "stages " << bounds.size() - 1 << ", N " << N << ", P " << P);
  Pipeline pipe = MakePipeline(bounds);
  ASSERT_FALSE(pipe.stages.empty());
  const int64_t F = pipe.fixed_blocks, end = P + kDecodeSteps;
  const int64_t token_blocks = (end + kBlockTokens - 1) / kBlockTokens;
  int32_t next_id = static_cast<int32_t>(pipe.pool_blocks) - 1;  // handed out from the top down
  auto fresh = [&](int64_t n) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(next_id--);
    return ids;
  };
  const std::vector<int32_t> table_a = fresh(F + token_blocks);
  const std::vector<int32_t> snapshot = fresh(pipe.snapshot_blocks);
  std::vector<int32_t> table_b = fresh(F);
  for (int64_t j = 0; j < N / kBlockTokens; ++j) table_b.push_back(table_a[F + j]);
  for (int32_t b : fresh(token_blocks - N / kBlockTokens)) table_b.push_back(b);
  ASSERT_GE(next_id, 0) << "the pool's blocks";

  std::vector<int32_t> prompt(P);
  for (int64_t i = 0; i < P; ++i) prompt[i] = static_cast<int32_t>(2 + (i * 53 + 7) % 1000);
  const std::span<const int32_t> all(prompt);
  const uint64_t kA = 1, kB = 2;

  // A: [0, N/2), [N/2, N), the snapshot at N, [N, P), greedy decode steps.
  std::vector<std::vector<float>> logits;
  ASSERT_TRUE(
      RunPipeline(pipe, {{kA, 0, all.subspan(0, N / 2), false, table_a, {}, 0, F}}, &logits).ok());
  ASSERT_TRUE(RunPipeline(pipe,
                          {{kA, N / 2, all.subspan(N / 2, N - N / 2), false, table_a, {}, 0, F}},
                          &logits)
                  .ok());
  for (auto& stage : pipe.stages) {
    const absl::Status st = stage->SaveSnapshot(kA, N, 1, snapshot);
    ASSERT_TRUE(st.ok()) << st;
  }
  std::vector<std::vector<float>> want;  // A's logits: [N, P)'s last token, then each decode step
  std::vector<int32_t> decode;
  ASSERT_TRUE(RunPipeline(pipe, {{kA, N, all.subspan(N), true, table_a, {}, 0, F}}, &logits).ok());
  for (int k = 0;; ++k) {
    ASSERT_EQ(logits.size(), 1u);
    want.push_back(logits[0]);
    if (k == kDecodeSteps) break;
    decode.push_back(Argmax(logits[0]));
    ASSERT_TRUE(
        RunPipeline(pipe,
                    {{kA, P + k, std::span<const int32_t>(&decode[k], 1), true, table_a, {}, 0, F}},
                    &logits)
            .ok());
  }
  // A's state allocation (its state at P + kDecodeSteps) goes to B.
  for (auto& stage : pipe.stages) stage->Release(kA);

  // B: [N, P) resuming from the snapshot, then A's decode tokens.
  int64_t values = 0, identical = 0;
  for (int k = 0; k <= kDecodeSteps; ++k) {
    const std::vector<StageChunk> batch =
        k == 0 ? std::vector<StageChunk>{{kB, N, all.subspan(N), true, table_b, snapshot, 1, F}}
               : std::vector<StageChunk>{{kB,
                                          P + k - 1,
                                          std::span<const int32_t>(&decode[k - 1], 1),
                                          true,
                                          table_b,
                                          {},
                                          0,
                                          F}};
    const absl::Status st = RunPipeline(pipe, batch, &logits);
    ASSERT_TRUE(st.ok()) << "step " << k << ": " << st;
    ASSERT_EQ(logits.size(), 1u);
    ASSERT_EQ(logits[0].size(), want[k].size());
    for (size_t j = 0; j < want[k].size(); ++j) {
      ++values;
      identical += std::memcmp(&logits[0][j], &want[k][j], 4) == 0;
    }
    if (k == 0) {
      for (auto& stage : pipe.stages) {
        const KvUsage u = stage->kv_usage();
        EXPECT_EQ(u.sequences, 1);
        EXPECT_EQ(u.used_tokens, P - N) << "the shared prefix is not B's";
      }
    }
  }
  std::printf(
      "resume: %zu stage(s), N %lld, P %lld, %d decode steps: %lld of %lld logits "
      "bit-identical\n",
      pipe.stages.size(), static_cast<long long>(N), static_cast<long long>(P), kDecodeSteps,
      static_cast<long long>(identical), static_cast<long long>(values));
  EXPECT_EQ(identical, values);
}

// tiny-a: window 16, ratios 4 and 128, blocks of 128 tokens. P ends: inside a ratio-4 group and
// the window (133), on a group of 4 inside a ratio-128 group (200), inside a group of 4 further
// on (301), on a group of 4 inside the window (268).
TEST_F(CudaSnapshotTest, ResumedSequenceIsBitIdenticalOnOneStage) {
  ASSERT_NE(TinyModel(), nullptr);
  for (auto [N, P] : {std::pair<int64_t, int64_t>{128, 133}, {128, 200}, {256, 301}, {256, 268}}) {
    ExpectResumeIsExact({0, 7}, N, P);
  }
}

// Two stages: [0, 5) + [5, 7) (one window block each) and [0, 4) + [4, 7) (two and one: the
// second stage skips the tables' second fixed block, StageChunk::table_fixed_blocks).
TEST_F(CudaSnapshotTest, ResumedSequenceIsBitIdenticalOnTwoStages) {
  ASSERT_NE(TinyModel(), nullptr);
  for (const std::vector<int>& bounds : {std::vector<int>{0, 5, 7}, std::vector<int>{0, 4, 7}}) {
    for (auto [N, P] : {std::pair<int64_t, int64_t>{128, 203}, {256, 262}}) {
      ExpectResumeIsExact(bounds, N, P);
    }
  }
}

// The control: both parts of a snapshot are read. Sequences A and E (different prompts) save
// snapshots at N; a sequence resumed on A's token blocks from A's window blocks with E's carried
// slots, or from E's window blocks with A's carried slots, gives logits that differ from A's,
// while A's whole snapshot gives A's bits.
TEST_F(CudaSnapshotTest, EveryPartOfTheSnapshotIsRead) {
  ASSERT_NE(TinyModel(), nullptr);
  Pipeline pipe = MakePipeline({0, 7});
  ASSERT_EQ(pipe.stages.size(), 1u);
  const int64_t N = 128, P = 200, F = pipe.fixed_blocks, S = pipe.snapshot_blocks;
  int32_t next_id = 0;
  auto fresh = [&](int64_t n) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(next_id++);
    return ids;
  };
  std::vector<int32_t> prompt_a(P), prompt_e(N);
  for (int64_t i = 0; i < P; ++i) prompt_a[i] = static_cast<int32_t>(2 + (i * 53 + 7) % 1000);
  for (int64_t i = 0; i < N; ++i) prompt_e[i] = static_cast<int32_t>(2 + (i * 29 + 3) % 1000);
  const std::vector<int32_t> table_a = fresh(F + 2), table_e = fresh(F + 1);
  const std::vector<int32_t> snap_a = fresh(S), snap_e = fresh(S);
  const std::span<const int32_t> a(prompt_a);
  std::vector<std::vector<float>> logits;
  ASSERT_TRUE(RunPipeline(pipe, {{1, 0, a.first(N), false, table_a, {}, 0, F}}, &logits).ok());
  ASSERT_TRUE(RunPipeline(pipe, {{2, 0, prompt_e, false, table_e, {}, 0, F}}, &logits).ok());
  ASSERT_TRUE(pipe.stages[0]->SaveSnapshot(1, N, 1, snap_a).ok());
  ASSERT_TRUE(pipe.stages[0]->SaveSnapshot(2, N, 1, snap_e).ok());
  ASSERT_TRUE(RunPipeline(pipe, {{1, N, a.subspan(N), true, table_a, {}, 0, F}}, &logits).ok());
  ASSERT_EQ(logits.size(), 1u);
  const std::vector<float> want = logits[0];
  // (window blocks from, carried slots from, expected identical)
  struct Mix {
    const std::vector<int32_t>* window;
    const std::vector<int32_t>* carry;
    bool identical;
    const char* what;
  };
  uint64_t id = 10;
  for (const Mix& m : {Mix{&snap_a, &snap_a, true, "A's snapshot"},
                       Mix{&snap_a, &snap_e, false, "A's window, E's carried slots"},
                       Mix{&snap_e, &snap_a, false, "E's window, A's carried slots"}}) {
    std::vector<int32_t> snapshot(m.window->begin(), m.window->begin() + F);
    snapshot.insert(snapshot.end(), m.carry->begin() + F, m.carry->end());
    std::vector<int32_t> table = fresh(F);
    table.push_back(table_a[F]);
    table.push_back(fresh(1)[0]);
    ASSERT_TRUE(
        RunPipeline(pipe, {{id++, N, a.subspan(N), true, table, snapshot, 1, F}}, &logits).ok());
    ASSERT_EQ(logits.size(), 1u);
    ASSERT_EQ(logits[0].size(), want.size());
    int64_t same = 0;
    for (size_t j = 0; j < want.size(); ++j) same += std::memcmp(&logits[0][j], &want[j], 4) == 0;
    std::printf("resumed from %s: %lld of %zu logits bit-identical to A's\n", m.what,
                static_cast<long long>(same), want.size());
    if (m.identical) {
      EXPECT_EQ(same, static_cast<int64_t>(want.size())) << m.what;
    } else {
      EXPECT_LT(same, static_cast<int64_t>(want.size())) << m.what;
    }
  }
}

TEST_F(CudaSnapshotTest, RefusesBadSnapshotsAndResumes) {
  ASSERT_NE(TinyModel(), nullptr);
  Pipeline pipe = MakePipeline({0, 7});
  ASSERT_EQ(pipe.stages.size(), 1u);
  CudaBackend& b = *pipe.stages[0];
  const int32_t top = static_cast<int32_t>(pipe.pool_blocks);
  std::vector<int32_t> table = {0, 1, 2, 3};  // window block + 3 token blocks
  std::vector<int32_t> snapshot;
  for (int64_t i = 0; i < pipe.snapshot_blocks; ++i) snapshot.push_back(10 + i);
  const std::vector<int32_t> tokens(130, 5), one(1, 7);
  std::vector<std::vector<float>> logits;
  ASSERT_TRUE(RunPipeline(pipe, {{1, 0, tokens, false, table, {}, 0, 0}}, &logits).ok());
  auto code = [](const absl::Status& s) { return s.code(); };
  constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(b.SaveSnapshot(9, 128, 1, snapshot)), kInvalid);  // unknown sequence
  EXPECT_EQ(code(b.SaveSnapshot(1, 128, 1, snapshot)), kInvalid);  // not its next position (130)
  ASSERT_TRUE(RunPipeline(pipe, {{1, 130, one, false, table, {}, 0, 0}}, &logits).ok());
  EXPECT_EQ(code(b.SaveSnapshot(1, 131, 1, snapshot)), kInvalid);  // not a multiple of the block
  // A sequence at 128.
  ASSERT_TRUE(
      RunPipeline(
          pipe,
          {{2, 0, std::span(tokens).subspan(0, 128), false, std::vector<int32_t>{20, 21}, {}}},
          &logits)
          .ok());
  EXPECT_EQ(code(b.SaveSnapshot(2, 128, 1, std::span(snapshot).first(snapshot.size() - 1))),
            kInvalid);  // too few blocks
  std::vector<int32_t> outside = snapshot;
  outside.back() = top;
  EXPECT_EQ(code(b.SaveSnapshot(2, 128, 1, outside)), kInvalid);
  const absl::Status saved = b.SaveSnapshot(2, 128, 1, snapshot);
  EXPECT_TRUE(saved.ok()) << saved;
  EXPECT_TRUE(
      b.SaveSnapshot(2, 128, 1, std::vector<int32_t>(snapshot.begin(), snapshot.end())).ok());

  // Resumes: start not a multiple of the block, too few snapshot blocks, one outside the pool, no
  // block table, a known sequence; then a valid one.
  const std::vector<int32_t> table_b = {30, 20, 31};
  EXPECT_EQ(code(b.Check(std::vector<StageChunk>{{3, 64, one, true, table_b, snapshot, 1, 0}})),
            kInvalid);
  EXPECT_EQ(code(b.Check(std::vector<StageChunk>{
                {3, 128, one, true, table_b, std::span(snapshot).first(snapshot.size() - 1), 1}})),
            kInvalid);
  EXPECT_EQ(code(b.Check(std::vector<StageChunk>{{3, 128, one, true, table_b, outside, 1}})),
            kInvalid);
  EXPECT_EQ(code(b.Check(std::vector<StageChunk>{{3, 128, one, true, {}, snapshot, 1}})), kInvalid);
  EXPECT_EQ(code(b.Check(std::vector<StageChunk>{{2, 128, one, true, table_b, snapshot, 1, 0}})),
            kInvalid);
  const KvUsage before = b.kv_usage();
  ASSERT_TRUE(RunPipeline(pipe, {{3, 128, one, true, table_b, snapshot, 1, 0}}, &logits).ok());
  ASSERT_EQ(logits.size(), 1u);
  EXPECT_EQ(b.kv_usage().used_tokens, before.used_tokens + 1);
  EXPECT_EQ(b.kv_usage().sequences, before.sequences + 1);
  b.DropSnapshot(1);  // nothing to do: the blocks are the coordinator's
  b.Release(3);
  EXPECT_EQ(b.kv_usage().used_tokens, before.used_tokens);
}

}  // namespace
}  // namespace ss::gpu
