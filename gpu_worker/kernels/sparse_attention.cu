#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/sparse_attention.h"
#include "gpu_worker/kernels/sparse_attention_impl.cuh"

namespace ss::cuda {
namespace {

__global__ void SparseAttentionKernelImpl(const uint16_t* __restrict__ q,
                                          const uint16_t* __restrict__ pool,
                                          const int32_t* __restrict__ cand,
                                          const float* __restrict__ sink, int64_t n_heads,
                                          int64_t d, int64_t n_cand, float scale,
                                          uint16_t* __restrict__ out) {
  SparseAttendBlock(q, Bf16Pool{pool, d}, cand, sink, n_heads, d, n_cand, scale, out);
}

}  // namespace

cudaError_t SparseAttention(const uint16_t* q, const uint16_t* pool, const int32_t* cand,
                            const float* sink, int64_t T, int64_t n_heads, int64_t head_dim,
                            int64_t n_cand, float scale, uint16_t* out, cudaStream_t stream) {
  if (T == 0 || n_heads == 0) return cudaSuccess;
  if (head_dim % kSparseThreads != 0 || head_dim > 1024 || n_cand < 1) {
    return cudaErrorInvalidValue;
  }
  SparseAttentionKernelImpl<<<static_cast<unsigned>(T * n_heads), kSparseThreads, 0, stream>>>(
      q, pool, cand, sink, n_heads, head_dim, n_cand, scale, out);
  return cudaGetLastError();
}

const void* SparseAttentionKernel() {
  return reinterpret_cast<const void*>(&SparseAttentionKernelImpl);
}

}  // namespace ss::cuda
