// The per-block shared-memory budget every kernel keeps to, and the opt-in of a kernel to more
// than 48 KiB of dynamic shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace ss::cuda {

// The most shared memory, static and dynamic, one block may take on SM 8.6 (cudaDevAttrMax-
// SharedMemoryPerBlockOptin of an RTX 3090: 99 KiB). Every kernel here keeps to it, also where the
// device allows more (an H200: 227 KiB), so that what runs on the test machine runs on the target.
inline constexpr int kSm86MaxSharedPerBlock = 101376;

// A kernel's need for more than 48 KiB of dynamic shared memory: what PrepareKernels (prepare.h)
// opts it in to on a device before any launch there. `name` identifies the kernel in errors.
struct SharedMemoryOptIn {
  const char* name;
  const void* kernel;
  int bytes;
};

// Opts `kernel` in to `bytes` of dynamic shared memory on the current device:
// cudaErrorInvalidValue, nothing set, where its static shared memory and `bytes` together pass
// kSm86MaxSharedPerBlock.
inline cudaError_t OptInSharedMemory(const void* kernel, int bytes) {
  cudaFuncAttributes a{};
  const cudaError_t e = cudaFuncGetAttributes(&a, kernel);
  if (e != cudaSuccess) return e;
  if (a.sharedSizeBytes + static_cast<size_t>(bytes) > kSm86MaxSharedPerBlock) {
    return cudaErrorInvalidValue;
  }
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

}  // namespace ss::cuda
