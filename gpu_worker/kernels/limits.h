// The CUDA kernels' static limits (shared-memory and register arrays sized at compile time), in
// plain C++ so that code without CUDA can check a model against them (kernel_limits.h). Each
// family's header states which of its arguments a limit bounds.
#pragma once

#include <cstdint>

namespace ss::cuda {

inline constexpr int64_t kHcMaxMult = 8;            // hyper_connection.h: hc
inline constexpr int64_t kRouterMaxExperts = 1024;  // router.h: E
inline constexpr int64_t kRouterMaxTopK = 32;       // router.h: k
inline constexpr int64_t kCompressorMaxDim = 512;   // compressor.h: head_dim
inline constexpr int64_t kHadamardMaxDim = 512;     // indexer.h: n, a power of two in [32, 512]
inline constexpr int64_t kIndexerMaxHeads = 64;     // indexer.h: heads
inline constexpr int64_t kIndexerMaxHeadDim = 128;  // indexer.h: head_dim
inline constexpr int64_t kIndexerMaxTopK = 1024;    // indexer_topk.h: k
// paged_kv.h's KvSparseAttention: head_dim a multiple of kAttentionHeadDimMultiple, at most
// kAttentionMaxHeadDim.
inline constexpr int64_t kAttentionHeadDimMultiple = 128;
inline constexpr int64_t kAttentionMaxHeadDim = 1024;

}  // namespace ss::cuda
