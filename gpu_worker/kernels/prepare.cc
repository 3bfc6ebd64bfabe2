#include "gpu_worker/kernels/prepare.h"

#include <cuda_runtime.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_worker/kernels/fp8_gemm.h"
#include "gpu_worker/kernels/head.h"
#include "gpu_worker/kernels/mxfp4_moe.h"
#include "gpu_worker/kernels/mxfp4_moe_decode.h"
#include "gpu_worker/kernels/output_projection.h"
#include "gpu_worker/kernels/paged_kv.h"
#include "gpu_worker/kernels/shared_memory.h"

namespace ss::cuda {

absl::Status PrepareKernels() {
  for (const std::vector<SharedMemoryOptIn>& family :
       {Fp8GemmOptIns(), GroupedOutputProjectionOptIns(), LinearBf16F32OptIns(),
        KvSparseAttentionOptIns(), Mxfp4MoeOptIns(), Mxfp4MoeDecodeOptIns()}) {
    for (const SharedMemoryOptIn& o : family) {
      const cudaError_t e = OptInSharedMemory(o.kernel, o.bytes);
      if (e != cudaSuccess) {
        return absl::InternalError(
            absl::StrCat("PrepareKernels: the opt-in of ", o.name, " to ", o.bytes,
                         " bytes of dynamic shared memory failed: ", cudaGetErrorString(e)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ss::cuda
