// What the indexer's kernel tests (indexer_test, indexer_topk_test) share.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "gpu_worker/kernels/indexer_topk.h"
#include "gtest/gtest.h"

namespace ss::cuda::testing_util {

// IndexerTopK's scratch (for its split path), allocated and zeroed once per process; every call
// leaves it zeroed, and the tests' calls run on one stream.
inline void* TopKScratch() {
  static void* p = [] {
    void* q = nullptr;
    const size_t bytes = static_cast<size_t>(IndexerTopKScratchBytes());
    if (cudaMalloc(&q, bytes) != cudaSuccess || cudaMemset(q, 0, bytes) != cudaSuccess) {
      ADD_FAILURE() << "top-k scratch";
      return static_cast<void*>(nullptr);
    }
    return q;
  }();
  return p;
}

}  // namespace ss::cuda::testing_util
