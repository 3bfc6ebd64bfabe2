// Resume snapshots on the cpu backend (gpu_worker/backend.h "Resume snapshots"): a sequence
// restored at a block boundary from another sequence's snapshot computes logits bit-identical to
// that sequence's own, with the same chunk boundaries, for one stage and for two pipeline stages;
// prefixes end inside a compressed group of 4, inside one of 128 and inside the window. Bad
// saves and restores are refused and change nothing.
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/model.h"
#include "gpu_worker/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_worker_test_util.h"

namespace ss::gpu {
namespace {

using testing_util::kTinyA;

using testing_util::TinyA;

// The tiny model's layers as one stage, or as two (0-3, 4-6).
class Pipeline {
 public:
  explicit Pipeline(int stages) {
    for (int s = 0; s < stages; ++s) {
      CpuBackendOptions o;
      o.stage = s;
      o.num_stages = stages;
      o.first_layer = stages == 1 || s == 0 ? 0 : 4;
      o.end_layer = stages == 2 && s == 0 ? 4 : 7;
      o.kv_tokens = 1 << 16;
      auto b = CpuBackend::Create(TinyA(), o);
      EXPECT_TRUE(b.ok()) << b.status();
      stages_.push_back(std::move(*b));
    }
  }

  // Runs one chunk through every stage; the last row's logits.
  std::vector<float> Run(uint64_t seq, int64_t start, const std::vector<int32_t>& tokens,
                         uint64_t restore = 0) {
    const std::vector<int32_t> snapshot_blocks = {7};  // the cpu backend goes by the id
    StageChunk ch;
    ch.seq_id = seq;
    ch.start = start;
    ch.tokens = tokens;
    ch.samples = true;
    if (restore != 0) {
      ch.restore_snapshot = snapshot_blocks;
      ch.restore_snapshot_id = restore;
    }
    std::vector<float> streams;
    StageOutput out;
    for (auto& stage : stages_) {
      const absl::Status st =
          stage->Run({&ch, 1}, streams.empty() ? nullptr : streams.data(), &out, nullptr);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) return {};
      streams = std::move(out.streams);
    }
    EXPECT_EQ(out.logits.size(), 1u);
    return out.logits.empty() ? std::vector<float>{} : out.logits[0];
  }

  absl::Status Save(uint64_t seq, int64_t position, uint64_t id) {
    const std::vector<int32_t> blocks = {7};
    for (auto& stage : stages_) {
      if (absl::Status st = stage->SaveSnapshot(seq, position, id, blocks); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  CpuBackend& stage(int s) { return *stages_[s]; }

 private:
  std::vector<std::unique_ptr<CpuBackend>> stages_;
};

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void CheckResumeIsExact(int stages) {
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(900);
  for (int32_t& t : prompt) t = static_cast<int32_t>(16 + rng() % 984);
  const std::vector<std::vector<int32_t>> decode = {{17}, {400}, {999}};
  uint64_t next_seq = 1, next_snapshot = 1;
  // B = 128; the prompt's end P past the resume point N: inside the next group of 4 (N + 2),
  // inside a group of 128 and inside the window (N + 61), past the window (N + 200).
  for (const int64_t n : {128, 256, 640}) {
    for (const int64_t extra : {1, 2, 61, 200}) {
      SCOPED_TRACE(absl::StrCat("stages ", stages, ", resume at ", n, ", prompt ", n + extra));
      Pipeline p(stages);
      const std::vector<int32_t> head(prompt.begin(), prompt.begin() + n);
      const std::vector<int32_t> tail(prompt.begin() + n, prompt.begin() + n + extra);
      const uint64_t a = next_seq++, b = next_seq++, snap = next_snapshot++;
      p.Run(a, 0, head);
      ASSERT_TRUE(p.Save(a, n, snap).ok());
      std::vector<std::vector<float>> want = {p.Run(a, n, tail)};
      for (size_t i = 0; i < decode.size(); ++i) {
        want.push_back(p.Run(a, n + extra + static_cast<int64_t>(i), decode[i]));
      }
      std::vector<std::vector<float>> got = {p.Run(b, n, tail, snap)};
      for (size_t i = 0; i < decode.size(); ++i) {
        got.push_back(p.Run(b, n + extra + static_cast<int64_t>(i), decode[i]));
      }
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_TRUE(BitEqual(got[i], want[i])) << "step " << i;
    }
  }
}

TEST(ResumeSnapshot, RestoredSequenceIsBitIdenticalOnOneStage) { CheckResumeIsExact(1); }
TEST(ResumeSnapshot, RestoredSequenceIsBitIdenticalOnTwoStages) { CheckResumeIsExact(2); }

TEST(ResumeSnapshot, SnapshotOutlivesItsSequenceUntilDropped) {
  Pipeline p(1);
  std::vector<int32_t> head(128, 300), tail = {301, 302};
  p.Run(1, 0, head);
  ASSERT_TRUE(p.Save(1, 128, 5).ok());
  const std::vector<float> want = p.Run(1, 128, tail);
  p.stage(0).Release(1);
  EXPECT_TRUE(BitEqual(p.Run(2, 128, tail, 5), want));
  EXPECT_EQ(p.stage(0).kv_usage().used_tokens, 2);  // the restored prefix is not counted
  p.stage(0).DropSnapshot(5);
  StageChunk ch;
  ch.seq_id = 3;
  ch.start = 128;
  ch.tokens = tail;
  const std::vector<int32_t> blocks = {7};
  ch.restore_snapshot = blocks;
  ch.restore_snapshot_id = 5;
  EXPECT_FALSE(p.stage(0).Check({&ch, 1}).ok());
}

TEST(ResumeSnapshot, BadSavesAndRestoresAreRefused) {
  Pipeline p(1);
  const std::vector<int32_t> head(128, 300), tail = {301};
  p.Run(1, 0, head);
  const std::vector<int32_t> blocks = {7};
  EXPECT_FALSE(p.stage(0).SaveSnapshot(1, 100, 1, blocks).ok());  // not its position
  EXPECT_FALSE(p.stage(0).SaveSnapshot(9, 128, 1, blocks).ok());  // unknown sequence
  EXPECT_FALSE(p.stage(0).SaveSnapshot(1, 128, 1, {}).ok());      // no blocks
  ASSERT_TRUE(p.stage(0).SaveSnapshot(1, 128, 1, blocks).ok());
  StageChunk ch;
  ch.seq_id = 1;
  ch.start = 128;
  ch.tokens = tail;
  ch.restore_snapshot = blocks;
  ch.restore_snapshot_id = 1;
  EXPECT_FALSE(p.stage(0).Check({&ch, 1}).ok()) << "the sequence exists already";
  ch.seq_id = 2;
  ch.start = 0;
  EXPECT_FALSE(p.stage(0).Check({&ch, 1}).ok()) << "a restore starts past 0";
  ch.start = 127;
  EXPECT_FALSE(p.stage(0).Check({&ch, 1}).ok()) << "the snapshot is at 128";
  ch.start = 128;
  EXPECT_TRUE(p.stage(0).Check({&ch, 1}).ok());
}

}  // namespace
}  // namespace ss::gpu
