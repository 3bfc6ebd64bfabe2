// A model of one Flash layer's batch-1 decode step, for gpu_kernels_bench --persistent: how near a
// device-to-device copy the step's weight bytes can be read when its dependent phases run
//  * as per-op launches in a CUDA graph (what the cuda backend does),
//  * in one persistent launch with a grid barrier between phases,
//  * in one persistent launch whose blocks also bring their shares of the coming phases' weights
//    into shared memory (cp.async) while the latency-bound phases run: the cross-phase prefetch
//    of a persistent per-layer kernel.
// A phase is `spins` latency-bound steps (one block busy for spin_ns each, standing for HcPre's
// finish, a norm, the top-k, the attention; every step a dependency, so a phase boundary), then
// every block reading its share of `bytes` (a GEMV's weights: their values do not depend on the
// step, only the products do).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::bench {

struct LayerPlan {
  static constexpr int kMaxPhases = 16;
  int n = 0;
  int64_t bytes[kMaxPhases] = {};  // multiples of 16; phase p reads w + Σ_{q<p} bytes[q]
  int spins[kMaxPhases] = {};
};

// The phases as launches: each spin a one-block kernel, each read a grid-strided streaming read
// (StreamRead). Capturable.
cudaError_t LayerAsLaunches(const uint8_t* w, const LayerPlan& plan, int64_t spin_ns,
                            uint32_t* sink, cudaStream_t stream);

// The phases in one cooperative launch of one block per SM; with prefetch_bytes > 0 each block
// keeps a ring of that much shared memory filled with its shares of the coming phases. barrier:
// two zeroed words, left zeroed (launches on one stream may share them). Capturable.
cudaError_t LayerPersistent(const uint8_t* w, const LayerPlan& plan, int64_t spin_ns,
                            int prefetch_bytes, uint32_t* barrier, uint32_t* sink,
                            cudaStream_t stream);

// The most shared memory a block of LayerPersistent may take on the current device.
int LayerPersistentMaxPrefetch();

}  // namespace ss::bench
