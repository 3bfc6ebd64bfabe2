// ss_metrics: the registry wrapper's names, labels and text exposition, and the /metrics exposer.
#include "common/metrics/metrics.h"

#include <atomic>
#include <ctime>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/http_get.h"

namespace ss::metrics {
namespace {

using testing_util::HttpGet;

TEST(Metrics, TextExpositionHasPrefixedNamesAndLabels) {
  Metrics m;
  prometheus::Counter& c = m.Counter("calls_total", "calls served", {{"transport", "shm"}});
  c.Increment(3);
  // Same name and labels: the same metric.
  EXPECT_EQ(&m.Counter("calls_total", "calls served", {{"transport", "shm"}}), &c);
  m.Counter("calls_total", "calls served", {{"transport", "grpc"}}).Increment();
  m.Gauge("info", "build info", {{"isa", "avx2"}, {"slice", "0/1"}}).Set(1);
  prometheus::Histogram& h = m.Histogram("call_seconds", "latency", {{"layer", "3"}});
  h.Observe(0.002);
  h.Observe(0.004);

  const std::string text = m.Serialize();
  EXPECT_NE(text.find("# TYPE splitserve:calls_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("splitserve:calls_total{transport=\"shm\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("splitserve:calls_total{transport=\"grpc\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("splitserve:info{isa=\"avx2\",slice=\"0/1\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE splitserve:call_seconds histogram"), std::string::npos) << text;
  EXPECT_NE(text.find("splitserve:call_seconds_count{layer=\"3\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("splitserve:call_seconds_bucket{layer=\"3\",le=\"0.005\"} 2"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("splitserve:call_seconds_bucket{layer=\"3\",le=\"0.0025\"} 1"),
            std::string::npos)
      << text;
}

TEST(Metrics, ExposerServesMetricsOnLoopback) {
  Metrics m;
  EXPECT_EQ(m.port(), 0);
  ASSERT_TRUE(m.Listen("127.0.0.1:0").ok());
  ASSERT_GT(m.port(), 0);
  EXPECT_FALSE(m.Listen("127.0.0.1:0").ok());  // at most once
  m.Counter("scrape_test_total", "a counter").Increment(5);
  const std::string resp = HttpGet(m.port(), "/metrics");
  EXPECT_NE(resp.find("200 OK"), std::string::npos) << resp;
  EXPECT_NE(resp.find("splitserve:scrape_test_total 5"), std::string::npos) << resp;
  // Metrics registered after the exposer started are served too.
  m.Gauge("late", "registered after Listen").Set(2);
  EXPECT_NE(HttpGet(m.port(), "/metrics").find("splitserve:late 2"), std::string::npos);
}

// Every registry carries the standard process_* series, read from /proc/self when collected; the
// exposer serves them too.
TEST(Metrics, ProcessSeriesComeWithEveryRegistry) {
  Metrics m;
  const std::string text = m.Serialize();
  for (const char* name :
       {"process_cpu_seconds_total", "process_resident_memory_bytes",
        "process_virtual_memory_bytes", "process_start_time_seconds", "process_open_fds"}) {
    EXPECT_NE(text.find(std::string("\n") + name + " "), std::string::npos) << name << text;
  }
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter"), std::string::npos) << text;
  // The values are this process's: started within the last day, some memory resident.
  const auto value = [&](const std::string& name) {
    const size_t at = text.find("\n" + name + " ");
    return std::stod(text.substr(at + name.size() + 2));
  };
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(value("process_start_time_seconds"), now + 2);
  EXPECT_GT(value("process_start_time_seconds"), now - 86400);
  EXPECT_GT(value("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(value("process_open_fds"), 3);
  ASSERT_TRUE(m.Listen("127.0.0.1:0").ok());
  EXPECT_NE(HttpGet(m.port(), "/metrics").find("\nprocess_open_fds "), std::string::npos);
}

TEST(Metrics, BucketsReachPastTenSecondsAndTokenBucketsAreOneTwoFive) {
  EXPECT_GE(LatencyBuckets().back(), 600.0);
  EXPECT_EQ(Buckets125(1024), (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}));
  EXPECT_EQ(Buckets125(0), std::vector<double>{1});
  EXPECT_EQ(Buckets125(5), (std::vector<double>{1, 2, 5}));
}

// OnScrape hooks run before each collection, so a gauge they set is current in that very scrape.
TEST(Metrics, ScrapeHooksRunBeforeEachCollection) {
  Metrics m;
  prometheus::Gauge& g = m.Gauge("refreshed", "set by a scrape hook");
  std::atomic<int> runs{0};
  m.OnScrape([&] { g.Set(++runs); });
  EXPECT_NE(m.Serialize().find("splitserve:refreshed 1\n"), std::string::npos);
  ASSERT_TRUE(m.Listen("127.0.0.1:0").ok());
  EXPECT_NE(HttpGet(m.port(), "/metrics").find("splitserve:refreshed 2\n"), std::string::npos);
  EXPECT_NE(HttpGet(m.port(), "/metrics").find("splitserve:refreshed 3\n"), std::string::npos);
  EXPECT_EQ(runs, 3);
}

TEST(Metrics, ListenRejectsBadAddresses) {
  Metrics m;
  EXPECT_EQ(m.Listen("127.0.0.1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Listen("127.0.0.1:http").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Listen("127.0.0.1:70000").code(), absl::StatusCode::kInvalidArgument);
  // A port already taken is an error, not an exception.
  Metrics first;
  ASSERT_TRUE(first.Listen("127.0.0.1:0").ok());
  EXPECT_FALSE(m.Listen("127.0.0.1:" + std::to_string(first.port())).ok());
  EXPECT_EQ(m.port(), 0);
}

}  // namespace
}  // namespace ss::metrics
