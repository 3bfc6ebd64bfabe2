// The cores' FMA peak, the baseline prefill-sized expert calls are measured against:
// a register-only loop of 12 independent fp32 FMA chains on every worker of a pool (or the
// calling thread alone), AVX2 (8 lanes) or AVX-512 (16 lanes), 2 FLOP per lane and FMA.
#pragma once

#include "common/thread_pool.h"

namespace ss::bench {

// GFLOP/s of all the pool's threads together (the best of `passes`); 0 if the CPU lacks the ISA
// or the pool fails.
double FmaPeakGflops(ss::ThreadPool* pool, bool avx512, int passes);

}  // namespace ss::bench
