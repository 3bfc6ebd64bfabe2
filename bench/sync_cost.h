// What a dependency between two phases of a decode step costs on the GPU, for
// gpu_kernels_bench --sync: a kernel boundary in a CUDA graph (a chain of launches that do
// nothing but store one word per block), a last-block handoff inside a launch (the pattern of
// gpu_worker/kernels/last_block.cuh), and a software grid barrier in one persistent launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::bench {

// One launch of `blocks` blocks of 128 threads, each block storing one word to out[block].
cudaError_t TouchKernel(int blocks, uint32_t* out, cudaStream_t stream);

// One launch of `blocks` blocks of 128 threads: each block stores a word and counts itself
// (LastBlockFinishes: one acquire-release atomic), and the last one reads the first block's word
// back and stores it. counter must be zero; it is left zero.
cudaError_t HandoffKernel(int blocks, uint32_t* counter, uint32_t* out, cudaStream_t stream);

// HandoffKernel with the count made of fences around a relaxed atomic instead of one
// acquire-release atomic: the alternative form of LastBlockFinishes, for comparison.
cudaError_t HandoffFencesKernel(int blocks, uint32_t* counter, uint32_t* out, cudaStream_t stream);

// One cooperative launch of `blocks` blocks (all resident: at most one per SM) that passes
// `rounds` grid barriers (fence, atomic arrival, spin on the count): the cost of a phase boundary
// in a persistent kernel. counter must be zero; it is left at blocks·rounds.
cudaError_t GridBarrierLoop(int blocks, int rounds, uint32_t* counter, cudaStream_t stream);

}  // namespace ss::bench
