// splitserve-golden --backend cuda on tiny-a (label gpu; skips without a CUDA device): every check
// through the cuda StageBackend passes within tests/data/tiny-a/README.md's tolerances, with the
// routed experts on the host (the reference's RoutedSum). The binary run is the acceptance
// command of issue 5; this is the same run under ctest.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/golden/golden.h"
#include "gpu_worker/golden_backend.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::gpu {
namespace {

using cuda::testing_util::GpuTest;
using cuda::testing_util::kTinyA;

class GoldenCudaBackend : public GpuTest {
 protected:
  void RunFamily(const std::vector<std::string>& filters) {
    auto backend = MakeGoldenBackend({"cuda", 0, ""});
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto results = golden::RunGolden({kTinyA, kTinyA, filters, *backend});
    ASSERT_TRUE(results.ok()) << results.status();
    for (const std::string& f : filters) {
      int matched = 0;
      for (const golden::CheckResult& r : *results) matched += r.name.find(f) != std::string::npos;
      EXPECT_GT(matched, 0) << "no golden check named '" << f << "*' ran";
    }
    for (const golden::CheckResult& r : *results) {
      std::printf("%s %-34s %s\n", r.pass ? "PASS" : "FAIL", r.name.c_str(), r.figures.c_str());
      EXPECT_TRUE(r.pass) << r.name << ": " << r.figures;
      EXPECT_NE(r.figures.find(" (cuda backend)"), std::string::npos) << r.name;
    }
  }
};

TEST_F(GoldenCudaBackend, BlockPrefill) { RunFamily({"block_prefill"}); }
TEST_F(GoldenCudaBackend, BlockDecode) { RunFamily({"block_decode"}); }
TEST_F(GoldenCudaBackend, FullModel) { RunFamily({"model."}); }
TEST_F(GoldenCudaBackend, Variants) { RunFamily({"variant."}); }

}  // namespace
}  // namespace ss::gpu
