// The lightning indexer's top-k (spec §3.8): per query row, the k best-scored compressed blocks
// in the reference's order. Contract: README.md.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/limits.h"

namespace ss::cuda {

// descending order, equal scores ordered by the lower index (the reference's stable sort), an
// entry whose score is −inf (a masked block) given as −1: sel int32 [T, k]. Equivalently: the
// first k of the row sorted by (score, −index) descending, which every kernel computes exactly:
//  * counting (short rows, few of them: n_cols ≤ 8192 and T·n_cols² ≤ 2^26, e.g. a decode token
//    at up to 16K context, where the split path does not apply): every column's output slot is
//    its rank, the number of columns ahead of it, counted by 32-column blocks that each hold
//    the row in shared memory (grid (T, n_cols/32), one barrier, no sort);
//  * split (a few long rows, decode: T ≤ 8 and n_cols > 4096): three launches over the whole
//    GPU: blocks of 2048 columns add an 11-bit histogram of the keys' top bits into the row's,
//    then each finds the bin of the k-th largest and appends the entries at or above it (at
//    most 4096) to the row's candidates, then blocks of 64 candidates count the candidates
//    above each: its output slot. Where that bin holds more (scores close together), the
//    second launch appends the entries above the bin and histograms the next 11 bits of the
//    bin's entries, and its last block appends the ones at or above the k-th largest's second
//    bin. More candidates than that (thousands of scores equal in 22 key bits) and one block
//    runs the filtered kernel's code on the row. Needs `scratch`
//    (IndexerTopKScratchBytes, 384 KB, zeroed once when allocated; the launches leave it zeroed
//    for the next call), so calls sharing one scratch must not overlap: issue them on one stream,
//    or order them with events. Without scratch (null) such rows take the filtered kernel;
//  * filtered (otherwise, n_cols > 4096: long rows): one 1024-thread block per row, no
//    workspace: histograms of 11, 11 and 10 key bits (as many as needed) find a key prefix that
//    the k-th largest entry and at most 4096 entries reach; those go to shared memory, where a
//    radix select over (score, −index) finds the k winners, sorted by a bitonic sort. Rows of
//    ≤ 16384 columns are read once (into registers), longer ones once per pass. Fewer than k
//    finite scores, or more than 4096 − k entries equal to the k-th largest, are handled
//    exactly by their own passes;
//  * radix (otherwise): one block per row: an 8-bit radix select of the k-th largest score over
//    the row (≤ 4 passes), a pass collecting the entries above it and the lowest-index entries
//    equal to it, and a bitonic sort of the k winners in shared memory.
// NaN scores are not supported.
cudaError_t IndexerTopK(const float* scores, int64_t T, int64_t n_cols, int64_t k, int32_t* sel,
                        void* scratch, cudaStream_t stream);
int64_t IndexerTopKScratchBytes();

enum class IndexerTopKKind { kCounting, kRadix, kFiltered, kSplit };

// IndexerTopK on the kernel named by `kind` (tests and benchmarks: all give the same bits);
// counting needs n_cols ≤ 8192, split scratch, T ≤ 8 and n_cols ≤ 2048·65535.
cudaError_t IndexerTopKPath(const float* scores, int64_t T, int64_t n_cols, int64_t k,
                            IndexerTopKKind kind, int32_t* sel, void* scratch, cudaStream_t stream);

const void* IndexerTopKKernel();
const void* IndexerTopKCountingKernel();
const void* IndexerTopKFilteredKernel();        // rows of ≤ 16384 columns
const void* IndexerTopKFilteredStreamKernel();  // longer rows
const void* IndexerTopKSplitRankKernel();       // the split path's last launch

}  // namespace ss::cuda
