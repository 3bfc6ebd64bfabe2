#include "gpu_worker/expert_heat.h"

#include <algorithm>
#include <utility>

namespace ss::gpu {

ExpertHeat::ExpertHeat(int first_layer, int end_layer, int n_experts)
    : first_layer_(first_layer),
      end_layer_(std::max(first_layer, end_layer)),
      n_experts_(std::max(0, n_experts)),
      counts_(new std::atomic<uint64_t>[static_cast<size_t>(end_layer_ - first_layer_) *
                                        static_cast<size_t>(n_experts_)]()),
      paths_(new std::atomic<uint64_t>[static_cast<size_t>(end_layer_ - first_layer_) * 2]()) {}

void ExpertHeat::Count(int64_t layer, const int32_t* ids, int64_t n, ChoicePath path) {
  if (layer < first_layer_ || layer >= end_layer_) return;
  std::atomic<uint64_t>* row = counts_.get() + (layer - first_layer_) * n_experts_;
  uint64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < n_experts_) {
      row[ids[i]].fetch_add(1, std::memory_order_relaxed);
      ++counted;
    }
  }
  paths_[(layer - first_layer_) * 2 + static_cast<int>(path)].fetch_add(counted,
                                                                        std::memory_order_relaxed);
}

void ExpertHeat::Add(int64_t layer, int expert, uint64_t n, ChoicePath path) {
  if (layer < first_layer_ || layer >= end_layer_ || expert < 0 || expert >= n_experts_) return;
  counts_[(layer - first_layer_) * n_experts_ + expert].fetch_add(n, std::memory_order_relaxed);
  paths_[(layer - first_layer_) * 2 + static_cast<int>(path)].fetch_add(n,
                                                                        std::memory_order_relaxed);
}

void ExpertHeat::SetSource(std::function<void()> source) {
  std::lock_guard<std::mutex> lock(source_mu_);
  source_ = std::move(source);
}

void ExpertHeat::Refresh() const {
  std::lock_guard<std::mutex> lock(source_mu_);
  if (source_) source_();
}

void ExpertHeat::AddCpuRead(int64_t bytes) {
  if (bytes > 0) cpu_read_bytes_.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
}

void ExpertHeat::AddRebalance(int64_t swaps, int64_t bytes) {
  if (swaps > 0)
    rebalance_swaps_.fetch_add(static_cast<uint64_t>(swaps), std::memory_order_relaxed);
  if (bytes > 0)
    rebalance_bytes_.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
}

uint64_t ExpertHeat::count(int64_t layer, int expert) const {
  if (layer < first_layer_ || layer >= end_layer_ || expert < 0 || expert >= n_experts_) return 0;
  return counts_[(layer - first_layer_) * n_experts_ + expert].load(std::memory_order_relaxed);
}

std::vector<uint64_t> ExpertHeat::Snapshot() const {
  std::vector<uint64_t> out(static_cast<size_t>(end_layer_ - first_layer_) * n_experts_);
  for (size_t i = 0; i < out.size(); ++i) out[i] = counts_[i].load(std::memory_order_relaxed);
  return out;
}

uint64_t ExpertHeat::choices(int64_t layer, ChoicePath path) const {
  if (layer < first_layer_ || layer >= end_layer_) return 0;
  return paths_[(layer - first_layer_) * 2 + static_cast<int>(path)].load(
      std::memory_order_relaxed);
}

}  // namespace ss::gpu
