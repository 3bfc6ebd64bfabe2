#include "gpu_worker/kernels/decode_step.h"
#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/hc_post_common.cuh"
#include "gpu_worker/kernels/sparse_attention_impl.cuh"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void BuildCandidatesKernelImpl(const DecodeToken* __restrict__ tokens, int window,
                                          const int32_t* __restrict__ sel, int64_t n_cand,
                                          int32_t* __restrict__ cand) {
  const DecodeToken tk = tokens[blockIdx.x];
  const int first = tk.pos - window + 1 > 0 ? tk.pos - window + 1 : 0;
  const int n_win = tk.pos - first + 1;
  int32_t* out = cand + static_cast<int64_t>(blockIdx.x) * n_cand;
  for (int64_t j = threadIdx.x; j < n_cand; j += blockDim.x) {
    int32_t v = -1;
    if (j < tk.win_width) {
      if (j < n_win) {
        const int p = first + static_cast<int>(j);
        v = p >= tk.chunk_start ? window + (p - tk.chunk_start) : p % window;
      }
    } else if (j < tk.win_width + tk.n_comp) {
      const int m = static_cast<int>(j) - tk.win_width;
      if (tk.sel_off >= 0) {
        const int32_t s = sel[tk.sel_off + m];
        v = s >= 0 ? tk.comp_row + s : -1;
      } else if (tk.ratio > 0 && m < (tk.pos + 1) / tk.ratio) {
        v = tk.comp_row + m;
      }
    }
    out[j] = v;
  }
}

// One block per token row; 16-byte copies.
template <bool kRing>
__global__ void KvWriteKernelImpl(const DecodeToken* __restrict__ tokens,
                                  const uint16_t* __restrict__ kv, int window, int64_t head_dim) {
  const DecodeToken tk = tokens[blockIdx.x];
  int64_t row;
  if (kRing) {
    if (tk.pos < tk.chunk_end - window) return;
    row = tk.pos % window;
  } else {
    row = window + (tk.pos - tk.chunk_start);
  }
  const uint4* src =
      reinterpret_cast<const uint4*>(kv + static_cast<int64_t>(blockIdx.x) * head_dim);
  uint4* dst = reinterpret_cast<uint4*>(reinterpret_cast<uint16_t*>(tk.pool) + row * head_dim);
  for (int64_t i = threadIdx.x; i < head_dim / 8; i += blockDim.x) dst[i] = src[i];
}

__global__ void SparseAttentionRowsKernelImpl(const uint16_t* __restrict__ q,
                                              const DecodeToken* __restrict__ tokens,
                                              const int32_t* __restrict__ cand,
                                              const float* __restrict__ sink, int64_t n_heads,
                                              int64_t d, int64_t n_cand, float scale,
                                              uint16_t* __restrict__ out) {
  const int64_t t = blockIdx.x / n_heads;
  const Bf16Pool pool{reinterpret_cast<const uint16_t*>(tokens[t].pool), d};
  SparseAttendBlock(q, pool, cand, sink, n_heads, d, n_cand, scale, out);
}

// SparseAttendFastBlock's stage: a chunk's pool rows with 16-byte loads.
template <int kD>
struct PoolRowsStage {
  const uint4* pool;
  __device__ __forceinline__ void StageRows(int64_t, int, uint4*) {}
  __device__ __forceinline__ void StageEntries(const int32_t* idxs, int nc, uint4* smem) {
    constexpr int kVec = kD / 8;
    for (int e = static_cast<int>(threadIdx.x); e < nc * kVec; e += kSparseFastThreads) {
      const int i = e / kVec, c = e % kVec;
      const int32_t idx = idxs[i];
      if (idx >= 0) smem[e] = pool[static_cast<int64_t>(idx) * kVec + c];
    }
  }
};

template <int kD>
__global__ void __launch_bounds__(kSparseFastThreads)
    SparseAttentionRowsFastKernelImpl(const uint16_t* __restrict__ q,
                                      const DecodeToken* __restrict__ tokens,
                                      const int32_t* __restrict__ cand,
                                      const float* __restrict__ sink, int64_t n_heads,
                                      int64_t n_cand, float scale, uint16_t* __restrict__ out) {
  PoolRowsStage<kD> stage{reinterpret_cast<const uint4*>(tokens[blockIdx.x / n_heads].pool)};
  SparseAttendFastBlock<kD>(q, cand, sink, n_heads, n_cand, scale, stage, out);
}

// Before any graph capture that contains the fast kernel: call SparseAttentionRows once first.
template <int kD>
cudaError_t FastAttentionOptIn() {
  return OncePerDevice([] {
    return OptInSharedMemory(reinterpret_cast<const void*>(SparseAttentionRowsFastKernelImpl<kD>),
                             kSparseChunk * kD * 2);
  });
}

__global__ void MoeCombineBf16KernelImpl(const uint16_t* __restrict__ shared,
                                         const float* __restrict__ routed, int64_t n,
                                         uint16_t* __restrict__ y) {
  // What MoeCombineHcPost takes as its x, stored.
  GridStride(n, [&](int64_t i) { y[i] = HcXMoeBf16{shared, routed}.Bits(i); });
}

__global__ void Bf16ToF32KernelImpl(const uint16_t* __restrict__ x, int64_t n,
                                    float* __restrict__ y) {
  GridStride(n, [&](int64_t i) { y[i] = Bf16ToF32(x[i]); });
}

bool BadRows(int64_t T) { return T < 0 || T > 0x7fffffff; }

}  // namespace

cudaError_t BuildCandidates(const DecodeToken* tokens, int64_t T, int64_t window,
                            const int32_t* sel, int64_t n_cand, int32_t* cand,
                            cudaStream_t stream) {
  if (BadRows(T) || window < 1 || window > 0x7fffffff || n_cand < 1) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  BuildCandidatesKernelImpl<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
      tokens, static_cast<int>(window), sel, n_cand, cand);
  return cudaGetLastError();
}

cudaError_t KvStage(const DecodeToken* tokens, int64_t T, const uint16_t* kv, int64_t window,
                    int64_t head_dim, cudaStream_t stream) {
  if (BadRows(T) || window < 1 || head_dim % 8 != 0) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  KvWriteKernelImpl<false>
      <<<static_cast<unsigned>(T), 64, 0, stream>>>(tokens, kv, static_cast<int>(window), head_dim);
  return cudaGetLastError();
}

cudaError_t KvRing(const DecodeToken* tokens, int64_t T, const uint16_t* kv, int64_t window,
                   int64_t head_dim, cudaStream_t stream) {
  if (BadRows(T) || window < 1 || head_dim % 8 != 0) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  KvWriteKernelImpl<true>
      <<<static_cast<unsigned>(T), 64, 0, stream>>>(tokens, kv, static_cast<int>(window), head_dim);
  return cudaGetLastError();
}

cudaError_t SparseAttentionRows(const uint16_t* q, const DecodeToken* tokens, const int32_t* cand,
                                const float* sink, int64_t T, int64_t n_heads, int64_t head_dim,
                                int64_t n_cand, float scale, uint16_t* out, cudaStream_t stream) {
  if (T == 0 || n_heads == 0) return cudaSuccess;
  if (head_dim % kSparseThreads != 0 || head_dim > 1024 || n_cand < 1 || T * n_heads > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>(T * n_heads);
  if (head_dim == 512 || head_dim == 256) {
    const int smem = static_cast<int>(kSparseChunk * head_dim * 2);
    if (head_dim == 512) {
      if (cudaError_t e = FastAttentionOptIn<512>(); e != cudaSuccess) return e;
      SparseAttentionRowsFastKernelImpl<512><<<blocks, kSparseFastThreads, smem, stream>>>(
          q, tokens, cand, sink, n_heads, n_cand, scale, out);
    } else {
      if (cudaError_t e = FastAttentionOptIn<256>(); e != cudaSuccess) return e;
      SparseAttentionRowsFastKernelImpl<256><<<blocks, kSparseFastThreads, smem, stream>>>(
          q, tokens, cand, sink, n_heads, n_cand, scale, out);
    }
    return cudaGetLastError();
  }
  SparseAttentionRowsKernelImpl<<<blocks, kSparseThreads, 0, stream>>>(
      q, tokens, cand, sink, n_heads, head_dim, n_cand, scale, out);
  return cudaGetLastError();
}

cudaError_t MoeCombineBf16(const uint16_t* shared, const float* routed, int64_t n, uint16_t* y,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MoeCombineBf16KernelImpl<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(shared, routed,
                                                                                   n, y);
  return cudaGetLastError();
}

cudaError_t Bf16ToF32(const uint16_t* x, int64_t n, float* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Bf16ToF32KernelImpl<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(x, n, y);
  return cudaGetLastError();
}

const void* BuildCandidatesKernel() {
  return reinterpret_cast<const void*>(&BuildCandidatesKernelImpl);
}
const void* KvStageKernel() { return reinterpret_cast<const void*>(&KvWriteKernelImpl<false>); }
const void* KvRingKernel() { return reinterpret_cast<const void*>(&KvWriteKernelImpl<true>); }
const void* SparseAttentionRowsKernel() {
  return reinterpret_cast<const void*>(&SparseAttentionRowsKernelImpl);
}
const void* SparseAttentionRowsFastKernel() {
  return reinterpret_cast<const void*>(&SparseAttentionRowsFastKernelImpl<512>);
}
const void* MoeCombineBf16Kernel() {
  return reinterpret_cast<const void*>(&MoeCombineBf16KernelImpl);
}
const void* Bf16ToF32Kernel() { return reinterpret_cast<const void*>(&Bf16ToF32KernelImpl); }

}  // namespace ss::cuda
