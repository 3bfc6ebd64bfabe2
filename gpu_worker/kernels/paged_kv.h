// The cuda backend's paged KV cache on the device (gpu_worker/cuda/cuda_backend_kv.h has the pool
// and block layout): every KV entry (a raw window entry or a compressed main-KV entry) is one
// fp8_ds_mla record, and every indexer key one MXFP4 entry, inside blocks of a device pool that a
// sequence's block table names.
//
// Record of a head_dim-D entry with `nope` FP8 dims and `rope` = D − nope bf16 dims (common/
// kv_record.h generalised beyond D = 512; for Flash, 448 + 128 + 7 + 1 = 584 bytes, byte for byte
// common/kv_record.h's layout):
//   [nope e4m3 codes | rope bf16 | nope/64 ue8m0 scales | 0 padding up to a multiple of 8]
// with the tile scale Pow2Scale(amax, 1e-4, 448) of the model's FP8 simulation, so an entry whose
// nope dims went through that simulation (kv_fp8_sim_rounds) round-trips bit for bit.
// MXFP4 key of a `hd`-dim indexer key: [hd/2 bytes, element 2i in the low nibble of byte i |
// hd/32 ue8m0 scales], scale Pow2Scale(amax, 6·2^−126, 6) per 32 values: keys that went through
// the indexer's FP4 simulation round-trip bit for bit (their values are e2m1 · 2^k already).
//
// A layout with nope = 0 and rope = head_dim is a plain bf16 entry (2·head_dim bytes): the
// backend's layout for numerics whose nope dims are not on the e4m3 grid (kv_fp8_sim_rounds off:
// the demo's initial revision), where fp8 records would not be lossless.
//
// Contract: README.md. The indexer's scores over the MXFP4 keys in place are indexer.h's
// KvIndexerScores.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gpu_worker/kernels/paged_kv_sizes.h"
#include "gpu_worker/kernels/shared_memory.h"
#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// Bytes of a record / an MXFP4 key.
__host__ __device__ inline constexpr int64_t KvRecordBytes(int64_t nope, int64_t rope) {
  return nope + 2 * rope + (nope / 64 + 7) / 8 * 8;
}
__host__ __device__ inline constexpr int64_t KvKeyBytes(int64_t hd) { return hd / 2 + hd / 32; }

// One layer's placement in the pool (host-computed, passed by value).
struct KvGeom {
  uint64_t pool = 0;        // device address of block 0
  int64_t block_bytes = 0;  // bytes of one block
  int32_t nope = 0, rope = 0, record_bytes = 0;
  int32_t window = 0;             // W
  int32_t win_per_block = 0;      // window records per window block
  int32_t win_base = 0;           // ordinal of this layer's ring slot 0 among the window records
  int32_t first_entry_block = 0;  // table index of the block of tokens [0, block_tokens)
  int32_t ratio = 0;              // compress ratio (0: no compressed entries)
  int32_t entries_per_block = 0;  // block_tokens / ratio
  int32_t main_off = 0;           // byte offset of the layer's records in a token block
  int32_t key_dim = 0;            // indexer key dims (ratio 4 layers with an indexer)
  int32_t keys_per_block = 0;     // block_tokens / 4
  int32_t key_off = 0;            // byte offset of the layer's keys in a token block
  int32_t pad = 0;
};

// One token row of a step for one layer.
struct KvToken {
  uint64_t table = 0;    // const int32_t*: its sequence's block table on the device
  uint64_t staging = 0;  // records of its chunk's raw KV: position chunk_start + k at record k
  int32_t n_table = 0;   // entries of the table
  int32_t pos = 0;       // absolute position
  int32_t chunk_start = 0;
  int32_t chunk_end = 0;
  int32_t win_width = 0;  // window slots of the chunk's lists (start == 0 ? min(S, W) : W)
  int32_t n_comp = 0;     // compressed slots after them
  int32_t sel_off = -1;   // ≥ 0: the indexer's selections for this row start at sel + sel_off
  int32_t pad = 0;
};
static_assert(sizeof(KvToken) == 48);

// cand[t·n_cand + j]: the address of the record of candidate j (0 = masked), in the reference's
// list order (common/model/attention.h): slots [0, win_width) the window positions
// max(0, pos − W + 1) … pos in order (the staged record for positions of the chunk, else ring slot
// p mod W), 0 after them; slots [win_width, win_width + n_comp) the compressed entries: the
// selections (0 where a selection is −1) when sel_off ≥ 0, else entry m for m < (pos + 1)/ratio,
// 0 beyond; slots up to n_cand (the step's longest list) 0. Masked tail slots change no bit of
// the attention. A record outside the token's table is masked (the host checks the tables
// first).
//
// rows (optional): KvSparseAttention's rows scratch for these T tokens. The same launch then also
// decodes every candidate record into it (bf16 [T, n_cand, nope + rope], exact; masked rows left
// as they are), one warp per candidate, which saves KvSparseAttention its decode launch: call it
// with rows_decoded = true, the same cand, T and n_cand. n_cand ≤ 4·65535 with rows.
cudaError_t KvBuildCandidates(const KvGeom& g, const KvToken* tokens, int64_t T, const int32_t* sel,
                              int64_t n_cand, uint64_t* cand, cudaStream_t stream,
                              bf16_t* rows = nullptr);

// Raw KV kv bf16 [T, nope + rope] as records: KvStageRecords into each token's staging record
// (before the attention), KvRingRecords into ring slot pos mod W for the chunk's last W positions
// (after it). nope a multiple of 64 (0 included), at most 1024; rope ≤ 1024.
cudaError_t KvStageRecords(const KvGeom& g, const KvToken* tokens, int64_t T, const bf16_t* kv,
                           cudaStream_t stream);
cudaError_t KvRingRecords(const KvGeom& g, const KvToken* tokens, int64_t T, const bf16_t* kv,
                          cudaStream_t stream);

// entries bf16 [n, nope + rope] into records at dst[i] (0 skips the entry).
cudaError_t KvEncodeRecords(const bf16_t* entries, const uint64_t* dst, int64_t n, int64_t nope,
                            int64_t rope, cudaStream_t stream);

// keys bf16 [n, hd] into MXFP4 keys at dst[i] (0 skips). hd a multiple of 32, at most 1024.
cudaError_t KvEncodeKeys(const bf16_t* keys, const uint64_t* dst, int64_t n, int64_t hd,
                         cudaStream_t stream);

// Keys [0, n) of one sequence (table: device, n_table entries) decoded to bf16 [n, key_dim]
// (exact). Keys outside the table read as 0.
cudaError_t KvGatherKeys(const KvGeom& g, const int32_t* table, int64_t n_table, int64_t n,
                         bf16_t* out, cudaStream_t stream);

// Sparse attention with a sink (spec §3.9, MQA: K = V = one latent entry shared by every head)
// over an explicit candidate list per query, as the reference (model::SparseAttendHead) runs it:
// fp32 scores of bf16 q·k times `scale`, online softmax over 64-entry chunks of the list,
// probabilities rounded to bf16 before P·V (fp32 accumulation), the sink exp(sink[h] − m) only
// in the denominator, masked candidates (0) skipped, bf16 output. Candidate j of token t is the
// record at cand[t, j] (the first of every list valid): nope dims decoded as e4m3 · scale (exact,
// bf16-valued), rope dims the stored bf16, so the result is bit-identical to the same attention
// over plain bf16 records (nope = 0) of the decoded entries (except on the split path below).
// q: bf16 [T, n_heads, head_dim]; sink: fp32 [n_heads]; out: bf16 [T, n_heads, head_dim].
// head_dim 256 and 512 stage each 64-entry chunk of decoded entries in shared memory (needs
// PrepareKernels, prepare.h); other head dims (multiples of 128, ≤ 1024) read each dim from the
// record.
//
// rows (head_dim 256 and 512; else ignored): caller-owned scratch of KvSparseAttentionRowsBytes
// bytes (16-byte aligned). With it, one launch first decodes every candidate record of every token
// once into rows (bf16, exact: the decode is done once per token instead of once per (token,
// head), 64 times at Flash's 64 heads), and the attention runs on the split path below.
//
// Split path (rows given): the rows scratch also holds a split workspace for kKvSplitMaxTokens
// tokens and the attention runs as flash-decoding in two launches per slice of at most that many
// tokens (decode: one slice; a prefill chunk: T / 64; q 16-byte aligned): one block per
// (64-candidate chunk, token, 16 heads) scores its chunk on the tensor cores (bf16 products, fp32
// accumulation), takes the chunk's own max m, p = exp(s − m) and Σp, and sums bf16(p)·v (tensor
// cores again); then one combine per (token, head) merges the chunks with exp(m − M) for the
// head's max M over them, adds the sink, divides and rounds to bf16. The same softmax as the
// serial kernel's, but p is rounded to bf16 relative to the chunk's own max rather than the
// running max, and the sums run in another order: not the same bits. Each output o of a head
// stays within 2^−7·(A + |o|) of the serial kernel's, A = Σ p·|v| / den (each path rounds every p
// to bf16 once, ≤ 2^−8 relative, and its output once; paged_kv_test checks it), and the result is
// deterministic (no atomics; every sum in a fixed order).
//
// rows_decoded: rows already hold the decoded candidates (KvBuildCandidates with rows, the same
// cand, T and n_cand), so the decode launch is skipped.
//
// rope_cos, rope_sin (optional, fp32 [T, rope_dim / 2], row t for token t; rope_dim even, ≤
// head_dim): the output also gets the inverse RoPE of its last rope_dim dims per head, the same
// bits as rope.h's ApplyRope(out, T, n_heads, head_dim, rope_dim, rope_cos, rope_sin, true) after
// the call. The split path does it in its combine (the rotation is elementwise on the bf16
// outputs), so decode (T ≤ kKvSplitMaxTokens, rows given, head_dim 256 or 512) runs in two launches
// after KvBuildCandidates with rows; the serial kernels launch ApplyRope after the attention.
struct KvSparseAttentionParams {
  const bf16_t* q = nullptr;       // [T, n_heads, head_dim]
  const uint64_t* cand = nullptr;  // [T, n_cand] record addresses, 0 = masked
  const float* sink = nullptr;     // [n_heads]
  int64_t T = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t nope = 0;  // the records' FP8 dims (0: plain bf16 records)
  int64_t n_cand = 0;
  float scale = 0.0f;
  bf16_t* out = nullptr;   // [T, n_heads, head_dim]
  bf16_t* rows = nullptr;  // optional scratch (above)
  bool rows_decoded = false;
  const float* rope_cos = nullptr;  // optional: the inverse RoPE (above)
  const float* rope_sin = nullptr;
  int64_t rope_dim = 0;
};
cudaError_t KvSparseAttention(const KvSparseAttentionParams& p, cudaStream_t stream);
// kKvSplitMaxTokens, KvSplitBytes and KvSparseAttentionRowsBytes: paged_kv_sizes.h.

// The opt-ins of KvSparseAttention's shared-memory kernels (head_dim 256 and 512, no rows), for
// PrepareKernels (prepare.h).
std::vector<SharedMemoryOptIn> KvSparseAttentionOptIns();

// Entry points, for attribute queries (ptxVersion) in tests.
const void* KvBuildCandidatesKernel();
const void* KvBuildCandidatesRowsKernel();  // with the rows decode, head_dim 512
const void* KvEncodeRecordsKernel();
const void* KvEncodeKeysKernel();
const void* KvGatherKeysKernel();
const void* KvSparseAttentionKernel();
const void* KvSparseAttentionFastKernel();  // head_dim 512
const void* KvDecodeRowsKernel();
const void* KvSplitChunkKernel();    // head_dim 512, the split path's chunks
const void* KvSplitCombineKernel();  // head_dim 512, the split path's combine

}  // namespace ss::cuda
