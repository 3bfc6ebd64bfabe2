#include "gpu_worker/resident_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/int_math.h"
#include "gpu_worker/memory_plan.h"
#include "gpu_worker/streamed_prefill.h"

namespace ss::gpu {
namespace {

constexpr int64_t kMxGroup = 32;          // values per ue8m0 scale
constexpr int64_t kPieceAlign = 64;       // common/expert_store_format.h
constexpr int64_t kWorkspaceAlign = 256;  // expert_sources.cc, each part of the arena

int64_t Align(int64_t bytes, int64_t to) { return CeilDiv(bytes, to) * to; }

}  // namespace

int64_t ResidentExpertBytesPerRank(const ModelConfig& model, int tp_size) {
  const int64_t rows = CeilDiv(model.moe_inter_dim, int64_t{std::max(tp_size, 1)});
  const int64_t codes = rows * model.dim / 2, scales = rows * model.dim / kMxGroup;
  return 3 * (Align(codes, kPieceAlign) + Align(scales, kPieceAlign));
}

int64_t ResidentWorkspaceBytes(const ModelConfig& model, int64_t max_rows, int64_t inter_rank) {
  const int64_t rows = std::max<int64_t>(max_rows, 1);
  return StreamedMoeWorkspaceBytes(model, rows, inter_rank) +
         Align(2 * rows * model.n_activated_experts * 4, kWorkspaceAlign);
}

int64_t ResidentKvTokens(const ModelConfig& model, int64_t kv_tokens, int64_t context,
                         int64_t min_kv_tokens) {
  const int64_t k = kv_tokens > 0 ? kv_tokens
                    : context > 0 ? context
                                  : model.max_position_embeddings;
  return std::max(k, min_kv_tokens);
}

ResidentBudget ComputeResidentBudget(const ResidentBudgetInputs& in) {
  ResidentBudget b;
  b.in = in;
  b.left_bytes =
      in.free_bytes - in.reserve_bytes - in.state_bytes - in.kv_bytes - in.workspace_bytes;
  if (b.left_bytes > 0 && in.expert_bytes > 0 && in.max_experts > 0) {
    b.experts = std::min(b.left_bytes / in.expert_bytes, in.max_experts);
  }
  return b;
}

std::string ResidentBudget::Describe() const {
  return absl::StrCat(experts, " experts (", GiB(bytes()), ") = free ", GiB(in.free_bytes),
                      " - reserve ", GiB(in.reserve_bytes), " - compressor states ",
                      GiB(in.state_bytes), " - KV for ", in.kv_tokens, " tokens ", GiB(in.kv_bytes),
                      " - workspace ", MiB(in.workspace_bytes), ", / ", MiB(in.expert_bytes),
                      " per expert (of ", in.max_experts, ")");
}

}  // namespace ss::gpu
