// Prefix caching under pressure (issue 26): `splitserve up` on the bundled tiny model with a KV
// pool of 32 blocks, cycling 10 distinct 260-token prefixes twice, each twice in a row with
// different endings. Every cached prefix keeps 2 token blocks and a snapshot, so the 10 cannot all
// stay: the pool must evict, least recently used first. Every completion must equal the
// reference model's greedy continuation of its own prompt (a hit never serves another prompt's
// KV), every second request of a pair must be served from the cache, a first request of a later
// round finds its prefix evicted, and the coordinator's prefix-cache counters equal the
// cached_tokens the API reported.
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/common/http_get.h"
#include "tests/e2e/up_process.h"
#include "tests/test_util.h"

namespace ss {
namespace {

using json = nlohmann::json;
using testing_util::ChildProcess;

std::vector<int32_t> ReferenceGreedy(const model::Model& m, const std::vector<int32_t>& prompt,
                                     int n) {
  model::SequenceState state = m.NewSequence();
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  int64_t start = 0;
  while (static_cast<int>(out.size()) < n) {
    model::ChunkRef chunk{&state, ids.data() + start, static_cast<int64_t>(ids.size()) - start,
                          start};
    auto logits = m.Forward(std::span<const model::ChunkRef>(&chunk, 1));
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) return out;
    const std::vector<float>& l = (*logits)[0];
    const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    if (next == m.config().eos_token_id) break;
    out.push_back(next);
    start = static_cast<int64_t>(ids.size());
    ids.push_back(next);
  }
  return out;
}

double Metric(int port, const std::string& name) {
  const std::string m = testing_util::HttpGet(port, "/metrics");
  const size_t at = m.find("\nsplitserve:" + name + "{");
  return at == std::string::npos ? -1.0 : std::stod(m.substr(m.find('}', at) + 1));
}

TEST(PrefixCacheSoakE2eTest, EvictsUnderPressureAndNeverServesAnotherPrompt) {
  auto loaded = model::Model::Load(SS_TINY_A_DIR);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const model::Model& ref = **loaded;
  testing_util::TempDir dir("prefix_soak");
  const int port = testing_util::FreeLoopbackPortBlock();
  const std::string log = dir / "up.log";
  ChildProcess up({std::string(SS_BIN_DIR) + "/splitserve", "up", "--port", std::to_string(port),
                   "--log-dir", dir / "logs", "--kv-tokens", "4096"},
                  log);
  ASSERT_TRUE(testing_util::WaitReady(port, up)) << testing_util::ReadLog(log);

  std::mt19937 rng(26);
  auto draw = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& t : v) t = static_cast<int32_t>(16 + rng() % 984);
    return v;
  };
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 10; ++p) prefixes.push_back(draw(260));

  const double queries0 = Metric(port, "prefix_cache_queries_total");
  const double hits0 = Metric(port, "prefix_cache_hits_total");
  int64_t prompt_sum = 0, cached_sum = 0, seconds_hit = 0, firsts_evicted = 0;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  for (int round = 0; round < 2; ++round) {
    for (int p = 0; p < 10; ++p) {
      for (int k = 0; k < 2; ++k) {
        std::vector<int32_t> prompt = prefixes[static_cast<size_t>(p)];
        const std::vector<int32_t> ending = draw(10);
        prompt.insert(prompt.end(), ending.begin(), ending.end());
        const std::vector<int32_t> want = ReferenceGreedy(ref, prompt, 4);
        const json body = {
            {"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}};
        auto r = c.Post("/v1/completions", body.dump(), "application/json");
        ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
        const json j = json::parse(r->body);
        const int64_t cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
        prompt_sum += static_cast<int64_t>(prompt.size());
        cached_sum += cached;
        SCOPED_TRACE(testing::Message()
                     << "round " << round << ", prefix " << p << ", request " << k);
        // The text of the reference ids, through the server's own detokenizer.
        const json detok = {{"model", "tiny"}, {"tokens", want}};
        auto d = c.Post("/detokenize", detok.dump(), "application/json");
        ASSERT_TRUE(d && d->status == 200) << (d ? d->body : "no response");
        const json dj = json::parse(d->body);
        const std::string want_text = dj.contains("prompt") ? dj["prompt"] : dj["text"];
        EXPECT_EQ(j["choices"][0]["text"], want_text);
        if (k == 1) {
          EXPECT_EQ(cached, 256) << "the pair's first request left a snapshot at 256";
          seconds_hit += cached == 256;
        } else if (round > 0) {
          firsts_evicted += cached == 0;
        }
      }
    }
  }
  EXPECT_EQ(seconds_hit, 20);
  EXPECT_GT(firsts_evicted, 0) << "10 prefixes cannot all stay in 32 blocks";
  EXPECT_EQ(Metric(port, "prefix_cache_queries_total") - queries0, static_cast<double>(prompt_sum));
  EXPECT_EQ(Metric(port, "prefix_cache_hits_total") - hits0, static_cast<double>(cached_sum));
  EXPECT_LE(Metric(port, "prefix_cache_blocks"), 32);
  EXPECT_EQ(up.Stop(), 0);
}

}  // namespace
}  // namespace ss
