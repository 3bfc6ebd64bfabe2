// A read-only streaming kernel for the GPU benchmarks: the time a launch needs to read `bytes`
// (a multiple of 16, 16-byte aligned) and nothing else, the ceiling of a bandwidth-bound kernel
// reading as much.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::bench {

cudaError_t StreamRead(const void* p, int64_t bytes, uint32_t* sink, cudaStream_t stream);

}  // namespace ss::bench
