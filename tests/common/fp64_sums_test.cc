// common/fp64_sums.h: the --fp64_sums values and how auto resolves by a device's FP64 rate
// (cudaDevAttrSingleToDoublePrecisionPerfRatio: 2 on an H100/H200 or A100, 64 on an RTX 3090).
#include "common/fp64_sums.h"

#include "gtest/gtest.h"

namespace ss::gpu {
namespace {

TEST(Fp64Sums, ParsesItsThreeValuesAndNamesThem) {
  for (const Fp64Sums m : {Fp64Sums::kAuto, Fp64Sums::kOn, Fp64Sums::kOff}) {
    const absl::StatusOr<Fp64Sums> back = ParseFp64Sums(Fp64SumsName(m));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, m);
  }
  for (const char* bad : {"", "true", "fp32", "ON"}) {
    const absl::StatusOr<Fp64Sums> r = ParseFp64Sums(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--fp64_sums"), std::string::npos) << r.status();
  }
}

TEST(Fp64Sums, AutoRunsDoubleOnlyWhereFp64IsFast) {
  EXPECT_TRUE(UseFp64Sums(Fp64Sums::kAuto, 2));  // data-centre GPUs
  EXPECT_TRUE(UseFp64Sums(Fp64Sums::kAuto, 4));
  EXPECT_FALSE(UseFp64Sums(Fp64Sums::kAuto, 32));  // consumer GPUs
  EXPECT_FALSE(UseFp64Sums(Fp64Sums::kAuto, 64));  // RTX 3090
  EXPECT_TRUE(UseFp64Sums(Fp64Sums::kAuto, 0));    // rate unknown
  for (const int ratio : {0, 2, 64}) {
    EXPECT_TRUE(UseFp64Sums(Fp64Sums::kOn, ratio));
    EXPECT_FALSE(UseFp64Sums(Fp64Sums::kOff, ratio));
  }
}

}  // namespace
}  // namespace ss::gpu
