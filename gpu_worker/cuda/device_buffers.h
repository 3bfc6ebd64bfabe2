// Grow-only buffers of the cuda backend's step: device scratch (DevBuf) and pinned host memory
// (PinnedBuf) for asynchronous copies that a graph or a pipelined step can rely on. Reserve keeps
// the buffer when it is large enough, else frees it and allocates `bytes` (at least 256); the old
// contents are not kept. Not thread-safe; the owner frees the memory at destruction.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "absl/status/status.h"
#include "gpu_worker/cuda_status.h"

namespace ss::gpu::cuda_backend_internal {

struct DevBuf {
  void* p = nullptr;
  size_t cap = 0;
  absl::Status Reserve(size_t bytes) {
    if (bytes <= cap) return absl::OkStatus();
    cudaFree(p);
    p = nullptr;
    cap = 0;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
    cap = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  ~DevBuf() { cudaFree(p); }
};

struct PinnedBuf {
  void* p = nullptr;
  size_t cap = 0;
  absl::Status Reserve(size_t bytes) {
    if (bytes <= cap) return absl::OkStatus();
    cudaFreeHost(p);
    p = nullptr;
    cap = 0;
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, std::max<size_t>(bytes, 256)));
    cap = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  ~PinnedBuf() { cudaFreeHost(p); }
};

}  // namespace ss::gpu::cuda_backend_internal
