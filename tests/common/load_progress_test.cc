// LoadProgress (common/load_progress.h): its lines, when it logs, and its progress file.
#include "common/load_progress.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(LoadProgressLine, PercentRateAndTimeLeftOrBytesWhenTheTotalIsUnknown) {
  EXPECT_EQ(LoadProgressLine("loading", 2 * kGiB, 8 * kGiB, 2.0, false),
            "loading: 2.00 of 8.00 GiB (25%), 1.07 GB/s, about 6 s left");
  EXPECT_EQ(LoadProgressLine("loading", 2 * kGiB, 0, 2.0, false), "loading: 2.00 GiB, 1.07 GB/s");
  // A total that was too small shows at most 100 %, without a time left.
  EXPECT_EQ(LoadProgressLine("loading", 9 * kGiB, 8 * kGiB, 9.0, false),
            "loading: 8.00 of 8.00 GiB (100%), 1.07 GB/s");
  EXPECT_EQ(LoadProgressLine("loading", 8 * kGiB, 8 * kGiB, 4.0, true),
            "loading: 8.00 GiB in 4.0 s (2.15 GB/s)");
  EXPECT_EQ(LoadProgressLine("loading", 0, 8 * kGiB, 0.0, false),
            "loading: 0.00 of 8.00 GiB (0%), 0.00 GB/s");
}

TEST(LoadProgress, LogsAtMostEveryIntervalAndOnceAtTheEnd) {
  auto out = std::make_shared<std::ostringstream>();
  auto logger = std::make_shared<spdlog::logger>(
      "progress_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(*out));
  logger->set_pattern("%v");
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  absl::Time now = absl::UnixEpoch();
  {
    LoadProgress p("w", 4 * kGiB, {.now = [&] { return now; }});
    p.Add(kGiB);  // at 0 s: no line
    now += absl::Seconds(3);
    p.Add(kGiB);  // 3 s: still none
    now += absl::Seconds(3);
    p.Add(kGiB);  // 6 s: a line
    now += absl::Seconds(1);
    p.Add(kGiB);  // 7 s: none (2 s after the last)
    EXPECT_EQ(p.done(), 4 * kGiB);
    p.Done();
    p.Done();     // once
    p.Add(kGiB);  // after Done: no line
  }
  spdlog::set_default_logger(previous);
  EXPECT_EQ(out->str(),
            "w: 3.00 of 4.00 GiB (75%), 0.54 GB/s, about 2 s left\n"
            "w: 4.00 GiB in 7.0 s (0.61 GB/s)\n");
}

TEST(LoadProgressFile, ListsEveryLoadBegunWhileSetAndMarksTheFinishedOnes) {
  const std::string path = ::testing::TempDir() + "/load_progress_test.json";
  std::remove(path.c_str());
  const auto read = [&] {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ParseLoadProgress(ss.str());
  };
  LoadProgress before("before", kGiB, {.log_summary = false});  // not listed: no file yet
  SetLoadProgressFile(path);
  absl::Time now = absl::UnixEpoch();
  {
    LoadProgress a("a", 2 * kGiB, {.log_summary = false, .now = [&] { return now; }});
    absl::StatusOr<std::vector<LoadPhase>> p = read();  // listed when it begins
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->size(), 1u);
    EXPECT_EQ((*p)[0].what, "a");
    EXPECT_EQ((*p)[0].total, 2 * kGiB);
    EXPECT_EQ((*p)[0].done, 0);
    now += absl::Milliseconds(100);
    a.Add(kGiB);  // 100 ms after the last write: not written
    EXPECT_EQ((*read())[0].done, 0);
    now += absl::Milliseconds(150);
    a.Add(kGiB / 2);  // 250 ms: written
    p = read();
    EXPECT_EQ((*p)[0].done, kGiB + kGiB / 2);
    EXPECT_DOUBLE_EQ((*p)[0].seconds, 0.25);
    EXPECT_FALSE((*p)[0].finished);
    a.Done();
    LoadProgress b("b", 0, {.log_summary = false, .now = [&] { return now; }});
    p = read();
    ASSERT_EQ(p->size(), 2u);
    EXPECT_TRUE((*p)[0].finished);
    EXPECT_EQ((*p)[0].done, kGiB + kGiB / 2);
    EXPECT_EQ((*p)[1].what, "b");
    EXPECT_FALSE((*p)[1].finished);
  }
  SetLoadProgressFile("");
  before.Done();
  std::remove(path.c_str());
}

TEST(LoadProgressFile, ParseRefusesWhatIsNotAProgressFile) {
  EXPECT_FALSE(ParseLoadProgress("").ok());
  EXPECT_FALSE(ParseLoadProgress("{\"phases\": 3}").ok());
  EXPECT_FALSE(ParseLoadProgress("{\"phases\": [{\"what\": \"a\", \"done\": 1}]}").ok());
  absl::StatusOr<std::vector<LoadPhase>> p = ParseLoadProgress("{\"phases\": []}");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->empty());
}

}  // namespace
}  // namespace ss
