// CUDA runtime errors as absl::Status, for the GPU worker's host code (the cuda backend, the NCCL
// stage links): "CUDA: <what>: <the runtime's error string>".
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ss::gpu {

// The error `e` (not cudaSuccess) of `what`.
inline absl::Status CudaStatus(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat("CUDA: ", what, ": ", cudaGetErrorString(e)));
}

// OK for cudaSuccess, else CudaStatus.
inline absl::Status CudaCheck(cudaError_t e, const char* what) {
  return e == cudaSuccess ? absl::OkStatus() : CudaStatus(e, what);
}

#define CUDA_RETURN_IF_ERROR(expr)                                       \
  do {                                                                   \
    const cudaError_t ss_cuda_e_ = (expr);                               \
    if (ss_cuda_e_ != cudaSuccess) return CudaStatus(ss_cuda_e_, #expr); \
  } while (0)

}  // namespace ss::gpu
