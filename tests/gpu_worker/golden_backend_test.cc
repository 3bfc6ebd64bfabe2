// splitserve-golden's --backend cpu (gpu_worker/golden_backend.h) on tiny-a (label golden): every
// check that runs through the cpu StageBackend passes, and, since the cpu backend computes with
// the reference's own RunBlock, its figures equal the reference path's to the last digit. That
// pins the adapter: the right input rows, positions and sequence state for every stage call.
#include "gpu_worker/golden_backend.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/golden/golden.h"

namespace ss::gpu {
namespace {

constexpr char kTinyA[] = "tests/data/tiny-a";

void RunFamily(const std::vector<std::string>& filters) {
  auto backend = MakeGoldenBackend({"cpu", 0, ""});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto ours = golden::RunGolden({kTinyA, kTinyA, filters, *backend});
  ASSERT_TRUE(ours.ok()) << ours.status();
  auto ref = golden::RunGolden({kTinyA, kTinyA, filters, /*backend=*/nullptr});
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(ours->size(), ref->size());
  std::map<std::string, std::string> ref_figures;
  for (const golden::CheckResult& r : *ref) ref_figures[r.name] = r.figures;
  for (const std::string& f : filters) {
    int matched = 0;
    for (const golden::CheckResult& r : *ours) matched += r.name.find(f) != std::string::npos;
    EXPECT_GT(matched, 0) << "no golden check named '" << f << "*' ran";
  }
  for (const golden::CheckResult& r : *ours) {
    std::printf("%s %-34s %s\n", r.pass ? "PASS" : "FAIL", r.name.c_str(), r.figures.c_str());
    EXPECT_TRUE(r.pass) << r.name << ": " << r.figures;
    const size_t tag = r.figures.find(" (cpu backend)");
    ASSERT_NE(tag, std::string::npos) << r.name << " does not say it ran on the backend";
    EXPECT_EQ(ref_figures[r.name].substr(0, tag), r.figures.substr(0, tag)) << r.name;
  }
}

TEST(GoldenCpuBackend, BlockPrefill) { RunFamily({"block_prefill"}); }
TEST(GoldenCpuBackend, BlockDecode) { RunFamily({"block_decode"}); }
TEST(GoldenCpuBackend, FullModel) { RunFamily({"model."}); }
TEST(GoldenCpuBackend, Variants) { RunFamily({"variant."}); }

TEST(GoldenCpuBackend, InternalsSayTheyRanOnTheReference) {
  auto backend = MakeGoldenBackend({"cpu", 0, ""});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto ours = golden::RunGolden({kTinyA, kTinyA, {"loader", "rope", "hc_split", "mtp"}, *backend});
  ASSERT_TRUE(ours.ok()) << ours.status();
  EXPECT_FALSE(ours->empty());
  for (const golden::CheckResult& r : *ours) {
    EXPECT_TRUE(r.pass) << r.name << ": " << r.figures;
    EXPECT_NE(r.figures.find("[reference model: "), std::string::npos) << r.name;
  }
}

TEST(GoldenCpuBackend, Flags) {
  auto ref = MakeGoldenBackend({"reference", 0, ""});
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(*ref, nullptr);
  EXPECT_EQ(MakeGoldenBackend({"tpu", 0, ""}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeGoldenBackend({"reference", 0, "0-6=shm:x"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeGoldenBackend({"cpu", 0, "not a spec"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ss::gpu
