// CUDA side of the fp8_ds_mla KV record (layout: common/kv_record.h, spec §4.2).
//
//  * EncodeKvRecords: the KV cache write. Quantises bf16 entries [n, 512] into records of a record
//    pool at the given slots, byte for byte what ss::EncodeKvRecord writes on the CPU.
//  * SparseAttentionFp8Kv: SparseAttention (sparse_attention.h) with K = V read from a record pool.
//    Each candidate's nope dims are decoded as e4m3 · scale in fp32 registers (exact and
//    bf16-valued), rope dims as the stored bf16, so the result is bit-identical to SparseAttention
//    over the bf16 pool of the decoded entries (the original entries, when they were
//    FP8-simulated).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::cuda {

// entries: bf16 [n, 512]; slots: int32 [n], the record index of each entry in `pool` (a slot < 0
// skips its entry); pool: n_slots × kKvRecordBytes bytes, 8-byte aligned. Slots must be distinct.
cudaError_t EncodeKvRecords(const uint16_t* entries, const int32_t* slots, int64_t n,
                            uint8_t* pool, cudaStream_t stream);

// q: bf16 [T, n_heads, 512]; pool: records [n_entries × kKvRecordBytes]; cand: int32 [T, n_cand]
// (−1 = masked; the first entry of every list must be valid); sink: fp32 [n_heads];
// out: bf16 [T, n_heads, 512]. head_dim is fixed at 512 (kKvDim).
cudaError_t SparseAttentionFp8Kv(const uint16_t* q, const uint8_t* pool, const int32_t* cand,
                                 const float* sink, int64_t T, int64_t n_heads, int64_t n_cand,
                                 float scale, uint16_t* out, cudaStream_t stream);

const void* EncodeKvRecordsKernel();
const void* SparseAttentionFp8KvKernel();

}  // namespace ss::cuda
