#include "coordinator/bench/bench_runner.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace ss::bench {

LoadResult RunLoad(const std::vector<Conversation>& conversations,
                   const std::vector<double>& arrivals_s, int64_t max_concurrency,
                   const ClientTarget& target, std::atomic<int64_t>* finished) {
  using Clock = std::chrono::steady_clock;
  // Each conversation's outputs go to its own slice, so workers never share a slot.
  std::vector<size_t> first(conversations.size() + 1, 0);
  for (size_t i = 0; i < conversations.size(); ++i) {
    first[i + 1] = first[i] + conversations[i].turns.size();
  }
  LoadResult result;
  result.outputs.resize(first.back());
  const size_t limit = max_concurrency > 0 ? static_cast<size_t>(max_concurrency) : kMaxWorkers;
  const size_t workers = std::min({conversations.size(), limit, kMaxWorkers});
  std::atomic<size_t> next{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      CompletionClient client(target);
      for (size_t i; (i = next.fetch_add(1)) < conversations.size();) {
        std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(arrivals_s[i])));
        const std::vector<Turn>& turns = conversations[i].turns;
        for (size_t k = 0; k < turns.size(); ++k) {
          RequestOutput& out = result.outputs[first[i] + k];
          out = client.Send(turns[k], start);
          out.turn = static_cast<int64_t>(k);
          if (finished) finished->fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const RequestOutput& r : result.outputs) {
    result.duration_s = std::max(result.duration_s, r.start_s + r.latency_s);
  }
  return result;
}

}  // namespace ss::bench
