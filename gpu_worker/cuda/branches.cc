#include "gpu_worker/cuda/branches.h"

#include "gpu_worker/cuda_status.h"

namespace ss::gpu::cuda_backend_internal {

StepBranches::~StepBranches() {
  for (int k = 0; k < kBranches; ++k) {
    if (fork_[k]) cudaEventDestroy(fork_[k]);
    if (joined_[k]) cudaEventDestroy(joined_[k]);
    if (branch_[k]) cudaStreamDestroy(branch_[k]);
  }
}

absl::Status StepBranches::Create(int least, int greatest) {
  for (int k = 0; k < kBranches; ++k) {
    const bool critical = k == kBranchIndex || k == kBranchIndexQ || k == kBranchIndexW;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&branch_[k], cudaStreamNonBlocking,
                                                      critical ? greatest : least));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&fork_[k], cudaEventDisableTiming));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&joined_[k], cudaEventDisableTiming));
  }
  return absl::OkStatus();
}

void StepBranches::SynchronizeAll() {
  for (cudaStream_t b : branch_) cudaStreamSynchronize(b);
}

}  // namespace ss::gpu::cuda_backend_internal
