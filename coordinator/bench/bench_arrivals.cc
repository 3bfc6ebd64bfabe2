#include "coordinator/bench/bench_arrivals.h"

#include <cmath>
#include <random>

namespace ss::bench {

std::vector<double> ArrivalTimes(int64_t n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  if (std::isinf(rate)) return out;
  // A seed of its own, so that the arrivals do not shift when a dataset draws more numbers.
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double t = 0;
  for (double& a : out) {
    t += gap(rng);
    a = t;
  }
  return out;
}

}  // namespace ss::bench
