// The gateway's log lines: the access log's fields and the periodic engine statistics
// (coordinator/access_log.h, coordinator/stats_log.h).
#include <optional>
#include <string>

#include "coordinator/access_log.h"
#include "coordinator/stats_log.h"
#include "gtest/gtest.h"

namespace ss {
namespace {

TEST(StatsLine, ThroughputOverTheIntervalAndQuietWhenIdle) {
  StatsSample a;
  StatsSample b = a;
  b.prompt_tokens = 1000;
  b.generation_tokens = 50;
  b.running = 2;
  b.waiting = 1;
  b.kv_usage = 0.375;
  b.prefix_queries = 1000;
  b.prefix_hits = 750;
  bool active = false;
  std::optional<std::string> line = StatsLine(a, b, 10.0, active);
  ASSERT_TRUE(line);
  EXPECT_EQ(*line,
            "engine: avg prompt throughput: 100.0 tokens/s, avg generation throughput: 5.0 "
            "tokens/s, running: 2 reqs, waiting: 1 reqs, KV cache usage: 37.5%, prefix cache "
            "hit rate: 75.0%");
  EXPECT_TRUE(active);
  // The first idle interval after activity still prints (the drop to zero), then it is quiet.
  StatsSample c = b;
  c.running = 0;
  c.waiting = 0;
  line = StatsLine(b, c, 10.0, active);
  ASSERT_TRUE(line);
  EXPECT_NE(line->find("avg prompt throughput: 0.0 tokens/s"), std::string::npos) << *line;
  EXPECT_NE(line->find("prefix cache hit rate: 0.0%"), std::string::npos) << *line;
  EXPECT_FALSE(StatsLine(c, c, 10.0, active));
  EXPECT_FALSE(StatsLine(c, c, 10.0, active));
  // Waiting requests alone are activity.
  StatsSample d = c;
  d.waiting = 3;
  EXPECT_TRUE(StatsLine(c, d, 10.0, active));
}

TEST(AccessLine, GenerationFieldsOnlyForGenerationRequests) {
  EXPECT_EQ(AccessLine("127.0.0.1:5", "GET", "/v1/models", 200, "abc", nullptr),
            "access 127.0.0.1:5 \"GET /v1/models\" 200 request=abc");
  EXPECT_EQ(AccessLine("127.0.0.1:5", "GET", "/x", 404, "", nullptr),
            "access 127.0.0.1:5 \"GET /x\" 404 request=-");
  AccessRecord r;
  r.request_id = "abc";
  r.completion_id = "chatcmpl-1";
  r.summary.prompt_tokens = 812;
  r.summary.cached_tokens = 768;
  r.summary.generated_tokens = 64;
  r.summary.ttft_s = 0.4121;
  r.summary.duration_s = 2.0184;
  r.summary.finish = FinishReason::kLength;
  EXPECT_EQ(AccessLine("10.0.0.2:40312", "POST", "/v1/chat/completions", 200, "abc", &r),
            "access 10.0.0.2:40312 \"POST /v1/chat/completions\" 200 request=abc id=chatcmpl-1 "
            "prompt=812 cached=768 output=64 ttft=0.412s duration=2.018s finish=length");
  r.summary.ttft_s.reset();
  r.summary.finish = FinishReason::kCancelled;
  EXPECT_NE(AccessLine("a", "POST", "/v1/completions", 499, "abc", &r)
                .find("ttft=- duration=2.018s finish=cancelled"),
            std::string::npos);
}

TEST(AccessLog, RecordsAreTakenOnceByResponseAndId) {
  AccessLog log;
  int res1 = 0, res2 = 0;
  AccessRecord r;
  r.request_id = "one";
  log.Record(&res1, r);
  EXPECT_FALSE(log.Take(&res2, "one"));
  EXPECT_FALSE(log.Take(&res1, "two"));  // another request at the same address: dropped
  EXPECT_FALSE(log.Take(&res1, "one"));
  log.Record(&res1, r);
  ASSERT_TRUE(log.Take(&res1, "one"));
  EXPECT_FALSE(log.Take(&res1, "one"));
  // Bounded: the oldest records go first.
  for (size_t i = 0; i < AccessLog::kMaxRecords + 1; ++i) log.Record(&res2, r);
  log.Record(&res1, r);
  EXPECT_TRUE(log.Take(&res1, "one"));
}

}  // namespace
}  // namespace ss
