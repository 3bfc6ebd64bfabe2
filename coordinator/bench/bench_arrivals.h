// When each request of a `splitserve bench serve` run is due: vLLM's arrival process. At rate
// inf every request is due at once; otherwise the gaps are gamma-distributed with shape
// `burstiness` and mean 1 / rate (burstiness 1 = a Poisson process; smaller = burstier).
#pragma once

#include <cstdint>
#include <vector>

namespace ss::bench {

// Seconds from the start at which each of `n` requests is due (non-decreasing; the first gap is
// drawn too, as vLLM does). Deterministic in `seed`.
std::vector<double> ArrivalTimes(int64_t n, double rate, double burstiness, uint64_t seed);

}  // namespace ss::bench
