// The kernels' per-device set-up: the shared-memory opt-ins of the kernels that take more than
// 48 KiB of dynamic shared memory. No launch sets an attribute, so a launch behaves the same the
// first time as later, under CUDA-graph capture too; but a kernel that needs an opt-in fails to
// launch on a device where PrepareKernels has not run.
#pragma once

#include "absl/status/status.h"

namespace ss::cuda {

// Sets every kernel's attributes on the current device (cudaSetDevice). Call it once per device
// before the first launch there and outside any graph capture; calling it again is harmless.
// Thread-safe for distinct devices. On failure: Internal naming the kernel, the bytes and the CUDA
// error.
absl::Status PrepareKernels();

}  // namespace ss::cuda
