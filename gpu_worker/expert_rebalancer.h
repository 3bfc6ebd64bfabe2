// Moves a running resident-expert set (gpu_worker/cuda/resident_routed_experts.h) toward the
// experts the routing counts (expert_heat.h) show hot, without stopping serving: every `interval`
// a thread folds the counts since its last round (the first round: all so far) into decayed
// counts (old × decay + new, so the set follows a change of workload), plans at most the mover's
// max_swaps swaps within each layer (PlanLayerRebalance, past a relative margin) among the experts
// this rank may hold, and stages them: the mover copies the promoted experts' weights to the GPU in
// the background and swaps them in at a later step boundary. A round whose previous batch is still
// staged plans nothing.
//
// Threads: Start runs the rounds on a thread of the rebalancer's own; RunOnce (the round) may be
// called directly instead (tests), not both. The heat and the mover must outlive the rebalancer;
// destruction stops and joins the thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu_worker/expert_heat.h"
#include "gpu_worker/expert_placement.h"

namespace ss::gpu {

// What the rebalancer needs from the resident experts. Thread-safe: called from its thread while
// steps run.
class ResidentExpertMover {
 public:
  virtual ~ResidentExpertMover() = default;
  // The resident set now (ids ascending per layer; model layer ids from first_layer).
  virtual ResidentSet Current() const = 0;
  // The experts [first, second) this rank may hold in model layer `layer`.
  virtual std::pair<int32_t, int32_t> Range(int layer) const = 0;
  // The most swaps one Stage takes.
  virtual int max_swaps() const = 0;
  // Starts copying the promoted experts' weights and returns: true when staged (they replace the
  // evicted ones at a later step boundary), false when the previous batch is still staged
  // (nothing done). Swaps must be within one layer each, evict resident and promote not.
  virtual absl::StatusOr<bool> Stage(const std::vector<ExpertSwap>& swaps) = 0;
};

struct RebalanceOptions {
  absl::Duration interval = absl::ZeroDuration();  // zero: no rebalance
  double margin = 0.2;  // a promotion's count must exceed the evicted one's by this share
  double decay = 0.75;  // weight of the previous rounds' counts
};

class ExpertRebalancer {
 public:
  ExpertRebalancer(std::shared_ptr<const ExpertHeat> heat, ResidentExpertMover* mover,
                   const RebalanceOptions& options);
  ~ExpertRebalancer();
  ExpertRebalancer(const ExpertRebalancer&) = delete;
  ExpertRebalancer& operator=(const ExpertRebalancer&) = delete;

  // Runs RunOnce every options.interval until destruction (errors are logged, not fatal).
  void Start();
  // One round: the swaps it staged (empty: none worth it, or the previous batch still staged).
  absl::StatusOr<std::vector<ExpertSwap>> RunOnce();
  // The decayed counts as of the last round (the stage's layers).
  LayerCounts decayed() const;

 private:
  const std::shared_ptr<const ExpertHeat> heat_;
  ResidentExpertMover* const mover_;
  const RebalanceOptions options_;
  std::vector<double> decayed_;
  std::vector<uint64_t> last_;
  mutable std::mutex mu_;  // guards decayed_ for decayed(), stop_
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ss::gpu
