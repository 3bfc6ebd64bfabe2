#include "gpu_worker/expert_rebalancer.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace ss::gpu {

ExpertRebalancer::ExpertRebalancer(std::shared_ptr<const ExpertHeat> heat,
                                   ResidentExpertMover* mover, const RebalanceOptions& options)
    : heat_(std::move(heat)), mover_(mover), options_(options) {
  last_.assign(heat_->Snapshot().size(), 0);
  decayed_.assign(last_.size(), 0.0);
}

ExpertRebalancer::~ExpertRebalancer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ExpertRebalancer::Start() {
  if (options_.interval <= absl::ZeroDuration() || thread_.joinable()) return;
  thread_ = std::thread([this] {
    const auto period = absl::ToChronoMilliseconds(options_.interval);
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
      lock.unlock();
      if (absl::StatusOr<std::vector<ExpertSwap>> r = RunOnce(); !r.ok()) {
        spdlog::warn("resident experts: rebalance round failed: {}",
                     std::string(r.status().message()));
      }
      lock.lock();
    }
  });
}

LayerCounts ExpertRebalancer::decayed() const {
  LayerCounts c{
      heat_->first_layer(), heat_->end_layer() - heat_->first_layer(), heat_->n_experts(), {}};
  std::lock_guard<std::mutex> lock(mu_);
  c.at.reserve(decayed_.size());
  for (double v : decayed_) c.at.push_back(static_cast<uint64_t>(std::llround(v)));
  return c;
}

absl::StatusOr<std::vector<ExpertSwap>> ExpertRebalancer::RunOnce() {
  heat_->Refresh();
  const std::vector<uint64_t> now = heat_->Snapshot();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < now.size() && i < decayed_.size(); ++i) {
      decayed_[i] = decayed_[i] * options_.decay + static_cast<double>(now[i] - last_[i]);
    }
    last_ = now;
  }
  LayerCounts counts = decayed();
  // Only the experts this rank may hold can be promoted.
  for (int l = 0; l < counts.n_layers; ++l) {
    const auto [begin, end] = mover_->Range(counts.first_layer + l);
    for (int e = 0; e < counts.n_experts; ++e) {
      if (e < begin || e >= end) counts.at[static_cast<size_t>(l) * counts.n_experts + e] = 0;
    }
  }
  const ResidentSet current = mover_->Current();
  std::vector<ExpertSwap> swaps =
      PlanLayerRebalance(current, counts, options_.margin, mover_->max_swaps());
  if (swaps.empty()) return swaps;
  ASSIGN_OR_RETURN(const bool staged, mover_->Stage(swaps));
  if (!staged) return std::vector<ExpertSwap>{};
  ResidentSet after = current;
  ApplySwaps(swaps, &after);
  std::vector<std::string> moves;
  for (const ExpertSwap& s : swaps) {
    moves.push_back(absl::StrCat(s.promote_layer, ":", s.evict, "->", s.promote));
  }
  spdlog::info(
      "resident experts: rebalancing {} (layer:evicted->promoted {}); hit rate of the recent "
      "routing {:.1f}% -> {:.1f}%",
      swaps.size(), absl::StrJoin(moves, " "), 100.0 * HitRate(current, counts),
      100.0 * HitRate(after, counts));
  return swaps;
}

}  // namespace ss::gpu
