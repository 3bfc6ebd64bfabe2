#include "coordinator/kv_accounting.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ss::sched {

absl::StatusOr<KvAccounting> KvAccounting::Create(const KvCostModel& cost, int64_t total_blocks) {
  if (cost.block_tokens <= 0 || cost.fixed_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV accounting: invalid cost model ", cost.DebugString()));
  }
  if (total_blocks <= 0 || total_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV accounting: total_blocks = ", total_blocks, " must be in [1, 2^31 - 1]"));
  }
  return KvAccounting(cost, total_blocks);
}

KvAccounting::KvAccounting(const KvCostModel& cost, int64_t total_blocks)
    : cost_(cost), total_blocks_(total_blocks) {
  free_.resize(static_cast<size_t>(total_blocks));
  // Block 0 on top, so a fresh pool hands out 0, 1, 2, ...
  for (int64_t i = 0; i < total_blocks; ++i) {
    free_[static_cast<size_t>(i)] = static_cast<int32_t>(total_blocks - 1 - i);
  }
}

int64_t KvAccounting::BlocksHeld(KvSequenceId seq) const {
  auto it = tables_.find(seq);
  return it == tables_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

KvGrow KvAccounting::Grow(KvSequenceId seq, int64_t tokens) {
  const int64_t need = cost_.BlocksForTokens(tokens) - BlocksHeld(seq);
  if (need <= 0) return KvGrow::kOk;
  if (need > free_blocks()) return KvGrow::kOutOfBlocks;
  std::vector<int32_t>& table = tables_[seq];
  for (int64_t i = 0; i < need; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return KvGrow::kOk;
}

void KvAccounting::Release(KvSequenceId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  // Reverse order, so a sequence that is re-created right away gets the same blocks back.
  free_.insert(free_.end(), it->second.rbegin(), it->second.rend());
  tables_.erase(it);
}

std::span<const int32_t> KvAccounting::BlockTable(KvSequenceId seq) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return {};
  return it->second;
}

}  // namespace ss::sched
