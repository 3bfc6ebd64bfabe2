// LoadProgress (common/load_progress.h): its lines, and when it logs.
#include "common/load_progress.h"

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
    LoadProgress p("w", 4 * kGiB, absl::Seconds(5), [&] { return now; });
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

}  // namespace
}  // namespace ss
