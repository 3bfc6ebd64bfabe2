#include "common/kv_record.h"
#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/kv_record.h"
#include "gpu_worker/kernels/sparse_attention_impl.cuh"

namespace ss::cuda {
namespace {

// ---- encode: one block per entry, warp w < 7 quantises nope tile w, warp 7 copies the rope. ----
constexpr int kEncodeThreads = 32 * (kKvTiles + 1);
static_assert(kKvTile == 64 && kKvRopeDim == 64, "each lane handles 2 dims of a 64-dim tile");

__global__ void EncodeKvRecordsKernelImpl(const uint16_t* __restrict__ entries,
                                          const int32_t* __restrict__ slots,
                                          uint8_t* __restrict__ pool) {
  const int64_t e = blockIdx.x;
  const int32_t slot = slots[e];
  if (slot < 0) return;
  const uint16_t* x = entries + e * kKvDim;
  uint8_t* rec = pool + static_cast<int64_t>(slot) * static_cast<int64_t>(kKvRecordBytes);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp < kKvTiles) {
    const int i0 = warp * kKvTile + lane, i1 = i0 + 32;
    const float v0 = Bf16ToF32(x[i0]), v1 = Bf16ToF32(x[i1]);
    float amax = fmaxf(fabsf(v0), fabsf(v1));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = Pow2Scale(amax, 1e-4f, 448.0f);
    rec[kKvNopeOffset + i0] = F32ToE4m3(fminf(fmaxf(__fdiv_rn(v0, s), -448.0f), 448.0f));
    rec[kKvNopeOffset + i1] = F32ToE4m3(fminf(fmaxf(__fdiv_rn(v1, s), -448.0f), 448.0f));
    if (lane == 0) {
      // s = 2^k exactly; its ue8m0 byte is the fp32 biased exponent (s is never subnormal here:
      // the 1e-4 floor keeps s >= 2^-22).
      rec[kKvScaleOffset + warp] = static_cast<uint8_t>((__float_as_uint(s) >> 23) & 0xff);
    }
  } else {
    uint16_t* rope = reinterpret_cast<uint16_t*>(rec + kKvRopeOffset);
    rope[lane] = x[kKvNopeDim + lane];
    rope[lane + 32] = x[kKvNopeDim + lane + 32];
    if (lane == 0) rec[kKvPadOffset] = 0;
  }
}

// Dim k (0..511) of a record as fp32: e4m3 · s (exact) for the nope dims, the bf16 rope value.
__device__ __forceinline__ float DecodeDim(const uint8_t* __restrict__ rec, int k) {
  if (k < kKvNopeDim) {
    return __fmul_rn(E4m3ToF32(rec[kKvNopeOffset + k]),
                     Ue8m0ToF32(rec[kKvScaleOffset + k / kKvTile]));
  }
  return Bf16ToF32(reinterpret_cast<const uint16_t*>(rec + kKvRopeOffset)[k - kKvNopeDim]);
}

// Pool entries stored as records: dims decoded in registers.
struct RecordPool {
  const uint8_t* __restrict__ p;
  __device__ __forceinline__ float At(int32_t idx, int64_t k) const {
    return DecodeDim(p + static_cast<int64_t>(idx) * static_cast<int64_t>(kKvRecordBytes),
                     static_cast<int>(k));
  }
};

__global__ void SparseAttentionFp8KvKernelImpl(const uint16_t* __restrict__ q,
                                               const uint8_t* __restrict__ pool,
                                               const int32_t* __restrict__ cand,
                                               const float* __restrict__ sink, int64_t n_heads,
                                               int64_t n_cand, float scale,
                                               uint16_t* __restrict__ out) {
  SparseAttendBlock(q, RecordPool{pool}, cand, sink, n_heads, kKvDim, n_cand, scale, out);
}

}  // namespace

cudaError_t EncodeKvRecords(const uint16_t* entries, const int32_t* slots, int64_t n,
                            uint8_t* pool, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n < 0 || n > 0x7fffffff) return cudaErrorInvalidValue;
  EncodeKvRecordsKernelImpl<<<static_cast<unsigned>(n), kEncodeThreads, 0, stream>>>(entries,
                                                                                     slots, pool);
  return cudaGetLastError();
}

cudaError_t SparseAttentionFp8Kv(const uint16_t* q, const uint8_t* pool, const int32_t* cand,
                                 const float* sink, int64_t T, int64_t n_heads, int64_t n_cand,
                                 float scale, uint16_t* out, cudaStream_t stream) {
  if (T == 0 || n_heads == 0) return cudaSuccess;
  if (T < 0 || n_heads < 0 || n_cand < 1 || T * n_heads > 0x7fffffff) return cudaErrorInvalidValue;
  SparseAttentionFp8KvKernelImpl<<<static_cast<unsigned>(T * n_heads), kSparseThreads, 0, stream>>>(
      q, pool, cand, sink, n_heads, n_cand, scale, out);
  return cudaGetLastError();
}

const void* EncodeKvRecordsKernel() {
  return reinterpret_cast<const void*>(&EncodeKvRecordsKernelImpl);
}

const void* SparseAttentionFp8KvKernel() {
  return reinterpret_cast<const void*>(&SparseAttentionFp8KvKernelImpl);
}

}  // namespace ss::cuda
