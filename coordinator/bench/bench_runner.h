// The load of a `splitserve bench serve` run: conversations sent at their arrival times through
// at most max_concurrency connections.
//
// Workers (max_concurrency of them, one per conversation when unlimited, never more than
// kMaxWorkers: a thread and a socket each, within the usual 1024-descriptor limit) take
// conversations in order; each waits for its conversation's arrival time, then sends its turns one
// after another on its own connection, so a conversation holds one slot from its first turn to its
// last. A request is thus sent at max(its arrival time, when a slot frees), as in vLLM.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "coordinator/bench/bench_client.h"
#include "coordinator/bench/bench_dataset.h"

namespace ss::bench {

inline constexpr size_t kMaxWorkers = 1000;

struct LoadResult {
  std::vector<RequestOutput> outputs;  // conversation by conversation, turn by turn
  double duration_s = 0;               // from the start to the last request's end
};

// `arrivals_s[i]` is conversation i's arrival (bench_arrivals.h). `max_concurrency` 0 =
// unlimited. `finished` (may be null) counts finished requests as they end, for a progress bar.
LoadResult RunLoad(const std::vector<Conversation>& conversations,
                   const std::vector<double>& arrivals_s, int64_t max_concurrency,
                   const ClientTarget& target, std::atomic<int64_t>* finished);

}  // namespace ss::bench
