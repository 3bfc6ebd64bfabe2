// What `splitserve up` shows while its children load (coordinator/load_display.h): the sums, the
// line and the bar, and when the display draws and erases.
#include "coordinator/load_display.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "common/file_write.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ss {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
using Clock = LoadDisplay::Clock;

LoadPhase Phase(int64_t done, int64_t total, bool finished) {
  return LoadPhase{.what = "x", .done = done, .total = total, .seconds = 1, .finished = finished};
}

TEST(LoadDisplay, SumsEveryChildsPhasesAndNamesEachChild) {
  const LoadSummary s = SummarizeLoads({
      {"gpu0", {Phase(2 * kGiB, 2 * kGiB, true), Phase(kGiB, 4 * kGiB, false)}},
      {"gpu1", {}},  // no file yet: left out
      {"expert0", {Phase(3 * kGiB, 12 * kGiB, false)}},
      {"expert1", {Phase(kGiB, 2 * kGiB, true)}},  // done: what it loaded is its total
  });
  EXPECT_TRUE(s.any);
  EXPECT_FALSE(s.finished);
  EXPECT_EQ(s.done, 7 * kGiB);
  EXPECT_EQ(s.total, 19 * kGiB);
  EXPECT_EQ(s.children, "gpu0 50%, expert0 25%, expert1 done");
  EXPECT_FALSE(SummarizeLoads({{"gpu0", {}}}).any);
  EXPECT_EQ(SummarizeLoads({{"gpu0", {Phase(kGiB, 0, false)}}}).children, "gpu0 1.00 GiB");
}

TEST(LoadDisplay, TheLineAndTheBarCutToTheTerminal) {
  const LoadSummary s = SummarizeLoads({{"gpu0", {Phase(kGiB, 4 * kGiB, false)}}});
  EXPECT_EQ(LoadDisplayLine(s, 1.0, 0, 0),
            "splitserve up: loading: 1.00 of 4.00 GiB (25%), 1.07 GB/s, about 3 s left (gpu0 25%)");
  EXPECT_EQ(LoadDisplayLine(s, 1.0, 8, 0),
            "splitserve up: [##------] loading: 1.00 of 4.00 GiB (25%), 1.07 GB/s, about 3 s left "
            "(gpu0 25%)");
  EXPECT_EQ(LoadDisplayLine(s, 1.0, 8, 30), "splitserve up: [##------] load");
}

class LoadDisplayFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir();
    files_ = {{"gpu0", dir_ + "/ld_gpu0.json"}, {"expert0", dir_ + "/ld_expert0.json"}};
    out_ = std::tmpfile();
    ASSERT_NE(out_, nullptr);
  }
  void TearDown() override {
    std::fclose(out_);
    for (const auto& [n, f] : files_) std::remove(f.c_str());
  }
  void Write(int i, int64_t done, int64_t total, bool finished) {
    ASSERT_TRUE(WriteFileAtomically(files_[i].second, "{\"phases\": [{\"what\": \"w\", \"done\": " +
                                                          std::to_string(done) +
                                                          ", \"total\": " + std::to_string(total) +
                                                          ", \"seconds\": 1.0, \"finished\": " +
                                                          (finished ? "true" : "false") + "}]}")
                    .ok());
  }
  std::string Shown() { return testing_util::ReadAll(out_); }
  std::string dir_;
  std::vector<std::pair<std::string, std::string>> files_;
  std::FILE* out_ = nullptr;
};

TEST_F(LoadDisplayFiles, LinesEveryFewSecondsAfterTheFirstAndASummaryWhenReady) {
  LoadDisplay d(files_, out_, nullptr);
  const Clock::time_point t0 = Clock::now();
  Write(0, kGiB, 2 * kGiB, false);  // a file of an earlier start: removed by Restart
  d.Restart(t0);
  std::ifstream stale(files_[0].second);
  EXPECT_FALSE(stale.good());
  Write(0, kGiB, 2 * kGiB, false);
  Write(1, 0, 2 * kGiB, false);
  d.Poll(t0 + std::chrono::milliseconds(500));  // before a second: nothing
  EXPECT_EQ(Shown(), "");
  d.Poll(t0 + std::chrono::seconds(1));
  d.Poll(t0 + std::chrono::seconds(3));  // within 5 s of the last line: nothing
  Write(1, 2 * kGiB, 2 * kGiB, true);
  Write(0, 2 * kGiB, 2 * kGiB, true);
  d.Stop(t0 + std::chrono::seconds(4), /*ready=*/true);
  d.Poll(t0 + std::chrono::seconds(10));  // stopped: nothing more
  EXPECT_EQ(Shown(),
            "splitserve up: loading: 1.00 of 4.00 GiB (25%), 1.07 GB/s, about 3 s left (gpu0 50%, "
            "expert0 0%)\n"
            "splitserve up: loaded: 4.00 GiB in 4.0 s (1.07 GB/s)\n");
}

TEST_F(LoadDisplayFiles, ABarRedrawnInPlaceAndErasedWithoutASummaryWhenAbandoned) {
  absl::StatusOr<std::unique_ptr<Console>> console = Console::Create(out_, /*relay=*/false);
  ASSERT_TRUE(console.ok());
  LoadDisplay d(files_, out_, console->get());
  const Clock::time_point t0 = Clock::now();
  d.Restart(t0);
  d.Poll(t0 + std::chrono::seconds(2));  // no file yet: nothing
  Write(0, kGiB, 4 * kGiB, false);
  d.Poll(t0 + std::chrono::seconds(2) + std::chrono::milliseconds(100));  // not due yet
  d.Poll(t0 + std::chrono::seconds(3));
  d.Stop(t0 + std::chrono::seconds(4), /*ready=*/false);
  const std::string shown = Shown();
  EXPECT_EQ(
      shown.rfind("\r\033[Ksplitserve up: [#####---------------] loading: 1.00 of 4.00 GiB", 0), 0u)
      << shown;
  EXPECT_EQ(shown.find('\n'), std::string::npos) << shown;
  EXPECT_EQ(shown.substr(shown.size() - 5), "\r\r\033[K") << shown;
}

TEST_F(LoadDisplayFiles, NothingWhenTheLoadIsOverWithinASecond) {
  LoadDisplay d(files_, out_, nullptr);
  const Clock::time_point t0 = Clock::now();
  d.Restart(t0);
  Write(0, kGiB, kGiB, true);
  d.Poll(t0 + std::chrono::milliseconds(300));
  d.Stop(t0 + std::chrono::milliseconds(600), /*ready=*/true);
  EXPECT_EQ(Shown(), "");
}

}  // namespace
}  // namespace ss
