// `splitserve up`'s command line: the values --gpu-experts and --layer-timing-every take.
#include "coordinator/up_options.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ss {
namespace {

absl::StatusOr<UpOptions> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "up");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseUpOptions(static_cast<int>(argv.size()), argv.data());
}

TEST(UpOptionsTest, GpuExpertsTakesAutoACountOrAFraction) {
  EXPECT_EQ(Parse({})->gpu_experts, "0");
  for (const char* good : {"auto", "0", "64", "0.25"}) {
    absl::StatusOr<UpOptions> o = Parse({"--gpu-experts", good});
    ASSERT_TRUE(o.ok()) << good << ": " << o.status();
    EXPECT_EQ(o->gpu_experts, good);  // passed on to every GPU worker as given
  }
  absl::StatusOr<UpOptions> o = Parse({"--gpu-experts=auto", "--gpu-experts-profile", "p.json"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->gpu_experts, "auto");
  EXPECT_EQ(o->gpu_experts_profile, "p.json");
  for (const char* bad : {"-1", "1.5", "x", "nan", "inf", "Auto", ""}) {
    absl::StatusOr<UpOptions> r = Parse({"--gpu-experts", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--gpu-experts"), std::string::npos) << r.status();
  }
  EXPECT_NE(UpUsage().find("--gpu-experts auto|N|FRACTION"), std::string::npos);
}

TEST(UpOptionsTest, LayerTimingEveryTakesACount) {
  EXPECT_FALSE(Parse({})->layer_timing_every.has_value());  // the GPU workers' default
  absl::StatusOr<UpOptions> o = Parse({"--layer-timing-every", "1"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->layer_timing_every, 1);
  EXPECT_EQ(Parse({"--layer-timing-every=0"})->layer_timing_every, 0);
  for (const char* bad : {"-1", "x", "1.5", ""}) {
    absl::StatusOr<UpOptions> r = Parse({"--layer-timing-every", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--layer-timing-every"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace ss
