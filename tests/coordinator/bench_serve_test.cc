// `splitserve bench serve`'s pure parts: statistics (numpy's percentiles, TPOT, goodput, peaks),
// datasets (lengths, range ratio, seeds, prefix sharing, turns, JSONL), arrivals (Poisson rate,
// seeds), options (vLLM's names, refusals), per-turn statistics and cached tokens, and the result
// JSON's keys.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numeric>
#include <set>

#include "coordinator/bench/bench_arrivals.h"
#include "coordinator/bench/bench_dataset.h"
#include "coordinator/bench/bench_metrics.h"
#include "coordinator/bench/bench_options.h"
#include "coordinator/bench/bench_report.h"
#include "tests/test_util.h"

namespace ss::bench {
namespace {

absl::StatusOr<BenchOptions> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "serve");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseBenchOptions(static_cast<int>(argv.size()), argv.data(), nullptr);
}

RequestOutput Ok(double ttft, double latency, int64_t out, std::vector<double> itl = {},
                 double start = 0, int64_t in = 10, int64_t turn = 0, int64_t cached = 0) {
  RequestOutput r;
  r.turn = turn;
  r.cached_tokens = cached;
  r.success = true;
  r.ttft_s = ttft;
  r.latency_s = latency;
  r.output_tokens = out;
  r.itl_s = std::move(itl);
  r.start_s = start;
  r.prompt_len = in;
  return r;
}

// Values from numpy 1.26: np.percentile([1, 2, 3, 4, 10], [50, 90, 99]) = [3, 7.6, 9.76],
// np.std(...) = sqrt(10), np.percentile([5], 99) = 5, np.percentile([1, 2], 25) = 1.25.
TEST(BenchStatsTest, PercentilesAreNumpys) {
  EXPECT_DOUBLE_EQ(Percentile({10, 1, 4, 3, 2}, 50), 3);
  EXPECT_NEAR(Percentile({10, 1, 4, 3, 2}, 90), 7.6, 1e-12);
  EXPECT_NEAR(Percentile({10, 1, 4, 3, 2}, 99), 9.76, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile({5}, 99), 5);
  EXPECT_DOUBLE_EQ(Percentile({1, 2}, 25), 1.25);
  EXPECT_DOUBLE_EQ(Percentile({}, 99), 0);
  const LatencyStats s = Summarize({0.001, 0.002, 0.003, 0.004, 0.010}, {90, 99});
  EXPECT_NEAR(s.mean_ms, 4, 1e-9);
  EXPECT_NEAR(s.median_ms, 3, 1e-9);
  EXPECT_NEAR(s.std_ms, std::sqrt(10.0), 1e-9);
  ASSERT_EQ(s.percentiles_ms.size(), 2u);
  EXPECT_NEAR(s.percentiles_ms[0].second, 7.6, 1e-9);
  EXPECT_NEAR(s.percentiles_ms[1].second, 9.76, 1e-9);
}

TEST(BenchStatsTest, TpotLeavesOutSingleTokenRequests) {
  EXPECT_FALSE(Tpot(Ok(0.1, 0.1, 1)).has_value());
  EXPECT_NEAR(*Tpot(Ok(0.1, 0.5, 5)), 0.1, 1e-12);  // (0.5 - 0.1) / 4
  const BenchMetrics m = ComputeMetrics({Ok(0.1, 0.5, 5), Ok(0.2, 0.2, 1)}, 1.0, {99}, {});
  EXPECT_NEAR(m.latency.at("tpot").mean_ms, 100, 1e-9);  // only the 5-token request
  EXPECT_NEAR(m.latency.at("ttft").mean_ms, 150, 1e-9);  // both
}

TEST(BenchStatsTest, TotalsThroughputsAndFailures) {
  RequestOutput failed;
  failed.error = "HTTP 500: boom";
  failed.prompt_len = 99;
  const BenchMetrics m = ComputeMetrics(
      {Ok(0.1, 1.0, 10, {}, 0, 30), failed, Ok(0.1, 1.0, 6, {}, 0, 20)}, 2.0, {99}, {});
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 50);  // failed requests are not counted
  EXPECT_EQ(m.total_output, 16);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 8.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 33.0);
  EXPECT_FALSE(m.request_goodput.has_value());
}

TEST(BenchStatsTest, GoodputCountsRequestsMeetingEverySlo) {
  const std::vector<RequestOutput> outs = {
      Ok(0.05, 0.45, 5),  // ttft 50 ms, tpot 100 ms: good
      Ok(0.20, 0.60, 5),  // ttft 200 ms: misses ttft
      Ok(0.05, 0.85, 5),  // tpot 200 ms: misses tpot
      Ok(0.05, 0.05, 1),  // one token: tpot counts as 0, good
  };
  const BenchMetrics m = ComputeMetrics(outs, 2.0, {99}, {{"ttft", 100}, {"tpot", 150}});
  ASSERT_TRUE(m.request_goodput.has_value());
  EXPECT_DOUBLE_EQ(*m.request_goodput, 1.0);  // 2 good in 2 s
  const BenchMetrics e = ComputeMetrics(outs, 2.0, {99}, {{"e2el", 500}});
  EXPECT_DOUBLE_EQ(*e.request_goodput, 1.0);  // 0.45 and 0.05
}

TEST(BenchStatsTest, ItlPoolsEveryGapAndPeaksCountPerSecond) {
  // Two requests from t = 0: 4 chunks of 1 token each in [0.1, 0.4], and from t = 1.5, 2 chunks.
  const BenchMetrics m = ComputeMetrics(
      {Ok(0.1, 0.4, 4, {0.1, 0.1, 0.1}, 0.0), Ok(0.1, 0.3, 2, {0.2}, 1.5)}, 2.0, {50}, {});
  EXPECT_EQ(m.latency.at("itl").percentiles_ms[0].second, 100);  // median of 100,100,100,200
  EXPECT_NEAR(m.latency.at("itl").mean_ms, 125, 1e-9);
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 4);  // all of the first request in second 0
  EXPECT_DOUBLE_EQ(m.max_concurrent_requests, 1);  // [0, 0.4) and [1.5, 1.8): never together
  // Back to back ([0, 1) then [1, 2)) is one at a time; [0.5, 1.5) overlaps both.
  EXPECT_DOUBLE_EQ(
      ComputeMetrics({Ok(0.1, 1.0, 2, {}, 0.0), Ok(0.1, 1.0, 2, {}, 1.0)}, 2.0, {50}, {})
          .max_concurrent_requests,
      1);
  EXPECT_DOUBLE_EQ(
      ComputeMetrics({Ok(0.1, 1.0, 2, {}, 0.0), Ok(0.1, 1.0, 2, {}, 1.0), Ok(0.1, 1.0, 2, {}, 0.5)},
                     2.0, {50}, {})
          .max_concurrent_requests,
      2);
}

// Two conversations of three turns (outputs in the runner's order: conversation by conversation),
// one failed request in turn 3. TTFTs in s: turn 1 {0.4, 0.6}, turn 2 {0.1, 0.3}, turn 3 {0.2}.
std::vector<RequestOutput> TwoConversations() {
  RequestOutput failed;
  failed.error = "HTTP 500: boom";
  failed.turn = 2;
  failed.prompt_len = 500;
  return {Ok(0.4, 1.0, 4, {}, 0.0, 100, 0, 0),   Ok(0.1, 1.0, 4, {}, 1.0, 200, 1, 96),
          Ok(0.2, 1.0, 4, {}, 2.0, 300, 2, 192), Ok(0.6, 1.0, 4, {}, 0.0, 100, 0, 32),
          Ok(0.3, 1.0, 4, {}, 1.0, 220, 1, 64),  failed};
}

TEST(BenchStatsTest, CachedTokensAndPerTurnStatistics) {
  const BenchMetrics m = ComputeMetrics(TwoConversations(), 3.0, {50, 99}, {});
  EXPECT_EQ(m.completed, 5);
  EXPECT_EQ(m.total_cached_tokens, 0 + 96 + 192 + 32 + 64);  // not the failed request's
  ASSERT_EQ(m.turns.size(), 3u);
  EXPECT_EQ(m.turns[0].completed, 2);
  EXPECT_NEAR(m.turns[0].ttft.mean_ms, 500, 1e-9);
  EXPECT_NEAR(m.turns[0].ttft.median_ms, 500, 1e-9);
  EXPECT_NEAR(m.turns[0].ttft.std_ms, 100, 1e-9);
  ASSERT_EQ(m.turns[0].ttft.percentiles_ms.size(), 2u);
  EXPECT_NEAR(m.turns[0].ttft.percentiles_ms[1].second, 598, 1e-9);  // 400 + 0.99 * 200
  EXPECT_DOUBLE_EQ(m.turns[0].mean_prompt_tokens, 100);
  EXPECT_DOUBLE_EQ(m.turns[0].mean_cached_tokens, 16);
  EXPECT_EQ(m.turns[1].completed, 2);
  EXPECT_NEAR(m.turns[1].ttft.mean_ms, 200, 1e-9);
  EXPECT_DOUBLE_EQ(m.turns[1].mean_prompt_tokens, 210);
  EXPECT_DOUBLE_EQ(m.turns[1].mean_cached_tokens, 80);
  EXPECT_EQ(m.turns[2].completed, 1);  // the failed one is left out
  EXPECT_NEAR(m.turns[2].ttft.mean_ms, 200, 1e-9);
  EXPECT_DOUBLE_EQ(m.turns[2].mean_prompt_tokens, 300);
  EXPECT_DOUBLE_EQ(m.turns[2].mean_cached_tokens, 192);
  // The aggregate is unchanged by the split: every successful TTFT together.
  EXPECT_NEAR(m.latency.at("ttft").mean_ms, 320, 1e-9);
  // A turn whose every request failed still shows, with zeros.
  std::vector<RequestOutput> outs = TwoConversations();
  outs[2].success = false;
  const BenchMetrics f = ComputeMetrics(outs, 3.0, {99}, {});
  ASSERT_EQ(f.turns.size(), 3u);
  EXPECT_EQ(f.turns[2].completed, 0);
  EXPECT_EQ(f.turns[2].ttft.mean_ms, 0);
  EXPECT_EQ(f.turns[2].mean_cached_tokens, 0);
  // One turn per conversation: no per-turn statistics.
  EXPECT_TRUE(ComputeMetrics({Ok(0.1, 1.0, 4), Ok(0.2, 1.0, 4)}, 1.0, {99}, {}).turns.empty());
}

BenchOptions Random(int64_t n, int64_t in, int64_t out, double r, uint64_t seed = 0) {
  BenchOptions o;
  o.num_prompts = n;
  o.random_input_len = in;
  o.random_output_len = out;
  o.random_range_ratio = r;
  o.seed = seed;
  return o;
}

TEST(BenchDatasetTest, RandomLengthsAndRangeRatio) {
  const TokenPool pool = TokenPool::Default();
  for (const Conversation& c : RandomDataset(Random(20, 32, 8, 0), pool)) {
    ASSERT_EQ(c.turns.size(), 1u);
    EXPECT_EQ(c.turns[0].PromptLen(), 32);
    EXPECT_EQ(c.turns[0].output_len, 8);
    for (int32_t id : c.turns[0].prompt_ids) EXPECT_TRUE(id >= 16 && id <= 999) << id;
  }
  std::set<int64_t> in_lens;
  for (const Conversation& c : RandomDataset(Random(500, 100, 10, 0.5), pool)) {
    const int64_t n = c.turns[0].PromptLen();
    EXPECT_TRUE(n >= 50 && n <= 150) << n;
    EXPECT_TRUE(c.turns[0].output_len >= 5 && c.turns[0].output_len <= 15);
    in_lens.insert(n);
  }
  EXPECT_TRUE(in_lens.count(50) && in_lens.count(150)) << "both ends are reachable";
  EXPECT_GT(in_lens.size(), 80u);
}

TEST(BenchDatasetTest, SeedDecidesEverything) {
  const TokenPool pool = TokenPool::Default();
  auto ids = [&](uint64_t seed) {
    std::vector<int32_t> all;
    for (const Conversation& c : RandomDataset(Random(5, 16, 4, 0.3, seed), pool)) {
      all.insert(all.end(), c.turns[0].prompt_ids.begin(), c.turns[0].prompt_ids.end());
    }
    return all;
  };
  EXPECT_EQ(ids(7), ids(7));
  EXPECT_NE(ids(7), ids(8));
}

TEST(BenchDatasetTest, RandomPrefixIsShared) {
  BenchOptions o = Random(4, 8, 2, 0);
  o.random_prefix_len = 5;
  const std::vector<Conversation> d = RandomDataset(o, TokenPool::Default());
  for (const Conversation& c : d) {
    ASSERT_EQ(c.turns[0].PromptLen(), 13);
    EXPECT_TRUE(std::equal(c.turns[0].prompt_ids.begin(), c.turns[0].prompt_ids.begin() + 5,
                           d[0].turns[0].prompt_ids.begin()));
  }
  EXPECT_NE(d[0].turns[0].prompt_ids, d[1].turns[0].prompt_ids);
}

TEST(BenchDatasetTest, PrefixRepeatSharesPrefixesAndExtendsTurns) {
  BenchOptions o;
  o.dataset_name = "prefix-repeat";
  o.num_prompts = 12;
  o.prefix_len = 20;
  o.suffix_len = 6;
  o.num_prefixes = 3;
  o.prefix_output_len = 4;
  o.turns = 3;
  const std::vector<Conversation> d = PrefixRepeatDataset(o, TokenPool::Default());
  ASSERT_EQ(d.size(), 12u);
  std::map<std::vector<int32_t>, int> prefixes;
  for (const Conversation& c : d) {
    ASSERT_EQ(c.turns.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      // prefix + suffix, then + reply + suffix per turn
      EXPECT_EQ(c.turns[k].PromptLen(), static_cast<int64_t>(20 + 6 + k * (4 + 6)));
      EXPECT_EQ(c.turns[k].output_len, 4);
      if (k > 0) {  // each turn's prompt starts with the previous turn's
        EXPECT_TRUE(std::equal(c.turns[k - 1].prompt_ids.begin(), c.turns[k - 1].prompt_ids.end(),
                               c.turns[k].prompt_ids.begin()));
      }
    }
    ++prefixes[std::vector<int32_t>(c.turns[0].prompt_ids.begin(),
                                    c.turns[0].prompt_ids.begin() + 20)];
  }
  ASSERT_EQ(prefixes.size(), 3u);
  for (const auto& [p, n] : prefixes) EXPECT_EQ(n, 4);
  EXPECT_EQ(PrefixRepeatDataset(o, TokenPool::Default())[5].turns[2].prompt_ids,
            d[5].turns[2].prompt_ids);
}

TEST(BenchDatasetTest, CustomJsonl) {
  testing_util::TempDir dir("bench_custom");
  {
    std::ofstream f(dir / "p.jsonl");
    f << "{\"prompt\": \"Hello there\"}\n\n{\"prompt\": [5, 6, 7], \"output_tokens\": 3}\n";
  }
  BenchOptions o;
  o.dataset_name = "custom";
  o.dataset_path = dir / "p.jsonl";
  o.num_prompts = 3;
  o.custom_output_len = 9;
  auto d = CustomDataset(o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 3u);
  EXPECT_EQ((*d)[0].turns[0].prompt_text, "Hello there");
  EXPECT_EQ((*d)[0].turns[0].output_len, 9);
  EXPECT_EQ((*d)[1].turns[0].prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ((*d)[1].turns[0].output_len, 3);
  EXPECT_EQ((*d)[2].turns[0].prompt_text, "Hello there");  // taken again from the top
  {
    std::ofstream f(dir / "bad.jsonl");
    f << "{\"text\": \"no prompt\"}\n";
  }
  o.dataset_path = dir / "bad.jsonl";
  EXPECT_NE(CustomDataset(o).status().message().find("bad.jsonl:1"), std::string::npos);
}

TEST(BenchDatasetTest, TokenizerPoolLeavesOutSpecialIds) {
  auto pool = TokenPool::FromTokenizer(SS_TINY_TOKENIZER);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->ids().size(), 1009u);  // 1012 vocab ids less <bos>, <eos>, <pad>
  EXPECT_EQ(pool->ids().front(), 3);
  EXPECT_EQ(pool->ids().back(), 1011);
  EXPECT_FALSE(TokenPool::FromTokenizer("/nonexistent/dir").ok());
}

TEST(BenchArrivalsTest, PoissonRateAndSeed) {
  const std::vector<double> a = ArrivalTimes(20000, 50.0, 1.0, 3);
  EXPECT_NEAR(a.back() / 20000, 1.0 / 50, 0.03 / 50);  // mean gap within 3 %
  for (size_t i = 1; i < a.size(); ++i) ASSERT_GE(a[i], a[i - 1]);
  // Exponential gaps: the standard deviation equals the mean.
  double sq = 0;
  for (size_t i = 1; i < a.size(); ++i) sq += std::pow(a[i] - a[i - 1] - 0.02, 2);
  EXPECT_NEAR(std::sqrt(sq / 19999), 0.02, 0.002);
  EXPECT_EQ(ArrivalTimes(100, 5.0, 1.0, 3), ArrivalTimes(100, 5.0, 1.0, 3));
  EXPECT_NE(ArrivalTimes(100, 5.0, 1.0, 3), ArrivalTimes(100, 5.0, 1.0, 4));
  EXPECT_EQ(ArrivalTimes(4, INFINITY, 1.0, 3), std::vector<double>(4, 0.0));
  // Burstiness 0.25: same mean, standard deviation 2x the mean (1 / sqrt(shape)).
  const std::vector<double> b = ArrivalTimes(20000, 50.0, 0.25, 3);
  EXPECT_NEAR(b.back() / 20000, 1.0 / 50, 0.06 / 50);
}

TEST(BenchOptionsTest, VllmNamesAndDefaults) {
  auto o = Parse({"--base-url", "http://127.0.0.1:9/", "--dataset-name=prefix_repetition",
                  "--num_prompts", "3", "--goodput", "ttft:500", "tpot:50", "--metadata", "a=1",
                  "b=x=y", "--max-concurrency", "4", "--request-rate", "2.5"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->BaseUrl(), "http://127.0.0.1:9");
  EXPECT_EQ(o->dataset_name, "prefix-repeat");
  EXPECT_EQ(o->num_prompts, 3);
  EXPECT_EQ(o->goodput_ms.at("ttft"), 500);
  EXPECT_EQ(o->goodput_ms.at("tpot"), 50);
  ASSERT_EQ(o->metadata.size(), 2u);
  EXPECT_EQ(o->metadata[1].second, "x=y");
  EXPECT_EQ(o->max_concurrency, 4);
  EXPECT_EQ(o->request_rate, 2.5);
  auto d = Parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->BaseUrl(), "http://127.0.0.1:8000");
  EXPECT_EQ(d->metric_percentiles, (std::vector<double>{90, 99}));
  EXPECT_TRUE(std::isinf(d->request_rate));
  EXPECT_EQ(d->num_prompts, 1000);
}

TEST(BenchOptionsTest, BadFlagsAreRefusedByName) {
  auto msg = [](std::vector<std::string> args) {
    return std::string(Parse(std::move(args)).status().message());
  };
  EXPECT_NE(msg({"--nope"}).find("unknown flag '--nope'"), std::string::npos);
  EXPECT_NE(msg({"--backend", "tgi"}).find("--backend"), std::string::npos);
  EXPECT_NE(msg({"--num-prompts", "x"}).find("--num-prompts"), std::string::npos);
  EXPECT_NE(msg({"--num-prompts"}).find("expects a value"), std::string::npos);
  EXPECT_NE(msg({"--random-range-ratio", "1.5"}).find("[0, 1)"), std::string::npos);
  EXPECT_NE(msg({"--goodput", "ttft=5"}).find("KEY:MS"), std::string::npos);
  EXPECT_NE(msg({"--dataset-name", "sharegpt"}).find("sharegpt"), std::string::npos);
  EXPECT_NE(msg({"--dataset-name", "custom"}).find("--dataset-path"), std::string::npos);
  EXPECT_NE(msg({"--percentile-metrics", "ttft,foo"}).find("foo"), std::string::npos);
}

TEST(BenchReportTest, ResultJsonHasVllmKeys) {
  BenchOptions o;
  o.metric_percentiles = {90, 99, 99.9};
  o.metadata = {{"machine", "ci"}};
  RunInfo info;
  info.model_id = "org/tiny";
  info.date = "20260101-000000";
  info.num_requests = 1;
  const std::vector<RequestOutput> outs = {Ok(0.1, 0.5, 5, {0.1, 0.1, 0.1, 0.1})};
  const BenchMetrics m = ComputeMetrics(outs, 1.0, o.metric_percentiles, {});
  const nlohmann::ordered_json j = ResultJson(o, info, m, outs);
  for (const char* k : {"duration",
                        "completed",
                        "failed",
                        "total_input_tokens",
                        "total_output_tokens",
                        "request_throughput",
                        "request_goodput",
                        "output_throughput",
                        "total_token_throughput",
                        "max_output_tokens_per_s",
                        "max_concurrent_requests",
                        "input_lens",
                        "output_lens",
                        "ttfts",
                        "itls",
                        "errors",
                        "mean_ttft_ms",
                        "median_ttft_ms",
                        "std_ttft_ms",
                        "p90_ttft_ms",
                        "p99_ttft_ms",
                        "p99.9_ttft_ms",
                        "mean_tpot_ms",
                        "p99_tpot_ms",
                        "mean_itl_ms",
                        "p99_itl_ms",
                        "mean_e2el_ms",
                        "p90_e2el_ms",
                        "machine"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), 100, 1e-9);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(ResultPath(o, info), "vllm-infqps-tiny-20260101-000000.json");
  o.max_concurrency = 4;
  o.result_dir = "/tmp/r";
  EXPECT_EQ(ResultPath(o, info), "/tmp/r/vllm-infqps-concurrency4-tiny-20260101-000000.json");
  o.request_rate = 20;
  EXPECT_EQ(ResultPath(o, info), "/tmp/r/vllm-20.0qps-concurrency4-tiny-20260101-000000.json");
  const std::string table = FormatTable(o, m);
  EXPECT_NE(table.find("============ Serving Benchmark Result ============"), std::string::npos);
  EXPECT_NE(table.find("P99.9 TTFT (ms):"), std::string::npos);
  EXPECT_NE(table.find("Output token throughput (tok/s):"), std::string::npos);
  EXPECT_NE(table.find("Total cached input tokens:"), std::string::npos);
  // Single-turn runs: the splitserve total is there, the per-turn parts are not.
  EXPECT_EQ(j["total_cached_tokens"], 0);
  EXPECT_FALSE(j.contains("turns"));
  EXPECT_EQ(table.find("by turn"), std::string::npos);
}

TEST(BenchReportTest, TurnsAppearOnlyWithMoreThanOneTurn) {
  BenchOptions o;
  o.metric_percentiles = {90, 99.9};
  RunInfo info;
  const std::vector<RequestOutput> outs = TwoConversations();
  const BenchMetrics m = ComputeMetrics(outs, 3.0, o.metric_percentiles, {});
  const nlohmann::ordered_json j = ResultJson(o, info, m, outs);
  EXPECT_EQ(j["total_cached_tokens"], 384);
  EXPECT_TRUE(j.contains("mean_ttft_ms"));  // vLLM's keys stay
  EXPECT_TRUE(j.contains("p99.9_ttft_ms"));
  ASSERT_TRUE(j.contains("turns"));
  ASSERT_EQ(j["turns"].size(), 3u);
  const nlohmann::ordered_json& t1 = j["turns"][0];
  for (const char* k :
       {"turn", "completed", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms",
        "p99.9_ttft_ms", "mean_prompt_tokens", "mean_cached_tokens"}) {
    EXPECT_TRUE(t1.contains(k)) << k;
  }
  EXPECT_FALSE(t1.contains("p99_ttft_ms"));  // only the requested percentiles
  EXPECT_EQ(t1["turn"], 1);
  EXPECT_EQ(j["turns"][2]["turn"], 3);
  EXPECT_EQ(j["turns"][1]["completed"], 2);
  EXPECT_NEAR(j["turns"][1]["mean_ttft_ms"].get<double>(), 200, 1e-9);
  EXPECT_DOUBLE_EQ(j["turns"][1]["mean_cached_tokens"].get<double>(), 80);
  EXPECT_DOUBLE_EQ(j["turns"][2]["mean_prompt_tokens"].get<double>(), 300);
  const std::string table = FormatTable(o, m);
  EXPECT_NE(table.find("Time to First Token by turn"), std::string::npos);
  for (const char* row :
       {"Mean TTFT turn 1 (ms):", "Median TTFT turn 1 (ms):", "P99.9 TTFT turn 3 (ms):",
        "Mean cached tokens turn 2:", "Mean input tokens turn 3:", "Successful requests turn 3:"}) {
    EXPECT_NE(table.find(row), std::string::npos) << row;
  }
  EXPECT_EQ(table.find("turn 4"), std::string::npos);
  // The row's value: turn 2's mean TTFT is 200 ms.
  const size_t at = table.find("Mean TTFT turn 2 (ms):");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(table.substr(at + 41, 6), "200.00");
}

}  // namespace
}  // namespace ss::bench
