// Golden conformance of the reference model on tiny-a (tests/data/tiny-a/README.md), split by
// check family so ctest can run the families in parallel. Each family must produce at least one
// check, so a renamed or dropped check does not pass silently.
#include "common/golden/golden.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace ss::golden {
namespace {

constexpr char kTinyA[] = "tests/data/tiny-a";

void RunFamily(std::vector<std::string> filters) {
  auto results = RunGolden({kTinyA, kTinyA, filters, /*backend=*/nullptr});
  ASSERT_TRUE(results.ok()) << results.status();
  for (const std::string& f : filters) {
    int matched = 0;
    for (const CheckResult& r : *results) matched += r.name.find(f) != std::string::npos;
    EXPECT_GT(matched, 0) << "no golden check named '" << f << "*' ran";
  }
  for (const CheckResult& r : *results) {
    EXPECT_TRUE(r.pass) << r.name << ": " << r.figures;
    std::printf("%s %-34s %s\n", r.pass ? "PASS" : "FAIL", r.name.c_str(), r.figures.c_str());
  }
}

TEST(Golden, LoaderRopeHcSplit) { RunFamily({"loader", "rope", "hc_split"}); }
TEST(Golden, BlockPrefill) { RunFamily({"block_prefill"}); }
TEST(Golden, BlockDecode) { RunFamily({"block_decode"}); }
TEST(Golden, Mtp) { RunFamily({"mtp"}); }
TEST(Golden, FullModel) { RunFamily({"model."}); }
TEST(Golden, Variants) { RunFamily({"variant."}); }

}  // namespace
}  // namespace ss::golden
